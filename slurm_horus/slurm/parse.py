"""Records from ``sinfo --json``, ``squeue --json`` and ``sacct --json`` of Slurm 22.05.

22.05 prints openapi v0.0.38 shapes (``dbv0.0.38`` for sacct). Only the fields slurm-horus uses are
kept; the GRES fields become :class:`~slurm_horus.slurm.gres.GresItem` lists:

* sinfo: ``gres`` (``gpu:g0:1,...,shard:g0:2``) and ``gres_used`` with ``IDX``
* squeue: ``tres_per_node`` (``gres:gpu:g2:1``) and ``gres_detail`` (``["gpu:g2:1(IDX:2)"]``, one
  entry per allocated node)
* sacct: ``tres.allocated``/``tres.requested`` entries ``{"type": "gres", "name": "gpu:g2", "count": 1}``
"""

import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..errors import InputError
from .gres import GresItem, parse_gres, typed_gpu_indices
from ..hostlist import expand_hostlist


def _load(text, command, key):
    try:
        data = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError as exc:
        raise InputError(f"{command} --json: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise InputError(f"{command} --json: no {key!r} list in the output")
    errors = [e for e in data.get("errors") or [] if e]
    if errors:
        raise InputError(f"{command} --json reported errors: {errors}")
    return data[key]


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

    def gpu_indices_in_use(self):
        """GPU indices held by jobs, whole GPUs and shards alike."""
        used = set()
        for item in self.gres_used:
            if item.name in ("gpu", "shard") and item.count > 0:
                used.update(item.indices)
        return tuple(sorted(used))


def parse_sinfo(text):
    """``sinfo --json`` output -> [NodeInfo]."""
    nodes = []
    for record in _load(text, "sinfo", "nodes"):
        nodes.append(NodeInfo(
            name=record["name"],
            state=record.get("state", ""),
            state_flags=tuple(record.get("state_flags") or ()),
            cpus=int(record.get("cpus") or 0),
            alloc_cpus=int(record.get("alloc_cpus") or 0),
            real_memory=int(record.get("real_memory") or 0),
            alloc_memory=int(record.get("alloc_memory") or 0),
            partitions=tuple(record.get("partitions") or ()),
            gres=_gres_field(record, "gres", "sinfo"),
            gres_used=_gres_field(record, "gres_used", "sinfo"),
            features=tuple(f for f in (record.get("active_features") or record.get("features") or "").split(",") if f),
        ))
    return nodes


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
        return tuple(sorted({i for g in self.gres_allocated if g.name == "gpu" and g.count > 0 for i in g.indices}))

    def shard_gpu_indices(self):
        """Indices of the GPUs whose shards the job holds."""
        return tuple(sorted({i for g in self.gres_allocated if g.name == "shard" and g.count > 0 for i in g.indices}))


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
    jobs = []
    for record in _load(text, "squeue", "jobs"):
        allocated = []
        for detail in record.get("gres_detail") or []:
            allocated.extend(_gres_field({"gres_detail": detail, "job_id": record.get("job_id")},
                                         "gres_detail", "squeue"))
        jobs.append(QueueJob(
            job_id=int(record["job_id"]),
            name=record.get("name", ""),
            state=record.get("job_state", ""),
            user=record.get("user_name", ""),
            nodes=record.get("nodes", ""),
            required_nodes=record.get("required_nodes", ""),
            partition=record.get("partition", ""),
            tres_per_node=record.get("tres_per_node", ""),
            comment=record.get("comment", ""),
            admin_comment=record.get("admin_comment", ""),
            submit_time=int(record.get("submit_time") or 0),
            start_time=int(record.get("start_time") or 0),
            gres_requested=_gres_field(record, "tres_per_node", "squeue"),
            gres_allocated=allocated,
            state_reason=str(record.get("state_reason") or ""),
            end_time=int(record.get("end_time") or 0),
            time_limit=int(record.get("time_limit") or 0),
            gres_detail=tuple(record.get("gres_detail") or ()),
            node_count=int(record.get("node_count") or 1),
            tres_per_job=record.get("tres_per_job") or "",
            tasks=array_task_count(record.get("array_task_string"), record.get("array_max_tasks") or 0)
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


def _tres_gres(entries):
    items = []
    for entry in entries or []:
        if entry.get("type") != "gres" or not entry.get("name"):
            continue
        name, _, gres_type = entry["name"].partition(":")
        items.append(GresItem(name, gres_type or None, int(entry.get("count") or 0)))
    return items


def parse_sacct(text):
    """``sacct --json`` output -> [AcctJob] (job records; steps are left out)."""
    jobs = []
    for record in _load(text, "sacct", "jobs"):
        times = record.get("time") or {}
        tres = record.get("tres") or {}
        comment = record.get("comment") or {}
        exit_code = (record.get("exit_code") or {}).get("return_code")
        jobs.append(AcctJob(
            job_id=int(record["job_id"]),
            name=record.get("name", ""),
            state=(record.get("state") or {}).get("current", ""),
            user=record.get("user", ""),
            nodes=record.get("nodes", ""),
            comment=comment.get("job"),
            admin_comment=comment.get("administrator"),
            submit_time=int(times.get("submission") or 0),
            start_time=int(times.get("start") or 0),
            end_time=int(times.get("end") or 0),
            elapsed_s=int(times.get("elapsed") or 0),
            exit_code=exit_code,
            gres_allocated=_tres_gres(tres.get("allocated")),
            gres_requested=_tres_gres(tres.get("requested")),
        ))
    return jobs
