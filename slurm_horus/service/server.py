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
import socket
import socketserver
import struct
import threading

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
    if message.get("op") == "reload":
        return "reload is for the controller socket"
    return None


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0  # a client that connects and says nothing is dropped

    def handle(self):
        server = self.server
        try:
            line = self.rfile.readline(protocol.MAX_LINE_BYTES)
        except OSError:
            return
        if not line:
            return
        reply, kv = server.horusd_answer(line, self.request, server.is_controller)
        try:
            if kv:
                self.wfile.write((encode_kv_reply(reply) + "\n").encode())
            else:
                self.wfile.write(protocol.encode(reply))
        except OSError:
            pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class Frontend:
    """Owns the listening sockets and turns lines into calls of ``decide``."""

    def __init__(self, decide, socket_path, tcp=None, trusted_uids=None):
        self.decide = decide
        self.socket_path = socket_path
        self.user_socket_path = socket_path + ".user"
        self.tcp = tcp
        self.trusted_uids = set(trusted_uids or ()) | {0, os.getuid()}
        self.servers = []
        self.threads = []

    def answer(self, line, sock, controller):
        """(reply dict, wants key=value) for one request line; never raises."""
        try:
            message = protocol.decode(line)
        except ValueError:
            log.warning("horus: refused malformed request")
            return {"ok": False, "error": "malformed request"}, False
        kv = message.get("reply") == "kv"
        try:
            uid = peer_uid(sock)
            refusal = authorize(message, uid, self.trusted_uids, controller or uid is None)
            if refusal:
                log.warning("horus: refused request from uid %s: %s", uid, refusal)
                return {"ok": False, "error": refusal}, kv
            return self.decide(message), kv
        except Exception as exc:  # the service must answer, whatever went wrong
            log.exception("horus: error while deciding")
            return {"ok": False, "error": f"internal error: {type(exc).__name__}"}, kv

    def _listen_unix(self, path, mode, controller):
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        old_umask = os.umask(0o177)  # the socket exists with 0600 before chmod widens the user one
        try:
            server = _UnixServer(path, _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        self._register(server, controller)

    def _register(self, server, controller):
        server.is_controller = controller
        server.horusd_answer = self.answer
        self.servers.append(server)

    def start(self):
        self._listen_unix(self.socket_path, 0o600, controller=True)
        self._listen_unix(self.user_socket_path, 0o666, controller=False)
        if self.tcp:
            host, _, port = self.tcp.rpartition(":")
            self._register(_TCPServer((host or "127.0.0.1", int(port)), _Handler), controller=True)
        for server in self.servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self):
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for path in (self.socket_path, self.user_socket_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
