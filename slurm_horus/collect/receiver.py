"""``horus receive``: the head node's end of network shipping, the one writer of GPU samples.

Collectors POST batches (see ``shipping.py`` for the wire contract). For each request the receiver

1. reads at most ``MAX_BODY_BYTES`` (a slow or silent client is dropped after ``CLIENT_TIMEOUT_S``);
2. decodes the munge credential with the head node's munged: refused when forged, expired, replayed
   or made with another key;
3. checks the sender: its uid must be one of ``ship_users``, and the credential's origin address
   must be one of the claimed node's addresses (``ship_nodes`` file, else the node's NodeAddr and
   NodeHostname in Slurm), so a node cannot write another node's samples;
4. checks the body: its SHA-256 and size are the ones in the credential; every batch and every row
   names the claimed node; every field has its type and a sane range (one line of error otherwise,
   nothing stored);
5. stores the rows with INSERT OR IGNORE on their natural keys (a batch sent twice is stored once)
   in the writer thread, which commits many requests' rows in one transaction, and replies 200 only
   after the commit.

Everything from the network is hostile: sizes are bounded, errors are one line without a
traceback, and a fault in one request never stops the others.
"""

import hashlib
import json
import logging
import math
import os
import pwd
import queue
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler

from ..errors import InputError
from . import munge
from .sampler import store_batches
from .shipping import CREDENTIAL_HEADER, MAX_BODY_BYTES, PATH, PING_PATH, parse_payload

log = logging.getLogger("horus.receive")

CLIENT_TIMEOUT_S = 10.0
WORKERS = 4
MAX_QUEUED_CONNECTIONS = 64
MAX_GPUS_PER_BATCH = 64
MAX_JOBS_PER_BATCH = 1024
MAX_TEXT = 128
MAX_FUTURE_S = 300.0  # a sample may be stamped at most this far ahead of the receiver's clock
NODE_REFRESH_S = 60.0
MAX_COMMIT_ROWS = 200_000  # the writer commits at most about this many rows at once


class Refused(Exception):
    """A request the receiver will not store: HTTP ``status`` and a one-line reason."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# --- who may ship ---------------------------------------------------------------------------------

def parse_users(text):
    """``root,horus,1234`` -> {uid}; a name this host does not know is an error."""
    uids = set()
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if item.isdigit():
            uids.add(int(item))
            continue
        try:
            uids.add(pwd.getpwnam(item).pw_uid)
        except KeyError:
            raise InputError(f"ship_users: no user {item!r} on this host") from None
    return uids


def _resolve(name):
    """IPv4 addresses of a host name or address (empty when it does not resolve)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)}
    except (OSError, UnicodeError):
        return set()


def read_node_file(path):
    """``node address [address...]`` lines (``#`` comments) -> {node: {IPv4 address}}."""
    nodes = {}
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise InputError(f"ship_nodes {path}: {exc.strerror}") from None
    for lineno, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 2:
            raise InputError(f"{path}:{lineno}: expected 'node address...', got {line.strip()!r}")
        addresses = set()
        for word in words[1:]:
            addresses |= _resolve(word)
        nodes[words[0]] = addresses
    return nodes


def slurm_node_addresses(slurm_conf=None):
    """{node: addresses of its NodeAddr and NodeHostname} from ``sinfo --json``."""
    from ..slurm.parse import parse_sinfo
    from ..slurm.runner import run_slurm

    nodes = {}
    for node in parse_sinfo(run_slurm(["sinfo", "--json"], slurm_conf=slurm_conf, timeout=30).stdout):
        addresses = set()
        for name in {node.address, node.hostname} - {""}:
            addresses |= _resolve(name)
        nodes[node.name] = addresses
    return nodes


class NodeDirectory:
    """Which host may speak for which node: a ``ship_nodes`` file, else Slurm's node addresses
    (re-read at most every NODE_REFRESH_S, so nodes added to slurm.conf are picked up)."""

    def __init__(self, path=None, slurm_conf=None, loader=None):
        self.path = path or None
        self.slurm_conf = slurm_conf
        self.loader = loader or (lambda: read_node_file(self.path) if self.path else
                                 slurm_node_addresses(self.slurm_conf))
        self.nodes = {}
        self.loaded_at = None
        self.lock = threading.Lock()

    def _refresh(self, force=False):
        now = time.monotonic()
        if not force and self.loaded_at is not None and now - self.loaded_at < NODE_REFRESH_S:
            return
        self.loaded_at = now
        try:
            self.nodes = self.loader()
        except Exception as exc:  # Slurm down, file gone: keep what we knew
            log.warning("horus: cannot read node addresses (%s); keeping %d known nodes",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, len(self.nodes))

    def may_speak_for(self, node, origin):
        with self.lock:
            self._refresh()  # at most every NODE_REFRESH_S, whatever the requests claim
            addresses = self.nodes.get(node)
        if addresses is None:
            return False, f"unknown node {node!r}"
        if origin not in addresses:
            return False, f"a credential from {origin or 'an unknown host'} may not ship samples of node {node}"
        return True, None


# --- the body -------------------------------------------------------------------------------------

def _text(value, what):
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{what} must be a string of at most {MAX_TEXT} characters")
    return value


def _number(value, what, low, high):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ValueError(f"{what} must be a number in [{low:g}, {high:g}]")
    return value


def _integer(value, what, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer in [{low}, {high}]")
    return value


def _flag(value):
    if value not in (0, 1) or isinstance(value, float):
        raise ValueError("shared must be 0 or 1")
    return int(value)


def _job_ids(value):
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 4096 or \
            not all(part.isdigit() and len(part) <= 16 for part in value.split(",")):
        raise ValueError("job_ids must be job ids separated by commas")
    return value


class BodyChecker:
    """Turns a request body into clean batches of one node, or raises ValueError (one line)."""

    def __init__(self, clock=time.time):
        self.clock = clock

    def _ts(self, value, what):
        return _number(value, what, 0.0, self.clock() + MAX_FUTURE_S)

    def _node(self, value, node, what):
        if value != node:
            raise ValueError(f"{what} names node {str(value)[:64]!r}, the credential node {node!r}")
        return value

    def gpu_row(self, row, node):
        if not isinstance(row, dict):
            raise ValueError("a gpus entry is not an object")
        return {
            "node": self._node(row.get("node"), node, "a gpus entry"),
            "gpu_index": _integer(row.get("gpu_index"), "gpu_index", 0, 1023),
            "ts": self._ts(row.get("ts"), "ts"),
            "uuid": _text(row.get("uuid"), "uuid"),
            "gpu_name": _text(row.get("gpu_name"), "gpu_name"),
            "gpu_util": _number(row.get("gpu_util"), "gpu_util", 0, 100),
            "mem_util": _number(row.get("mem_util"), "mem_util", 0, 100),
            "mem_used_mb": _number(row.get("mem_used_mb"), "mem_used_mb", 0, 1e8),
            "mem_total_mb": _number(row.get("mem_total_mb"), "mem_total_mb", 0, 1e8),
            "job_ids": _job_ids(row.get("job_ids")),
        }

    def job_row(self, row, node):
        if not isinstance(row, dict):
            raise ValueError("a jobs entry is not an object")
        return {
            "job_id": _integer(row.get("job_id"), "job_id", 1, 2 ** 53),
            "node": self._node(row.get("node"), node, "a jobs entry"),
            "gpu_index": _integer(row.get("gpu_index"), "gpu_index", 0, 1023),
            "ts": self._ts(row.get("ts"), "ts"),
            "sm_util": _number(row.get("sm_util"), "sm_util", 0, 100),
            "mem_util": _number(row.get("mem_util"), "mem_util", 0, 100),
            "mem_used_mb": _number(row.get("mem_used_mb"), "mem_used_mb", 0, 1e8),
            "n_procs": None if row.get("n_procs") is None else _integer(row.get("n_procs"), "n_procs", 0, 1 << 20),
            "shared": _flag(row.get("shared", 0)),
        }

    def batches(self, body, node):
        batches = []
        for lineno, line in enumerate(body.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                try:
                    item = json.loads(line)
                except (ValueError, RecursionError):
                    raise ValueError("not JSON") from None
                if not isinstance(item, dict):
                    raise ValueError("not a batch object")
                self._node(item.get("node"), node, "the batch")
                gpus, jobs = item.get("gpus", []), item.get("jobs", [])
                if not isinstance(gpus, list) or len(gpus) > MAX_GPUS_PER_BATCH:
                    raise ValueError(f"gpus must be a list of at most {MAX_GPUS_PER_BATCH}")
                if not isinstance(jobs, list) or len(jobs) > MAX_JOBS_PER_BATCH:
                    raise ValueError(f"jobs must be a list of at most {MAX_JOBS_PER_BATCH}")
                batches.append({"node": node, "ts": self._ts(item.get("ts"), "ts"),
                                "gpus": [self.gpu_row(g, node) for g in gpus],
                                "jobs": [self.job_row(j, node) for j in jobs]})
            except ValueError as exc:
                raise ValueError(f"batch line {lineno}: {exc}") from None
        if not batches:
            raise ValueError("no batch in the body")
        return batches


# --- the writer -----------------------------------------------------------------------------------

class _Work:
    __slots__ = ("batches", "done", "result", "error")

    def __init__(self, batches):
        self.batches, self.done, self.result, self.error = batches, threading.Event(), None, None


class Writer:
    """The one thread that writes the database: group commit of whatever requests are waiting."""

    PRUNE_EVERY_S = 3600.0

    def __init__(self, db_path, raw_days=0.0):
        self.db_path = db_path
        self.raw_days = raw_days
        self.queue = queue.Queue(maxsize=1024)
        self.thread = None
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.failure = None
        self.commits = 0
        self.rows = 0

    def start(self):
        self.thread = threading.Thread(target=self._run, name="horus-receive-writer", daemon=True)
        self.thread.start()
        self.ready.wait(60)
        if self.failure:
            raise self.failure

    def _run(self):
        from ..store.db import open_db

        try:
            db = open_db(self.db_path)
        except Exception as exc:
            self.failure = InputError(f"cannot open the history database {self.db_path}: {exc}")
            self.ready.set()
            return
        self.ready.set()
        next_prune = time.monotonic()
        while not self.stopping.is_set():
            if self.raw_days and time.monotonic() >= next_prune:
                next_prune = time.monotonic() + self.PRUNE_EVERY_S
                self._prune(db)
            try:
                first = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            group, rows = [first], _rows(first)
            while rows < MAX_COMMIT_ROWS:
                try:
                    work = self.queue.get_nowait()
                except queue.Empty:
                    break
                group.append(work)
                rows += _rows(work)
            try:
                before = db.conn.total_changes
                store_batches(db, [b for work in group for b in work.batches])
                new_rows = db.conn.total_changes - before
                self.commits += 1
                self.rows += new_rows
                for work in group:
                    work.result = {"batches": len(work.batches), "rows": _rows(work)}
                if len(group) == 1:
                    group[0].result["new_rows"] = new_rows
            except Exception as exc:  # disk full, locked past the busy timeout: the senders retry
                log.warning("horus: storing %d batches failed: %s", sum(len(w.batches) for w in group), exc)
                for work in group:
                    work.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            for work in group:
                work.done.set()
        db.conn.close()

    def _prune(self, db):
        from ..store.samples import prune_raw

        try:
            deleted = prune_raw(db, self.raw_days)
        except Exception as exc:
            log.warning("horus: pruning raw samples failed: %s", exc)
            return
        if deleted:
            log.info("horus: pruned %d raw sample rows older than %g days", deleted, self.raw_days)

    def store(self, batches, timeout_s=60.0):
        work = _Work(batches)
        try:
            self.queue.put(work, timeout=timeout_s)
        except queue.Full:
            raise Refused(503, "receiver busy, try again later") from None
        if not work.done.wait(timeout_s):
            raise Refused(503, "the database did not commit in time, try again later")
        if work.error:
            raise Refused(503, f"storing failed: {work.error}")
        return work.result

    def stop(self):
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(10)


def _rows(work):
    return sum(len(b["gpus"]) + len(b["jobs"]) for b in work.batches)


# --- the HTTP side --------------------------------------------------------------------------------

class Receiver:
    """Checks and stores shipped batches; :meth:`handle` is the whole request path (no HTTP)."""

    def __init__(self, db_path, nodes, allowed_uids, munge_socket=None, clock=time.time, raw_days=0.0):
        self.writer = Writer(db_path, raw_days)
        self.nodes = nodes
        self.allowed_uids = set(allowed_uids)
        self.munge_socket = munge_socket or None
        self.checker = BodyChecker(clock)
        self.accepted = 0
        self.refused = 0

    def handle(self, credential, body):
        """Reply dict for one request; raises :class:`Refused`."""
        if not credential:
            raise Refused(401, f"no {CREDENTIAL_HEADER} header (a munge credential)")
        try:
            cred = munge.decode(credential, self.munge_socket)
        except munge.MungeError as exc:
            if exc.code == munge.EMUNGE_SOCKET:
                raise Refused(503, f"the receiver's munged does not answer: {exc}") from None
            raise Refused(401, str(exc)) from None
        try:
            node, size, digest = parse_payload(cred.payload)
        except ValueError as exc:
            raise Refused(401, str(exc)) from None
        if cred.uid not in self.allowed_uids:
            raise Refused(403, f"uid {cred.uid} may not ship samples (ship_users)")
        allowed, why = self.nodes.may_speak_for(node, cred.origin)
        if not allowed:
            raise Refused(403, why)
        if len(body) != size or hashlib.sha256(body).hexdigest() != digest:
            raise Refused(400, "the body is not the one the credential was made for")
        try:
            batches = self.checker.batches(body, node)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        reply = self.writer.store(batches)
        return {"ok": True, "node": node, **reply}

    def start(self):
        self.writer.start()

    def stop(self):
        self.writer.stop()


class _Handler(BaseHTTPRequestHandler):
    server_version = "horus-receive"
    sys_version = ""
    timeout = CLIENT_TIMEOUT_S
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):  # no access log on stderr; refusals are logged below
        pass

    def _reply(self, status, reply):
        data = (json.dumps(reply, separators=(",", ":")) + "\n").encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass

    def send_error(self, code, message=None, explain=None):  # http.server's own errors, as JSON
        self.close_connection = True
        self._reply(code, {"ok": False, "error": (message or "bad request").splitlines()[0][:200]})

    def do_GET(self):
        if self.path.split("?")[0].endswith(PING_PATH):
            self._reply(200, {"ok": True, "pid": os.getpid()})
        else:
            self._reply(404, {"ok": False, "error": "not found"})

    def do_POST(self):
        receiver = self.server.receiver
        try:
            if not self.path.split("?")[0].endswith(PATH):
                raise Refused(404, "not found")
            length = self.headers.get("Content-Length")
            if length is None or not length.strip().isdigit():
                raise Refused(411, "Content-Length required")
            length = int(length)
            if length > MAX_BODY_BYTES:
                raise Refused(413, f"body over {MAX_BODY_BYTES} bytes")
            body = self.rfile.read(length)
            if len(body) != length:
                raise Refused(400, "body shorter than Content-Length")
            reply = receiver.handle(self.headers.get(CREDENTIAL_HEADER), body)
            receiver.accepted += 1
            self._reply(200, reply)
        except Refused as exc:
            receiver.refused += 1
            message = str(exc)[:300]
            if exc.status != 404:
                log.warning("horus: refused a shipment from %s: %s", self.client_address[0], message)
            self._reply(exc.status, {"ok": False, "error": message})
        except (OSError, socket.timeout):
            self.close_connection = True
        except Exception as exc:  # never a traceback to the client, never a dead receiver
            receiver.refused += 1
            log.exception("horus: error while receiving")
            self._reply(500, {"ok": False, "error": f"internal error: {type(exc).__name__}"})


class _Server(socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, receiver):
        self.receiver = receiver
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="horus-receive")
        self.slots = threading.BoundedSemaphore(MAX_QUEUED_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):  # flooded: drop rather than queue without bound
            self.shutdown_request(request)
            return
        self.pool.submit(self._work, request, client_address)

    def _work(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:
            pass
        finally:
            self.shutdown_request(request)
            self.slots.release()

    def server_close(self):
        super().server_close()
        self.pool.shutdown(wait=False)


def parse_listen(text):
    host, sep, port = (text or "").rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"listen address {text!r}: expected HOST:PORT (port 0: any free one)")
    return host or "0.0.0.0", int(port)


class ReceiverServer:
    """The receiver behind an HTTP listener; ``start()`` returns once it accepts connections."""

    def __init__(self, receiver, listen):
        self.receiver = receiver
        self.address = parse_listen(listen)
        self.server = None
        self.thread = None

    def start(self):
        self.receiver.start()
        try:
            self.server = _Server(self.address, self.receiver)
        except OSError as exc:
            self.receiver.stop()
            raise InputError(f"cannot listen on {self.address[0]}:{self.address[1]}: {exc.strerror}") from None
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="horus-receive-http", daemon=True)
        self.thread.start()
        return self

    @property
    def port(self):
        return self.server.server_address[1]

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.receiver.stop()
