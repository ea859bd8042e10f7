"""Records from the ``--json`` output of ``sinfo``/``scontrol show nodes``, ``squeue`` and ``sacct``,
of every supported Slurm (22.05, 24.11, 26.05; see :mod:`.version`).

:mod:`.openapi` has already unwrapped the newer format's numbers; what differs per version is read
here, one reader per record:

* nodes: 22.05's ``sinfo --json`` lists nodes one by one; later versions group them there, and
  ``scontrol --json show nodes`` lists them (same fields). ``state`` is ``"idle"`` plus
  ``state_flags`` in 22.05, ``["IDLE", "DRAIN"]`` later; ``features`` a string or a list.
  ``gres`` (``gpu:g0:1,...,shard:g0:2``) and ``gres_used`` (``IDX`` in 22.05, ``(1/2)`` for shards later)
* squeue: ``job_state`` a string or a list; ``tres_per_node`` (``gres:gpu:g2:1`` / ``gres/gpu:g2:1``)
  and ``gres_detail`` (``["gpu:g2:1(IDX:2)"]``, one entry per allocated node; a shard is
  ``shard:1(IDX:1)`` in 22.05, ``shard:1(0/2,1/2)`` later)
* sacct: ``tres.allocated``/``tres.requested`` entries ``{"type": "gres", "name": "gpu:g2", "count": 1}``;
  ``state.current`` a string or a list
"""

import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..errors import InputError
from .acct import read_sacct_json
from .gres import GresItem, held_indices, parse_gres, typed_gpu_indices
from ..hostlist import expand_hostlist
from .openapi import document_version, job_state, loads, text_list, whole, words

def _gres_field(record, key, command):
    try:
        return parse_gres(record.get(key))
    except InputError as exc:
        raise InputError(f"{command} --json: {key} of {record.get('name') or record.get('job_id')}: {exc}") from None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    state_flags: Tuple[str, ...]
    cpus: int
    alloc_cpus: int
    real_memory: int
    alloc_memory: int
    partitions: Tuple[str, ...]
    gres: List[GresItem] = field(default_factory=list)
    gres_used: List[GresItem] = field(default_factory=list)
    features: Tuple[str, ...] = ()
    address: str = ""  # NodeAddr
    hostname: str = ""  # NodeHostname

    def gpu_indices_in_use(self):
        """GPU indices held by jobs, whole GPUs and shards alike."""
        used = set()
        for item in self.gres_used:
            if item.name in ("gpu", "shard"):
                used.update(held_indices(item))
        return tuple(sorted(used))


def nodes_are_grouped(doc):
    """True for a newer ``sinfo --json`` document, which groups nodes (read ``scontrol --json show nodes``)."""
    return isinstance(doc, dict) and "sinfo" in doc and "nodes" not in doc


def parse_sinfo(text, command="sinfo"):
    """``sinfo --json`` (22.05) or ``scontrol --json show nodes`` output -> [NodeInfo]."""
    return nodes_from_doc(loads(text, command), command)


def nodes_from_doc(doc, command):
    """A loaded (:func:`.openapi.loads`) nodes document -> [NodeInfo]."""
    if nodes_are_grouped(doc):
        version = document_version(doc)
        raise InputError(f"{command} --json of Slurm {version or '(unknown)'} groups nodes: "
                         "read them with scontrol --json show nodes")
    if not isinstance(doc.get("nodes"), list):
        raise InputError(f"{command} --json: no 'nodes' list in the output")
    nodes = []
    for record in doc["nodes"]:
        state = words(record.get("state"))
        nodes.append(NodeInfo(
            name=record["name"],
            state=state[0].lower() if state else "",
            state_flags=tuple(record.get("state_flags") or ()) + tuple(f.upper() for f in state[1:]),
            cpus=whole(record.get("cpus")) or 0,
            alloc_cpus=whole(record.get("alloc_cpus")) or 0,
            real_memory=whole(record.get("real_memory")) or 0,
            alloc_memory=whole(record.get("alloc_memory")) or 0,
            partitions=tuple(record.get("partitions") or ()),
            gres=_gres_field(record, "gres", command),
            gres_used=_gres_field(record, "gres_used", command),
            features=text_list(record.get("active_features") or record.get("features")),
            address=str(record.get("address") or ""),
            hostname=str(record.get("hostname") or ""),
        ))
    return nodes


parse_nodes = parse_sinfo


@dataclass(frozen=True)
class QueueJob:
    job_id: int
    name: str
    state: str
    user: str
    nodes: str
    required_nodes: str
    partition: str
    tres_per_node: str
    comment: str
    admin_comment: str
    submit_time: int
    start_time: int
    gres_requested: List[GresItem] = field(default_factory=list)
    gres_allocated: List[GresItem] = field(default_factory=list)  # from gres_detail, all nodes
    end_time: int = 0  # expected end (start + time limit) while running
    time_limit: int = 0  # minutes; 0 when unset
    gres_detail: Tuple[str, ...] = ()  # one entry per allocated node, in node order
    state_reason: str = ""  # why a pending job waits (Resources, Priority, Dependency, JobHeldUser, ...)
    node_count: int = 1  # nodes asked for (pending) or held (running)
    tres_per_job: str = ""  # --gpus=N (gres:gpu:N)
    tasks: int = 1  # a pending job array's record stands for this many tasks still to start

    def gres_by_node(self):
        """[(node name, [GresItem])] of a running job: gres_detail lists one entry per node."""
        names = expand_hostlist(self.nodes) if self.nodes else []
        return [(name, parse_gres(detail)) for name, detail in zip(names, self.gres_detail)]

    def gpu_indices(self):
        """Indices of whole GPUs held (from gres_detail's IDX)."""
        return tuple(sorted({i for g in self.gres_allocated if g.name == "gpu" for i in held_indices(g)}))

    def shard_gpu_indices(self):
        """Indices of the GPUs whose shards the job holds (IDX in 22.05, positions later)."""
        return tuple(sorted({i for g in self.gres_allocated if g.name == "shard" for i in held_indices(g)}))


def array_task_count(task_string, max_running=0):
    """How many tasks a pending array record stands for: ``0-3%2`` -> 2 at once, ``1,5-9:2`` -> 4."""
    text, _, limit = (task_string or "").partition("%")
    count = 0
    for part in text.split(","):
        span, _, step = part.strip().partition(":")
        low, _, high = span.partition("-")
        try:
            low_i, high_i, step_i = int(low), int(high or low), int(step or 1)
        except ValueError:
            continue
        count += max(0, (high_i - low_i) // max(step_i, 1) + 1)
    limits = [int(x) for x in (limit, max_running) if str(x).isdigit() and int(x) > 0]
    return max(1, min([count or 1] + limits))


def parse_squeue(text):
    """``squeue --json`` output -> [QueueJob]."""
    return jobs_from_doc(loads(text, "squeue", "jobs"))


def jobs_from_doc(doc):
    """A loaded ``squeue --json`` document -> [QueueJob]."""
    jobs = []
    for record in doc["jobs"]:
        allocated = []
        for detail in record.get("gres_detail") or []:
            allocated.extend(_gres_field({"gres_detail": detail, "job_id": record.get("job_id")},
                                         "gres_detail", "squeue"))
        jobs.append(QueueJob(
            job_id=int(record["job_id"]),
            name=record.get("name", ""),
            state=job_state(record.get("job_state")),
            user=record.get("user_name", ""),
            nodes=record.get("nodes") or "",
            required_nodes=record.get("required_nodes") or "",
            partition=record.get("partition") or "",
            tres_per_node=record.get("tres_per_node") or "",
            comment=record.get("comment") or "",
            admin_comment=record.get("admin_comment") or "",
            submit_time=whole(record.get("submit_time")) or 0,
            start_time=whole(record.get("start_time")) or 0,
            gres_requested=_gres_field(record, "tres_per_node", "squeue"),
            gres_allocated=allocated,
            state_reason=str(record.get("state_reason") or ""),
            end_time=whole(record.get("end_time")) or 0,
            time_limit=whole(record.get("time_limit")) or 0,  # 0: unset or infinite
            gres_detail=tuple(record.get("gres_detail") or ()),
            node_count=whole(record.get("node_count")) or 1,
            tres_per_job=record.get("tres_per_job") or "",
            tasks=array_task_count(record.get("array_task_string"), whole(record.get("array_max_tasks")) or 0)
            if record.get("array_task_string") else 1,
        ))
    return jobs


@dataclass(frozen=True)
class AcctJob:
    job_id: int
    name: str
    state: str
    user: str
    nodes: str
    comment: Optional[str]
    admin_comment: Optional[str]
    submit_time: int
    start_time: int
    end_time: int
    elapsed_s: int
    exit_code: Optional[int]
    gres_allocated: List[GresItem] = field(default_factory=list)
    gres_requested: List[GresItem] = field(default_factory=list)

    def gpu_indices(self):
        """GPU indices from the per-GPU TRES types (``gres/gpu:g2`` -> 2); sacct has no IDX."""
        return typed_gpu_indices(self.gres_allocated)

    def gres_counts(self):
        """{"gpu": 2, "gpu:g0": 1, "shard": 1, ...} as sacct's AllocTRES has them."""
        return {(g.name if g.type is None else f"{g.name}:{g.type}"): g.count for g in self.gres_allocated}


def parse_sacct(text):
    """``sacct --json`` output -> [AcctJob] (job records; steps are left out). Read by :mod:`.acct`."""
    jobs, _steps = read_sacct_json(text)
    return [AcctJob(
        job_id=job["job_id"], name=job["name"] or "", state=job["state"], user=job["user"] or "",
        nodes=job["nodes"] or "", comment=job["comment"], admin_comment=job["admin_comment"],
        submit_time=job["submit_time"] or 0, start_time=job["start_time"] or 0, end_time=job["end_time"] or 0,
        elapsed_s=job["elapsed_s"] or 0, exit_code=job["exit_code"],
        gres_allocated=[GresItem(*entry) for entry in job["gres_entries"]],
        gres_requested=[GresItem(*entry) for entry in job["req_gres_entries"]],
    ) for job in jobs]


@dataclass(frozen=True)
class ControllerStatus:
    role: str  # primary, backup, backup2, ...
    host: str  # its SlurmctldHost name
    up: bool


_PING_LINE = re.compile(r"^Slurmctld\((?P<role>[\w-]+)\) at (?P<host>\S+) is (?P<state>UP|DOWN)", re.M)


def parse_ping(text):
    """``scontrol ping`` output -> [ControllerStatus] in SlurmctldHost order (22.05 prints one line per
    controller: ``Slurmctld(primary) at ctl1 is UP``; a standby backup answers pings, so it is UP too)."""
    return [ControllerStatus(m.group("role"), m.group("host"), m.group("state") == "UP")
            for m in _PING_LINE.finditer(text or "")]


def active_controller(controllers):
    """The controller in control: the first that answers, in SlurmctldHost order (a backup takes over
    only while every controller before it is down, and gives control back when the primary returns)."""
    for controller in controllers:
        if controller.up:
            return controller.host
    return None
