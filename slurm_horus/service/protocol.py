"""horusd's wire protocol: one JSON object per line over a Unix (or TCP) stream socket.

Request (client -> horusd), every field optional except ``op``::

    {"op": "place", "user": "alice", "uid": 1000, "partition": "gpu", "job_name": "train",
     "comment": "...", "script_hash": "sha1...", "job_class": "resnet50-bs64",
     "tres_per_node": "gres:gpu:2", "tres_per_job": "gres:gpu:2", "tres_per_task": "",
     "num_nodes": 1, "num_tasks": 1, "time_limit_min": 60, "req_nodes": "", "exc_nodes": "",
     "hints": {"HORUS_MODEL": "resnet50", "HORUS_BATCH_SIZE": "64"}, "explain": false,
     "dry_run": false}

``op`` is ``place`` (decide and record in the ledger), ``ping`` (health) or ``reload``.
``dry_run`` asks for a decision without recording it (horus-sbatch --dry-run / --explain).

Reply (horusd -> client)::

    {"ok": true, "action": "place" | "unchanged", "decision_id": "h-1a2b3c",
     "nodes": ["n3"], "gpus": {"n3": [2]}, "gres": "gpu:g2:1", "binding": "indexed"|"shard"|"node",
     "mode": "exclusive"|"shared", "predicted_slowdown": 1.08,
     "corunner_slowdowns": {"1234": 1.05}, "reason": "...", "candidates": [...]}

or ``{"ok": false, "error": "..."}``. ``action == "unchanged"`` means: leave the job to Slurm.

Clients must treat *anything* unexpected (no socket, timeout, garbage, ok=false) as "unchanged":
slurm-horus never costs a user their submission. :func:`ask` does exactly that and returns None.
"""

import json
import socket
import time

MAX_LINE_BYTES = 1 << 20


def encode(message):
    return (json.dumps(message, separators=(",", ":"), sort_keys=True) + "\n").encode()


def decode(line):
    """Parse one line into a dict; raises ValueError on anything that is not a JSON object."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("message is not a JSON object")
    return message


def _connect(address, timeout_s):
    if isinstance(address, tuple):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    sock.connect(address)
    return sock


def ask(request, address, timeout_s=0.1):
    """Send one request and return the reply dict, or None on any failure within ``timeout_s``.

    ``address`` is a Unix socket path or a (host, port) tuple. The deadline covers connect, send and
    receive together.
    """
    deadline = time.monotonic() + timeout_s
    try:
        sock = _connect(address, timeout_s)
    except (OSError, ValueError):
        return None
    try:
        sock.sendall(encode(request))
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or len(buffer) > MAX_LINE_BYTES:
                return None
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        reply = decode(buffer.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    if reply.get("ok") is not True:
        return None
    return reply
