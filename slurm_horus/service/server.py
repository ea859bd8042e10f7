"""horusd's socket front: accept JSON-line requests, check who is asking, answer from memory.

Two Unix sockets:

* the **controller socket** (``socket`` setting, mode 0600, owned by the daemon's user): what
  job_submit.lua inside slurmctld uses; requests may be on behalf of any uid, and only here are
  ``claim`` and ``reload`` accepted;
* the **user socket** (``<socket>.user``, mode 0666): what ``horus-sbatch`` uses, reachable by every
  local user and treated as hostile. It answers ``place`` (recorded or dry-run), ``ping`` and
  ``confirm``, each for the caller only: ``uid`` and ``user`` are set from the peer's credentials
  (SO_PEERCRED), never taken from the message, and a request naming another uid is refused and logged.

Optionally TCP (``tcp = host:port``) for a remote controller; TCP peers have no credentials, so it
is meant for a firewalled management network only and treated as a controller peer.

The decision itself is the injected ``decide(message) -> reply`` callable (see app.py); this
module knows nothing of placement. A request is never answered with a traceback: any exception
becomes ``{"ok": false}``, which every client treats as "leave the job unchanged".

What one local user cannot do to it (issue 15): kill the loop (every request and every event is
handled under a catch-all; the line is limited in length and nesting, see protocol.py), starve it
(per-uid caps on connections and on requests per second; total caps on connections and buffered
bytes; replies are sent without blocking, so a client that never reads is dropped, not waited
for), or have it decide for nobody (a request whose client has already closed the connection is
not decided: its submitter gave up, and a recorded decision would hold GPUs for no job).
"""

import errno
import logging
import os
import pwd
import resource
import select
import selectors
import socket
import struct
import threading
import time
from collections import defaultdict

from . import protocol

log = logging.getLogger("horusd")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid

USER_OPS = frozenset({"place", "ping", "confirm"})  # what horus-sbatch needs
SLOW_OPS = frozenset({"reload", "ended"})  # answered by a worker thread, never by the loop


def peer_uid(sock):
    """The uid of the process on the other end of a Unix socket, or None (TCP)."""
    if sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(creds)[1]


_NAMES = {}  # uid -> (name, looked up at): NSS may be LDAP, so not once per request
_NAME_TTL_S = 600.0


def user_name(uid):
    """The login name of ``uid`` (``str(uid)`` when it has none)."""
    now = time.monotonic()
    known = _NAMES.get(uid)
    if known is None or now - known[1] > _NAME_TTL_S:
        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError, TypeError):
            name = str(uid)
        if len(_NAMES) > 4096:
            _NAMES.clear()
        known = _NAMES[uid] = (name, now)
    return known[0]


def authorize(message, uid, controller):
    """None when the peer may make this request, else the reason it may not.

    Sets ``message["peer"]`` (``controller`` or ``user``: what the rest of horusd may trust); on the
    user socket also ``uid`` and ``user``, from the kernel's word on who is connected.
    """
    if controller:
        message["peer"] = "controller"
        return None
    op = message.get("op")
    if not isinstance(op, str) or op not in USER_OPS:
        return "only place, ping and confirm are answered on the user socket"
    requested = message.get("uid")
    if requested is not None:
        try:
            requested = int(requested)
        except (TypeError, ValueError, OverflowError):
            return "bad uid"
        if requested != uid:
            return f"uid {uid} may not ask on behalf of uid {requested}"
    message["uid"] = uid
    message["user"] = user_name(uid)
    message["peer"] = "user"
    return None


def raise_fd_limit(wanted=65536):
    """Raise the soft limit on open files towards the hard one (systemd's default soft limit is 1,024)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


def _peer_gone(sock):
    """True when the client has closed its end (Unix sockets report POLLHUP only then; a client that
    merely shut down its writing side still waits for the reply)."""
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return True


def past_deadline(message, now=None):
    """Seconds by which a request is read after its client's ``give_up_at`` (wall-clock seconds,
    the time job_submit.lua or horus-sbatch stops waiting for the answer); None when it is not
    late or names no deadline. A client can only make its own request expire sooner."""
    give_up_at = message.get("give_up_at")
    if isinstance(give_up_at, bool) or not isinstance(give_up_at, (int, float)) or give_up_at != give_up_at:
        return None
    late = (time.time() if now is None else now) - give_up_at
    return late if late > 0 else None


class _Client:
    """One client connection: its socket, who it is, the bytes of a line not complete yet."""

    __slots__ = ("sock", "controller", "uid", "buffer", "deadline", "counted", "closed")

    def __init__(self, sock, controller, uid, deadline):
        self.sock, self.controller, self.uid, self.deadline = sock, controller, uid, deadline
        self.buffer = b""
        self.counted = False  # in the per-uid connection count
        self.closed = False


class Frontend:
    """Owns the listening sockets and turns lines into calls of ``decide``.

    One thread serves every connection with a selector, and answers a request inline: a decision
    takes a fraction of a millisecond, and handing each connection to a new thread costs more than
    that (measured: 0.7 ms vs 0.3 ms per request when requests arrive a few ms apart, as sbatch
    submissions do). Only ``reload``, which rebuilds models, goes to one worker thread, so requests
    keep being answered meanwhile; reloads asked while one is waiting are answered by that one.
    A client may send several requests on one connection, one line each (job_submit.lua does),
    also in one write: every complete line is answered, in order. A client that connects and sends
    nothing is dropped after ``CLIENT_TIMEOUT_S``; a kept controller connection after
    ``IDLE_TIMEOUT_S`` without a request, a user connection after ``CLIENT_TIMEOUT_S``.
    """

    CLIENT_TIMEOUT_S = 5.0  # to send a (complete) request once connected
    IDLE_TIMEOUT_S = 300.0  # a kept-open controller connection with no request for this long is closed
    MAX_CONNECTIONS = 1024  # all client connections (controller ones are always accepted below it)
    MAX_USER_CONNECTIONS = 256  # user-socket connections, all users together
    MAX_CONNECTIONS_PER_UID = 16  # user-socket connections of one uid
    MAX_BUFFERED_BYTES = 16 << 20  # incomplete lines held, all connections together
    USER_RATE = 20.0  # requests per second one uid may make on the user socket ...
    USER_BURST = 40  # ... after a burst of this many
    MAX_ACCEPTS_PER_ROUND = 64  # then the other events get their turn
    REFUSAL_LOG_EVERY_S = 10.0  # one warning per uid and this period; the rest are counted

    def __init__(self, decide, socket_path, tcp=None, after_reply=None):
        self.decide = decide
        self.after_reply = after_reply  # (message, reply) once the reply is sent: logging, history
        self.socket_path = socket_path
        self.user_socket_path = socket_path + ".user"
        self.tcp = tcp
        self.listeners = []  # (socket, controller)
        self.selector = None
        self.thread = None
        self.on_fatal = None  # called if the loop itself dies (horusd then exits; its supervisor restarts it)
        self.stopping = threading.Event()
        self.accepted = 0  # connections accepted (job_submit.lua keeps one open: few)
        self.refused = defaultdict(int)  # reason -> count (connections and requests turned away)
        self.expired = 0  # requests not decided because their client had gone
        self._clients = {}  # socket -> _Client (served by the loop)
        self._per_uid = defaultdict(int)
        self._user_connections = 0
        self._buffered = 0
        self._buckets = {}  # uid -> [tokens, last refill]
        self._warned = {}  # uid -> (last warning time, suppressed count)
        self._spare_fd = None
        self._slow_lock = threading.Lock()
        self._slow_waiting = []  # (client, message) for the next slow run
        self._slow_ready = threading.Event()
        self._slow_thread = None
        self._last_sweep = 0.0

    # ---- one request ----------------------------------------------------------------------------
    def _reply_bytes(self, reply, kv):
        return (protocol.encode_kv(reply) + "\n").encode() if kv else protocol.encode(reply)

    def _send(self, client, data):
        """Send without blocking the loop; False (and the client should be dropped) when the client
        does not take its reply. A controller peer gets a short wait for a reply larger than the
        socket buffer."""
        try:
            sent = client.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return False
        if sent == len(data):
            return True
        if not client.controller:
            return False
        try:
            client.sock.settimeout(0.1)
            client.sock.sendall(data[sent:])
            client.sock.setblocking(False)
            return True
        except OSError:
            return False

    def _refuse(self, client, reason, kv=False):
        self.refused[reason.split(":")[0]] += 1
        self._warn(client.uid, reason)
        return self._send(client, self._reply_bytes({"ok": False, "error": reason}, kv))

    def _warn(self, uid, reason):
        """A refusal's log line, at most one per uid and period (a hostile user must not fill the log)."""
        now = time.monotonic()
        last, suppressed = self._warned.get(uid, (None, 0))
        if last is not None and now - last < self.REFUSAL_LOG_EVERY_S:
            self._warned[uid] = (last, suppressed + 1)
            return
        more = f" ({suppressed} more refused since the last warning)" if suppressed else ""
        log.warning("horus: refused request from uid %s: %s%s", uid, reason, more)
        if len(self._warned) > 4096:
            self._warned.clear()
        self._warned[uid] = (now, 0)

    def _take_token(self, uid):
        """Rate limit of the user socket: a token bucket per uid."""
        now = time.monotonic()
        bucket = self._buckets.get(uid)
        if bucket is None:
            if len(self._buckets) > 4096:
                self._buckets.clear()
            bucket = self._buckets[uid] = [float(self.USER_BURST), now]
        bucket[0] = min(float(self.USER_BURST), bucket[0] + (now - bucket[1]) * self.USER_RATE)
        bucket[1] = now
        if bucket[0] < 1.0:
            return False
        bucket[0] -= 1.0
        return True

    def _handle_line(self, client, line):
        """Answer one request line. False when the client is gone (dropped or handed to the worker)."""
        if not line.strip():
            return True
        if not client.controller and not self._take_token(client.uid):
            self._refuse(client, "rate limit: too many requests")
            return False
        try:
            message = protocol.decode(line)
        except ValueError as exc:
            return self._refuse(client, f"malformed request: {exc}")
        kv = message.get("reply") == "kv"
        refusal = authorize(message, client.uid, client.controller)
        if refusal:
            return self._refuse(client, refusal, kv)
        op = message.get("op")
        if isinstance(op, str) and op in SLOW_OPS:
            self._hand_to_worker(client, message)
            return False
        if op not in ("claim", "left"):
            # the submitter gave up (job_submit.lua closes after its deadline, and says when it stops
            # waiting in give_up_at): deciding now would hold GPUs for a job that went to Slurm
            # unchanged. A claim is a fact: it still counts.
            if _peer_gone(client.sock):
                self.expired += 1
                log.info("horus: request op=%s of uid %s expired: its client had gone", op, client.uid)
                return False
            late = past_deadline(message)
            if late is not None:
                self.expired += 1
                log.info("horus: request op=%s of uid %s expired: read %.0f ms past its deadline",
                         op, client.uid, late * 1000)
                return self._send(client, self._reply_bytes({"ok": False, "error": "expired: past its deadline"}, kv))
        try:
            reply = self.decide(message)
        except Exception as exc:  # the service must answer, whatever went wrong
            log.exception("horus: error while deciding")
            reply = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
            message = None
        alive = True
        if reply is not None:  # None: a notification (claim) that the client does not wait for
            try:
                alive = self._send(client, self._reply_bytes(reply, kv))
            except Exception:
                log.exception("horus: could not encode a reply")
                alive = self._send(client, protocol.encode({"ok": False, "error": "internal error"}))
        if message is not None and self.after_reply is not None:
            try:
                self.after_reply(message, reply)
            except Exception:
                log.exception("horus: error after a reply")
        return alive

    # ---- the slow worker (reload) ---------------------------------------------------------------
    def _hand_to_worker(self, client, message):
        self._forget(client)
        with self._slow_lock:
            self._slow_waiting.append((client, message))
        self._slow_ready.set()

    def _slow_loop(self):
        while not self.stopping.is_set():
            if not self._slow_ready.wait(0.5):
                continue
            with self._slow_lock:
                waiting, self._slow_waiting = self._slow_waiting, []
                self._slow_ready.clear()
            if not waiting:
                continue
            groups = {}  # one run answers every request of an op that waited for it
            for client, message in waiting:
                groups.setdefault(message.get("op"), []).append((client, message))
            for op, group in groups.items():
                message = group[0][1]
                if op == "ended":  # every job named by the lines that waited
                    message = dict(message, job_ids=[asked.get("job_id") for _, asked in group])
                self._answer_group(message, group)

    def _answer_group(self, message, group):
        try:
            reply = self.decide(message)
        except Exception as exc:
            log.exception("horus: error during %s", message.get("op"))
            reply = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
        for client, asked in group:
            try:
                client.sock.settimeout(1.0)
                client.sock.sendall(self._reply_bytes(reply, asked.get("reply") == "kv"))
            except Exception:
                pass
            finally:
                client.sock.close()

    # ---- listening ------------------------------------------------------------------------------
    def _listen_unix(self, path, mode, controller):
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket exists with 0600 before chmod widens the user one
        try:
            listener.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        listener.listen(128)
        self.listeners.append((listener, controller))

    def start(self):
        self._listen_unix(self.socket_path, 0o600, controller=True)
        self._listen_unix(self.user_socket_path, 0o666, controller=False)
        if self.tcp:
            host, _, port = self.tcp.rpartition(":")
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host or "127.0.0.1", int(port)))
            listener.listen(128)
            self.listeners.append((listener, True))
        self.selector = selectors.DefaultSelector()
        for listener, controller in self.listeners:
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, ("listen", controller))
        try:
            self._spare_fd = os.open(os.devnull, os.O_RDONLY)
        except OSError:
            self._spare_fd = None
        self._slow_thread = threading.Thread(target=self._slow_loop, name="horusd-reload", daemon=True)
        self._slow_thread.start()
        self.thread = threading.Thread(target=self._run, name="horusd-frontend", daemon=True)
        self.thread.start()

    def alive(self):
        return self.thread is not None and self.thread.is_alive() and \
            self._slow_thread is not None and self._slow_thread.is_alive()

    def _run(self):
        try:
            self._loop()
        except BaseException:
            log.critical("horus: the socket front died", exc_info=True)
            if self.on_fatal is not None:
                self.on_fatal("the socket front died")
            raise

    def _loop(self):
        while not self.stopping.is_set():
            try:
                events = self.selector.select(timeout=0.5)
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            # listeners first, the controller's first of all: job_submit.lua must never wait behind users
            events.sort(key=lambda event: 0 if isinstance(event[0].data, tuple) and event[0].data[1] else
                        1 if isinstance(event[0].data, tuple) else 2)
            for key, _mask in events:
                try:
                    kind = key.data
                    if isinstance(kind, tuple):  # a listener: accept the waiting clients
                        self._accept(key.fileobj, kind[1])
                    elif not kind.closed:
                        self._read(kind)
                except Exception:
                    log.exception("horus: error in the socket front (the connection is dropped)")
                    if not isinstance(key.data, tuple):
                        self._drop(key.data)
            now = time.monotonic()
            if now - self._last_sweep >= 0.1:
                self._last_sweep = now
                for client in [c for c in self._clients.values() if c.deadline < now]:
                    self._drop(client)
        for client in list(self._clients.values()):  # stopping: kept connections too, so clients notice
            self._drop(client)

    def _accept_one(self, listener):
        try:
            sock, _address = listener.accept()
            return sock
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE) and self._spare_fd is not None:
                # out of descriptors: take the client with the spare one and close it at once, so it
                # learns at once instead of waiting in the backlog, and the listener stops firing
                os.close(self._spare_fd)
                self._spare_fd = None
                try:
                    sock, _address = listener.accept()
                    sock.close()
                except OSError:
                    pass
                try:
                    self._spare_fd = os.open(os.devnull, os.O_RDONLY)
                except OSError:
                    pass
                self.refused["out of file descriptors"] += 1
                log.warning("horus: out of file descriptors: a connection was closed unanswered")
            return None

    def _accept(self, listener, controller):
        for _ in range(self.MAX_ACCEPTS_PER_ROUND):
            sock = self._accept_one(listener)
            if sock is None:
                return
            self.accepted += 1
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            client = _Client(sock, controller or uid is None, uid, time.monotonic() + self.CLIENT_TIMEOUT_S)
            if len(self._clients) >= self.MAX_CONNECTIONS or not client.controller and (
                    self._user_connections >= self.MAX_USER_CONNECTIONS
                    or self._per_uid[uid] >= self.MAX_CONNECTIONS_PER_UID):
                self.refused["too many connections"] += 1
                self._warn(uid, "too many connections")
                sock.close()
                continue
            if not client.controller:
                client.counted = True
                self._per_uid[uid] += 1
                self._user_connections += 1
            sock.setblocking(False)
            self._clients[sock] = client
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client):
        try:
            chunk = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(client)
            return
        if not client.controller and self._buffered + len(chunk) > self.MAX_BUFFERED_BYTES:
            self.refused["buffer full"] += 1
            self._drop(client)
            return
        self._buffered -= len(client.buffer)
        buffer = client.buffer + chunk
        client.buffer = b""
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if not self._handle_line(client, line):
                if not client.closed and client.sock in self._clients:
                    self._drop(client)
                return
        rest = buffer[start:]
        if len(rest) > protocol.MAX_LINE_BYTES:
            self.refused["line too long"] += 1
            self._drop(client)
            return
        client.buffer = rest
        self._buffered += len(rest)
        idle = self.IDLE_TIMEOUT_S if client.controller and not rest else self.CLIENT_TIMEOUT_S
        client.deadline = time.monotonic() + idle

    def _forget(self, client):
        """Stop serving ``client`` from the loop (without closing it)."""
        if self._clients.pop(client.sock, None) is None:
            return
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        self._buffered -= len(client.buffer)
        client.buffer = b""
        if client.counted:
            client.counted = False
            self._per_uid[client.uid] -= 1
            if self._per_uid[client.uid] <= 0:
                del self._per_uid[client.uid]
            self._user_connections -= 1

    def _drop(self, client):
        self._forget(client)
        client.closed = True
        try:
            client.sock.close()
        except OSError:
            pass

    def stop(self):
        self.stopping.set()
        self._slow_ready.set()
        if self.thread is not None:
            self.thread.join(5)
        if self._slow_thread is not None:
            self._slow_thread.join(5)
        for listener, _controller in self.listeners:
            listener.close()
        if self.selector is not None:
            self.selector.close()
        if self._spare_fd is not None:
            os.close(self._spare_fd)
            self._spare_fd = None
        for path in (self.socket_path, self.user_socket_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
