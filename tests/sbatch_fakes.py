"""A test-only stand-in for horusd: one thread serving the real wire protocol with a fixed reply.

horusd itself is another issue; horus-sbatch's tests need something that answers on a Unix socket
exactly as the protocol says (:mod:`slurm_horus.service.protocol`), and records what it was asked.
"""

import os
import socket
import tempfile
import threading

from slurm_horus.service import protocol


class FakeHorusd:
    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self._directory = tempfile.mkdtemp(prefix="fake-horusd-")
        # the site setting names the controller socket; horus-sbatch talks to "<socket>.user"
        self.socket_path = os.path.join(self._directory, "horusd.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path + ".user")
        self._server.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            with connection:
                buffer = b""
                while b"\n" not in buffer:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    buffer += chunk
                try:
                    request = protocol.decode(buffer.split(b"\n", 1)[0])
                except ValueError:
                    continue
                self.requests.append(request)
                reply = self.reply(request) if callable(self.reply) else self.reply
                connection.sendall(protocol.encode(reply))

    def close(self):
        self._server.close()
        try:
            os.unlink(self.socket_path + ".user")
            os.rmdir(self._directory)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def place_reply(node="n3", gpus=(2,), binding="indexed", **extra):
    """A ``place`` reply pinning the job to ``gpus`` of ``node`` with per-GPU GRES types g0..g3."""
    if binding == "shard":
        tres = ",".join(f"gres:shard:g{index}:1" for index in gpus)
    elif binding == "node":
        tres = f"gres:gpu:{len(gpus)}"
    else:
        tres = ",".join(f"gres:gpu:g{index}:1" for index in gpus)
    reply = {"ok": True, "action": "place", "id": "h-test01", "nodes": [node],
             "gpus": {node: list(gpus)}, "tres": tres, "binding": binding, "mode": "exclusive",
             "slowdown": 1.0, "corunner_slowdowns": {}, "reason": "the least loaded GPU",
             "candidates": []}
    reply.update(extra)
    return reply
