"""horusd's wire protocol: one JSON object per line over a Unix (or TCP) stream socket.

Request (client -> horusd), every field optional except ``op``::

    {"op": "place", "user": "alice", "uid": 1000, "partition": "gpu", "job_name": "train",
     "comment": "...", "script_hash": "sha1...", "job_class": "resnet50-bs64",
     "tres_per_node": "gres:gpu:2", "tres_per_job": "gres:gpu:2", "tres_per_task": "",
     "num_nodes": 1, "num_tasks": 1, "time_limit_min": 60, "req_nodes": "", "exc_nodes": "",
     "hints": {"HORUS_MODEL": "resnet50", "HORUS_BATCH_SIZE": "64"}, "explain": false,
     "dry_run": false}

``op`` is ``place`` (decide and record in the ledger), ``ping`` (health), ``confirm`` (is this
horus-sbatch decision ours and the caller's?), and, on the controller socket only, ``claim``
(job_submit.lua took a published offer; not answered) and ``reload``.
``dry_run`` asks for a decision without recording it (horus-sbatch --dry-run / --explain).
On the user socket horusd sets ``uid`` and ``user`` itself, from the peer's credentials.

Reply (horusd -> client)::

    {"ok": true, "action": "place" | "unchanged", "decision_id": "h-1a2b3c",
     "nodes": ["n3"], "gpus": {"n3": [2]}, "gres": "gpu:g2:1", "binding": "indexed"|"shard"|"node",
     "mode": "exclusive"|"shared", "predicted_slowdown": 1.08,
     "corunner_slowdowns": {"1234": 1.05}, "reason": "...", "candidates": [...]}

or ``{"ok": false, "error": "..."}``. ``action == "unchanged"`` means: leave the job to Slurm.

Limits (a request over them is answered ``ok: false`` and never reaches a decision): a line of at
most ``MAX_LINE_BYTES``, a JSON object nested at most ``MAX_DEPTH`` deep, no NaN or Infinity, and
each field above of its type (:data:`FIELD_TYPES`; fields not named there are ignored).

Clients must treat *anything* unexpected (no socket, timeout, garbage, ok=false) as "unchanged":
slurm-horus never costs a user their submission. :func:`ask` does exactly that and returns None.
A client keeps its connection open until it has read the reply: a request whose client has closed
the connection is not decided (nobody would apply the decision).
"""

import json
import socket
import time

MAX_LINE_BYTES = 64 * 1024  # a request line (the largest real one, horus-sbatch's, is ~1 KiB)
MAX_REPLY_BYTES = 1 << 20  # a reply line (--explain lists candidates)
MAX_DEPTH = 8  # nesting of a request's JSON (real ones: 2)


_TEXT = ("op", "reply", "user", "partition", "job_name", "comment", "script_hash", "job_class", "tres_per_node",
         "tres_per_job", "tres_per_task", "req_nodes", "exc_nodes", "gpu_type", "id", "source", "peer")
_WHOLE = ("uid", "num_nodes", "num_tasks", "gpus_per_node", "min_nodes")
_FLAGS = ("explain", "dry_run", "offer")
FIELD_TYPES = {**{name: "text" for name in _TEXT}, **{name: "whole number" for name in _WHOLE},
               **{name: "true or false" for name in _FLAGS}, "time_limit_min": "number",
               "hints": "object of texts"}
_MAX_WHOLE = 1 << 53  # what a Lua number (a double) holds exactly


def _of_type(value, kind):
    if value is None:  # the Lua sends null for what a job does not set
        return True
    if kind == "text":
        return isinstance(value, str)
    if kind == "whole number":
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _MAX_WHOLE
    if kind == "true or false":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= _MAX_WHOLE
    return isinstance(value, dict) and all(isinstance(v, str) or v is None for v in value.values())


def check_fields(message):
    """Raise ValueError naming the first field of ``message`` that is not of its type."""
    for name, kind in FIELD_TYPES.items():
        if name in message and not _of_type(message[name], kind):
            raise ValueError(f"{name} must be {kind}")


def encode(message):
    return (json.dumps(message, separators=(",", ":"), sort_keys=True) + "\n").encode()


def _no_constant(name):
    raise ValueError(f"{name} is not a number")


def _depth(value):
    """Nesting depth of a decoded JSON value (1 for a flat object); iterative."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def decode(line, max_bytes=MAX_LINE_BYTES, request=True):
    """Parse one line into a dict; raises ValueError on anything that is not a JSON object within
    the limits (length, nesting, numbers only; for a ``request``, the fields' types), whatever the
    bytes are."""
    if len(line) > max_bytes:
        raise ValueError(f"line longer than {max_bytes} bytes")
    try:
        message = json.loads(line, parse_constant=_no_constant)
    except RecursionError:  # the C scanner gives up on ~1,000 nested brackets
        raise ValueError("nested too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("message is not a JSON object")
    if _depth(message) > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if request:
        check_fields(message)
    return message


def _connect(address, timeout_s):
    if isinstance(address, tuple):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
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
            if remaining <= 0 or len(buffer) > MAX_REPLY_BYTES:
                return None
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        reply = decode(buffer.split(b"\n", 1)[0], max_bytes=MAX_REPLY_BYTES, request=False)
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    if reply.get("ok") is not True:
        return None
    return reply
