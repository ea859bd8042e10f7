"""horusd's wire contract: one JSON object per line over a Unix (or TCP) stream socket.

A request is read into a typed :class:`Request` once, at the edge (:func:`parse_request`); everything
behind it sees fields, never the raw message. Every decision is answered with one typed
:class:`Reply`, each field under one name. The same names travel in JSON (horus-sbatch, tools) and
in the ``key=value;...`` line job_submit.lua parses (:func:`encode_kv`), and the offers file that
horusd publishes for the Lua (:func:`format_offers_header`, :func:`parse_offers_header`) uses that
line too. ``job_submit_lua/job_submit.lua`` reads exactly these names.

Request (client -> horusd); every field optional except ``op``::

    {"op": "place", "user": "alice", "uid": 1000, "partition": "gpu", "comment": "...",
     "job_class": "resnet50-bs64", "gpus_per_node": 1, "num_nodes": 1,
     "tres_per_node": "gres:gpu:2", "tres_per_job": "", "tres_per_task": "", "num_tasks": 1,
     "time_limit_min": 60, "hints": {"HORUS_MODEL": "resnet50", "HORUS_BATCH_SIZE": "64"},
     "reply": "kv", "keep": true, "held": false, "explain": false, "dry_run": false,
     "give_up_at": 1795000000.25}

``op`` is ``place`` (decide and record), ``confirm`` (is decision ``id`` ours and the caller's?),
``claim`` (job_submit.lua took offer ``id``: a notification, nothing is answered), ``left``
(job_submit.lua left a GPU job to Slurm: a notification), ``ping``,
``reload``. ``gpus_per_node``/``num_nodes`` are the counts job_submit.lua read; other clients may
send the TRES strings instead. ``keep``: the client can keep the job for horusd's queue
(job_submit.lua); ``held``: the job is held by its user (``sbatch -H``). ``reply: "kv"`` asks for
the key=value form. ``give_up_at``: when the client stops waiting (wall-clock seconds); a request
horusd reads later is answered ``expired: past its deadline`` and nothing is decided or recorded
(the job went to Slurm unchanged). ``dry_run`` decides without recording (horus-sbatch --dry-run / --explain).
On the user socket horusd sets ``uid`` and ``user`` itself, from the peer's credentials, and
answers only ``place`` (for the caller), ``confirm`` and ``ping``; ``claim`` and ``reload`` are
controller-socket only.

Reply (horusd -> client)::

    {"ok": true, "action": "place" | "keep" | "unchanged" | "confirm", "id": "h1a2b3c4d5e",
     "nodes": ["n3"], "gpus": {"n3": [2]}, "gpulist": "n3:2", "tres": "gres:shard:g2:1",
     "binding": "indexed" | "shard" | "node", "mode": "exclusive" | "shareable" | "shared" | "kept",
     "class": "resnet50-bs64", "slowdown": 1.08, "corunner_slowdowns": {"1234": 1.05},
     "policy": "horus", "partition": "infer", "age": 0.4, "lease": 30, "offers_version": 17,
     "reason": "...", "candidates": [...]}

or ``{"ok": false, "error": "..."}``. ``unchanged``: leave the job to Slurm. ``keep``: hold the job
for horusd's queue (job_submit.lua sets ``tres`` and a begin time ``lease`` seconds ahead; horusd
moves and starts it later, see docs/horusd.md). Clients must treat *anything* unexpected (no socket,
timeout, garbage, ok=false) as "unchanged": slurm-horus never costs a user their submission.
:func:`ask` does exactly that and returns None.

Limits (a request over them is answered ``ok: false`` and never reaches a decision): a line of at
most ``MAX_LINE_BYTES``, a JSON object nested at most ``MAX_DEPTH`` deep, no NaN or Infinity, and
each field above of its type (:data:`FIELD_TYPES`; fields not named there are ignored).

A client keeps its connection open until it has read the reply: a request whose client has closed
the connection is not decided (nobody would apply the decision).
"""

import json
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import InputError
from ..jobclass import SAFE_CLASS, UNKNOWN_CLASS, job_class_of, opted_out
from ..slurm.gres import parse_gres

OPS = ("place", "confirm", "claim", "left", "ended", "ping", "reload")
_SAFE_ID = re.compile(r"^[A-Za-z0-9\-_]{1,64}\Z")

MAX_LINE_BYTES = 64 * 1024  # a request line (the largest real one, horus-sbatch's, is ~1 KiB)
MAX_REPLY_BYTES = 1 << 20  # a reply line (--explain lists candidates)
MAX_DEPTH = 8  # nesting of a request's JSON (real ones: 2)
MAX_ENDED_IDS = 10000  # job ids one "ended" answer covers


_TEXT = ("op", "reply", "user", "partition", "job_name", "comment", "script_hash", "job_class", "tres_per_node",
         "tres_per_job", "tres_per_task", "req_nodes", "exc_nodes", "gpu_type", "id", "source", "peer")
_WHOLE = ("uid", "num_nodes", "num_tasks", "gpus_per_node", "min_nodes", "shards", "job_id")
_FLAGS = ("explain", "dry_run", "offer", "keep", "held")
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


# ---- requests -----------------------------------------------------------------------------------

@dataclass
class Request:
    """One request, read once at the edge. ``problem`` set: a place request horusd cannot decide
    (no GPU asked for, nonsense sizes); it is answered ``unchanged`` with that reason."""

    op: str
    user: str = ""
    uid: Optional[int] = None
    partition: str = ""
    job_class: str = UNKNOWN_CLASS
    gpus_per_node: int = 0
    nodes: int = 1
    time_limit_s: Optional[float] = None
    decision_id: str = ""  # confirm, claim: the decision or offer named
    kv: bool = False  # answer in the key=value form (job_submit.lua)
    keep: bool = False  # the client can keep the job for horusd's queue (job_submit.lua)
    held: bool = False  # held by its user: kept, it waits for the user, not among the jobs waiting for GPUs
    explain: bool = False
    dry_run: bool = False
    offer: bool = False  # horusd's own offers: decided, not recorded until claimed
    from_user: bool = False  # came on the user socket (horus-sbatch): uid from the peer's credentials
    opted_out: bool = False  # HORUS_OFF / horus=off: answered unchanged, never shared
    gpu_type: str = ""  # a GPU type the user asked for ("" = any): placed only among those GPUs
    shards: int = 0  # --gres=shard:N: N shards of one GPU (a fraction of it), 0 = whole GPUs
    job_ids: List[int] = field(default_factory=list)  # ended: the jobs EpilogSlurmctld ran for
    problem: str = ""

    @property
    def records(self) -> bool:
        """Whether a placement answered to this request is recorded (a real submission follows)."""
        return self.op == "place" and not self.dry_run and not self.offer


def _int_or_none(value):
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _text(value, limit=1024):
    return value[:limit] if isinstance(value, str) else ""


def gpu_counts(tres_per_node="", tres_per_job="", tres_per_task="", nodes=None, tasks=None):
    """(gpus per node, nodes, GPU type or None) from job_desc's TRES strings, the way job_submit.lua
    reads them (its twin is ``lua_twin.gpu_request``); (0, nodes, None) when no GPU is asked for.
    The type is the one the typed GPU items name (none when untyped, mixed, or per task). Raises ValueError when
    the counts cannot be split evenly over the nodes."""
    nodes = max(_int_or_none(nodes) or 1, 1)

    def gpus_in(text):
        # the forms job_desc and sbatch spell: gres:gpu:2, gres/gpu=2, gpu:v100:1, gpu
        text = ",".join(re.sub(r"[=/]", ":", item.strip()) for item in (text or "").split(","))
        try:
            items = [item for item in parse_gres(text) if item.name == "gpu"]
        except InputError:
            raise ValueError(f"bad gpu request {text!r}") from None
        types = {item.type for item in items if item.type}  # untyped items name no type; mixed: none
        return sum(item.count for item in items), (types.pop() if len(types) == 1 else None)

    per_node, gpu_type = gpus_in(tres_per_node)
    if per_node > 0:
        return per_node, nodes, gpu_type
    per_job, gpu_type = gpus_in(tres_per_job)
    if per_job > 0:
        if per_job % nodes:
            raise ValueError("gpus per job not divisible by nodes")
        return per_job // nodes, nodes, gpu_type
    per_task, _type = gpus_in(tres_per_task)  # as the Lua: a per-task request keeps no type
    if per_task > 0:
        tasks = max(_int_or_none(tasks) or 1, 1)
        if tasks % nodes:
            raise ValueError("tasks not divisible by nodes")
        return per_task * tasks // nodes, nodes, None
    return 0, nodes, None


def shard_count(tres_per_node="") -> int:
    """Untyped shards a job asks per node (``gres:shard:3``, ``gres/shard=3``), as job_submit.lua's
    ``count_shards`` reads them (a typed shard names its GPU already: not counted)."""
    total = 0
    for item in (tres_per_node or "").split(","):
        try:
            parsed = parse_gres(re.sub(r"[=/]", ":", item.strip()))
        except InputError:
            continue
        total += sum(p.count for p in parsed if p.name == "shard" and not p.type)
    return total


def parse_request(message: dict) -> Request:
    """The typed request of one decoded message (never raises: an unusable place request carries its
    ``problem``, an unknown op is kept for the caller to refuse)."""
    op = message.get("op")
    request = Request(op=op if isinstance(op, str) else "")
    request.uid = _int_or_none(message.get("uid"))
    request.user = _text(message.get("user"), 256)
    request.kv = message.get("reply") == "kv"
    request.from_user = message.get("peer") == "user"  # set by the frontend (server.authorize), never by a client
    ident = message.get("id")
    request.decision_id = ident if isinstance(ident, str) and _SAFE_ID.match(ident) else ""
    if request.op == "ended":
        # one job per line; the server's worker answers the lines that waited together, with their
        # job ids gathered in job_ids (set by the server, like peer)
        named = message.get("job_ids") if isinstance(message.get("job_ids"), list) else [message.get("job_id")]
        ids = (_int_or_none(j) if not isinstance(j, float) else None for j in named[:MAX_ENDED_IDS])
        request.job_ids = sorted({j for j in ids if j is not None and 0 < j < 1 << 32})
    if request.op != "place":
        return request
    request.partition = _text(message.get("partition"), 256)
    request.explain = message.get("explain") is True
    request.dry_run = message.get("dry_run") is True
    request.keep = message.get("keep") is True
    request.held = message.get("held") is True
    hints = message.get("hints") if isinstance(message.get("hints"), dict) else {}
    hints = {k: str(v) for k, v in hints.items() if isinstance(k, str) and isinstance(v, (str, int))}
    requested = message.get("job_class") if isinstance(message.get("job_class"), str) else None
    comment = _text(message.get("comment"), 4096)
    request.job_class = job_class_of(hints=hints, requested=requested, comment=comment)
    request.opted_out = opted_out(hints, comment)
    limit = message.get("time_limit_min")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and 0 < limit < 1e9:
        request.time_limit_s = float(limit) * 60
    try:
        if "gpus_per_node" in message:
            per_node, nodes = _int_or_none(message["gpus_per_node"]), message.get("num_nodes")
            nodes = 1 if nodes is None else _int_or_none(nodes)
            gpu_type = message.get("gpu_type")
            shards = _int_or_none(message.get("shards")) if message.get("shards") is not None else 0
            if per_node is None or nodes is None:
                raise ValueError("bad gpus_per_node or num_nodes")
            if shards is None:
                raise ValueError("bad shards")
        else:
            per_node, nodes, gpu_type = gpu_counts(*(_text(message.get(k)) for k in
                                                     ("tres_per_node", "tres_per_job", "tres_per_task")),
                                                   message.get("num_nodes"), message.get("num_tasks"))
            shards = shard_count(_text(message.get("tres_per_node"))) if per_node == 0 else 0
            per_node = 1 if shards else per_node
        if gpu_type is not None and (not isinstance(gpu_type, str) or not SAFE_CLASS.match(gpu_type)):
            raise ValueError("bad gpu_type")
    except ValueError as exc:
        request.problem = str(exc)
        return request
    if per_node < 1 or nodes < 1 or per_node > 1024 or nodes > 65536:
        request.problem = "no gpu requested"
        return request
    if shards and (shards < 0 or shards > 1024 or per_node != 1 or nodes != 1):
        request.problem = "shards are placed on one GPU of one node"
        return request
    request.gpus_per_node, request.nodes, request.shards = per_node, nodes, shards
    request.gpu_type = gpu_type.lower() if gpu_type else ""
    return request


# ---- replies ------------------------------------------------------------------------------------

@dataclass
class Reply:
    """horusd's answer to a place or confirm request; :meth:`wire` gives the JSON object."""

    action: str  # place | keep | unchanged | confirm
    reason: str = ""
    id: str = ""
    nodes: Tuple[str, ...] = ()
    gpus: Dict[str, List[int]] = field(default_factory=dict)
    gpulist: str = ""  # the token's gpus= field: n3:2+3,n4:0
    tres: str = ""  # job_desc's tres_per_node to set
    binding: str = ""
    mode: str = ""  # exclusive | shareable | shared | kept
    job_class: str = ""  # "class" on the wire
    slowdown: Optional[float] = None
    corunner_slowdowns: Dict[str, Optional[float]] = field(default_factory=dict)
    policy: str = ""
    partition: str = ""  # a partition to move the job to (DeepBoot lending)
    age: Optional[float] = None  # seconds since the cluster state was read
    lease: Optional[int] = None  # keep: seconds until Slurm may start the job on its own
    offers_version: Optional[int] = None
    class_known: Optional[bool] = None  # whether the interference model knows the job's class ...
    class_suggestions: List[str] = field(default_factory=list)  # ... and if not, the closest names it knows
    candidates_total: Optional[int] = None  # GPUs that could take the job (--explain lists the best)
    gpus_total: Optional[int] = None  # GPUs of the cluster
    micro_batch: Optional[int] = None  # SJF-BSBF sub-batching: samples per step ...
    grad_accum: Optional[int] = None  # ... and steps accumulated per update (HORUS_MICRO_BATCH/_GRAD_ACCUM)
    candidates: list = field(default_factory=list)

    @property
    def placed(self) -> bool:
        return self.action == "place"

    def wire(self) -> dict:
        """The JSON object sent (empty fields left out)."""
        out = {"ok": True, "action": self.action}
        for key, value in (("reason", self.reason), ("id", self.id), ("nodes", list(self.nodes)),
                           ("gpus", self.gpus), ("gpulist", self.gpulist), ("tres", self.tres),
                           ("binding", self.binding), ("mode", self.mode), ("class", self.job_class),
                           ("slowdown", self.slowdown), ("corunner_slowdowns", self.corunner_slowdowns),
                           ("policy", self.policy), ("partition", self.partition), ("age", self.age),
                           ("lease", self.lease), ("offers_version", self.offers_version),
                           ("micro_batch", self.micro_batch), ("grad_accum", self.grad_accum),
                           ("class_known", self.class_known), ("class_suggestions", self.class_suggestions),
                           ("candidates_total", self.candidates_total), ("gpus_total", self.gpus_total),
                           ("candidates", self.candidates)):
            if value not in (None, "", [], {}):
                out[key] = value
        return out

    def token_fields(self) -> dict:
        """What a ``confirm`` answers about this decision (the fields of its admin_comment token)."""
        return {"mode": self.mode, "slowdown": self.slowdown, "job_class": self.job_class, "gpulist": self.gpulist}


def unchanged(reason, **extra) -> Reply:
    return Reply("unchanged", reason=reason, **extra)


def error(text) -> dict:
    return {"ok": False, "error": text}


def encode_kv(reply: dict) -> str:
    """A reply (its wire dict) in the key=value form job_submit.lua parses: values of lists of
    strings joined by ``,``, dicts and other lists left out, ';' and newlines removed from values."""
    parts = []
    for key in sorted(reply):
        value = reply[key]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # e.g. nodes
        if value is None or isinstance(value, (dict, list)):
            continue
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, float):
            value = "%.3f" % value
        text = str(value).replace(";", ",").replace("\n", " ").replace("\r", " ")
        parts.append("%s=%s" % (key, text))
    return ";".join(parts)


# ---- the offers file (job_submit.lua reads it; docs/horusd.md) ----------------------------------

def format_offers_header(version, claimed, generated, joint=0):
    """``joint``: the first ``joint`` offers were computed each as if those before it were taken (they
    may be taken together)."""
    return f"version={version};claimed={claimed};joint={int(joint)};generated={generated:.3f}"


def parse_offers_header(header):
    """``version=N;claimed=ID;generated=EPOCH`` -> (version int or None, claimed str or None,
    generated float or None)."""
    version = re.match(r"^version=([0-9]+);", header)
    claimed = re.search(r";claimed=([A-Za-z0-9\-_]*);", header)
    generated = re.search(r";generated=([0-9]+\.?[0-9]*)\Z", header)
    return (int(version.group(1)) if version else None, claimed.group(1) if claimed else None,
            float(generated.group(1)) if generated else None)


# ---- the client side ----------------------------------------------------------------------------

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
    if "give_up_at" not in request:  # horusd decides nothing once the caller has stopped waiting
        request = dict(request, give_up_at=time.time() + timeout_s)
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
