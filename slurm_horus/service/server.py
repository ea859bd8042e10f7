"""horusd's socket front: accept JSON-line requests, check who is asking, answer from memory.

Two Unix sockets:

* the **controller socket** (``socket`` setting, mode 0600, owned by the daemon's user): what
  job_submit.lua inside slurmctld uses; requests may be on behalf of any uid;
* the **user socket** (``<socket>.user``, mode 0666): what ``horus-sbatch`` uses; a peer that is
  neither root nor the daemon's own user may ask only for its own uid (checked with SO_PEERCRED),
  anything else is refused and logged.

Optionally TCP (``tcp = host:port``) for a remote controller; TCP peers have no credentials, so it
is meant for a firewalled management network only and treated as a controller peer.

The decision itself is the injected ``decide(message) -> reply`` callable (see daemon.py); this
module knows nothing of placement. A request is never answered with a traceback: any exception
becomes ``{"ok": false}``, which every client treats as "leave the job unchanged".
"""

import logging
import os
import selectors
import socket
import struct
import threading
import time

from . import protocol
from .lua_twin import encode_kv_reply

log = logging.getLogger("horusd")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(sock):
    """The uid of the process on the other end of a Unix socket, or None (TCP)."""
    if sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(creds)[1]


def authorize(message, uid, trusted_uids, controller):
    """None when the peer may make this request, else the reason it may not."""
    if controller or uid in trusted_uids:
        return None
    if message.get("op") in ("reload", "left"):  # with or without a uid
        return f"{message.get('op')} is for the controller socket"
    requested = message.get("uid")
    if requested is None:
        message["uid"] = uid
        return None
    try:
        requested = int(requested)
    except (TypeError, ValueError):
        return "bad uid"
    if requested != uid:
        return f"uid {uid} may not ask on behalf of uid {requested}"
    return None


class _Pending:
    """A client connection whose request line has not fully arrived yet."""

    __slots__ = ("sock", "controller", "buffer", "deadline")

    def __init__(self, sock, controller, deadline):
        self.sock, self.controller, self.buffer, self.deadline = sock, controller, b"", deadline


class Frontend:
    """Owns the listening sockets and turns lines into calls of ``decide``.

    One thread serves every connection with a selector, and answers a request inline: a decision
    takes a fraction of a millisecond, and handing each connection to a new thread costs more than
    that (measured: 0.7 ms vs 0.3 ms per request when requests arrive a few ms apart, as sbatch
    submissions do). Only ``reload``, which refits models, runs in a thread of its own, so requests
    keep being answered meanwhile. A client that connects and sends nothing is dropped after
    ``CLIENT_TIMEOUT_S``. A client may send several requests on one connection, one line each
    (job_submit.lua does); an idle connection is closed after ``IDLE_TIMEOUT_S``.
    """

    CLIENT_TIMEOUT_S = 5.0  # to send a request once connected
    IDLE_TIMEOUT_S = 300.0  # a kept-open connection with no request for this long is closed
    MAX_CLIENTS = 256

    def __init__(self, decide, socket_path, tcp=None, trusted_uids=None, after_reply=None):
        self.decide = decide
        self.after_reply = after_reply  # (message, reply) once the reply is sent: logging, history
        self.socket_path = socket_path
        self.user_socket_path = socket_path + ".user"
        self.tcp = tcp
        self.trusted_uids = set(trusted_uids or ()) | {0, os.getuid()}
        self.listeners = []  # (socket, controller)
        self.selector = None
        self.thread = None
        self.stopping = threading.Event()
        self.accepted = 0  # connections accepted (job_submit.lua keeps one open: few)

    def answer(self, line, sock, controller):
        """(reply dict, wants key=value, message or None) for one request line; never raises."""
        try:
            message = protocol.decode(line)
        except ValueError:
            log.warning("horus: refused malformed request")
            return {"ok": False, "error": "malformed request"}, False, None
        kv = message.get("reply") == "kv"
        try:
            uid = peer_uid(sock)
            refusal = authorize(message, uid, self.trusted_uids, controller or uid is None)
            if refusal:
                log.warning("horus: refused request from uid %s: %s", uid, refusal)
                return {"ok": False, "error": refusal}, kv, None
            return self.decide(message), kv, message
        except Exception as exc:  # the service must answer, whatever went wrong
            log.exception("horus: error while deciding")
            return {"ok": False, "error": f"internal error: {type(exc).__name__}"}, kv, None

    def _respond(self, pending, line, keep=None):
        """Answer one line; then close, or (``keep``: the loop's table) wait for the client's next line."""
        reply, kv, message = self.answer(line, pending.sock, pending.controller)
        if reply is not None:  # None: a notification (claim) that the client does not wait for
            data = (encode_kv_reply(reply) + "\n").encode() if kv else protocol.encode(reply)
            try:
                pending.sock.setblocking(True)
                pending.sock.settimeout(1.0)
                pending.sock.sendall(data)
            except OSError:
                keep = None
        if message is not None and self.after_reply is not None:
            try:
                self.after_reply(message, reply)
            except Exception:
                log.exception("horus: error after a reply")
        if keep is None or len(keep) >= self.MAX_CLIENTS:
            pending.sock.close()
            return
        # job_submit.lua keeps its connection open between submissions (slurmctld keeps the Lua
        # state): no connect/accept per job. The next line starts a fresh request.
        pending.sock.setblocking(False)
        pending.buffer = pending.buffer.split(b"\n", 1)[1] if b"\n" in pending.buffer else b""
        pending.deadline = time.monotonic() + self.IDLE_TIMEOUT_S
        keep[pending.sock] = pending
        self.selector.register(pending.sock, selectors.EVENT_READ, pending)

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
        self.thread = threading.Thread(target=self._loop, name="horusd-frontend", daemon=True)
        self.thread.start()

    def _loop(self):
        pending = {}
        while not self.stopping.is_set():
            try:
                events = self.selector.select(timeout=0.5)
            except OSError:
                break
            now = time.monotonic()
            for key, _mask in events:
                kind = key.data
                if isinstance(kind, tuple):  # a listener: accept every waiting client
                    self._accept(key.fileobj, kind[1], pending, now)
                else:
                    self._read(kind, pending)
            for sock in [s for s, p in pending.items() if p.deadline < now]:
                self._drop(pending.pop(sock))
        for client in list(pending.values()):  # stopping: kept connections too, so clients notice
            self._drop(client)

    def _accept(self, listener, controller, pending, now):
        while True:
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            self.accepted += 1
            client = _Pending(sock, controller, now + self.CLIENT_TIMEOUT_S)
            pending[sock] = client
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client, pending):
        try:
            chunk = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk or len(client.buffer) + len(chunk) > protocol.MAX_LINE_BYTES:
            self._drop(pending.pop(client.sock))
            return
        client.buffer += chunk
        if b"\n" not in client.buffer:
            return
        del pending[client.sock]
        self.selector.unregister(client.sock)
        line = client.buffer.split(b"\n", 1)[0]
        if b'"reload"' in line:  # slow (models are rebuilt): keep answering the others meanwhile
            threading.Thread(target=self._respond, args=(client, line), daemon=True).start()
        else:
            self._respond(client, line, keep=pending)

    def _drop(self, client):
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()

    def stop(self):
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(5)
        for listener, _controller in self.listeners:
            listener.close()
        if self.selector is not None:
            self.selector.close()
        for path in (self.socket_path, self.user_socket_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
