"""From what Slurm shows (``sinfo``/``squeue --json``) to what the placement core reads.

One refresh gives a :class:`Snapshot`; :func:`translate` turns it into a :class:`View`: the
:class:`ClusterState` (usable nodes, the GPUs of running jobs, and of pending jobs a decision pinned
that Slurm has not started yet) and the jobs horusd keeps (its pending queue, rebuilt from the
``mode=kept`` tokens every refresh, so a restarted horusd finds its queue again). Pure: no Slurm
commands here (``slurm.queries`` reads, :mod:`slurm_horus.slurm.parse` parses).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Set

from ..errors import InputError
from ..hostlist import expand_hostlist
from ..jobclass import UNKNOWN_CLASS, job_class_of
from ..placement.request import JobRequest
from ..placement.state import ClassIndex, ClusterState, RunningJob
from ..slurm.gres import parse_gres
from ..slurm.partitions import Preemption
from ..tokens import FRACTION_MODE, KEPT_MODE, parse_gpu_list, parse_horus_tokens

RUNNING_STATES = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}
# squeue's state_reason of pending jobs that will not start soon (held, waiting on a job). A begin time
# on a placed job is horusd's own lease, lifted when it placed the job: squeue shows the old reason
# until slurmctld's next scheduling pass.
NOT_STARTING_SOON = ("JobHeld", "Dependency")
# ... of kept jobs horusd may not place now: held by a user or an admin, or waiting on another job
NOT_PLACEABLE = ("JobHeld", "Dependency")
DEFAULT_LIMIT_S = 3600.0


@dataclass
class Snapshot:
    """What one refresh read from Slurm (already parsed)."""

    nodes: list  # slurm.parse.NodeInfo
    jobs: list  # slurm.parse.QueueJob
    taken_at: float
    features: Dict[str, str] = field(default_factory=dict)  # node -> gpu type from its features
    preemption: Preemption = field(default_factory=Preemption)  # whose jobs Slurm may start by preempting
    slurm_version: object = None  # slurm.version.SlurmVersion the JSON named (None: unknown)


@dataclass
class KeptJob:
    """A pending job horusd keeps (its token says ``mode=kept``)."""

    job_id: str
    decision_id: str
    request: JobRequest
    admin_comment: str
    placeable: bool  # False: held or waiting on a dependency (its lease is still renewed)
    lease_end: float  # when Slurm may start it on its own (squeue's start_time: its begin time)


@dataclass
class View:
    state: ClusterState
    placed_tokens: Set[str]  # decision ids that squeue shows on placed jobs (any token but a kept one)
    kept: Dict[str, KeptJob]  # Slurm job id -> kept job
    kept_tokens: Set[str]  # decision ids of kept jobs squeue shows
    unshaped: Dict[str, str]  # Slurm job id -> decision id of kept jobs that ask for no GPU (to be given their shard back)
    pending_jobs: int  # jobs that wait for resources (not held, not waiting on another job)
    pending_gpus: int  # the GPUs (a shard: one) they ask for: the "pressure" of the policies
    unpinned: list = field(default_factory=list)  # pending GPU jobs nobody pinned: Slurm picks their GPUs


def node_gpu_count(node):
    return sum(item.count for item in node.gres if item.name == "gpu")


def node_shards_per_gpu(node, count):
    """Shards of each GPU of ``node`` (gres.conf ``Count=`` of its shard lines, shown by sinfo as the
    node's shard total); 0 when it has none."""
    total = sum(item.count for item in node.gres if item.name == "shard")
    return total // count if count else 0


def node_usable(node):
    state = (node.state or "").lower()
    flags = {f.upper() for f in node.state_flags}
    return state not in ("down", "drained", "draining", "drain", "fail", "future", "unknown") and \
        not flags & {"DRAIN", "DOWN", "FAIL", "NOT_RESPONDING"}


def global_gpu_ids(state, node_indices):
    """[(node name, per-node GPU indices)] -> sorted global GPU ids of ``state``; nodes it does not
    know (down, drained, without GPUs) and indices past a node's GPU count are skipped."""
    gpus = set()
    for node_name, indices in node_indices:
        node_id = state.node_ids.get(node_name)
        if node_id is None:
            continue
        node = state.nodes[node_id]
        gpus.update(node.first_gpu + i for i in indices if i < node.n_gpus)
    return tuple(sorted(gpus))


def limit_s(job):
    return job.time_limit * 60.0 if job.time_limit else None


def kept_request(job, job_class) -> Optional[JobRequest]:
    """The JobRequest of a kept job, from its kept shape: a shard (``gres:shard:1``: may share one
    GPU) or whole GPUs (``gres:gpu:N`` per node, or per job halfway through a move, mover.py), in
    either spelling (``gres/`` on 24.11+). None: it asks for no GPU (a shard move interrupted
    between its two updates)."""
    items = job.gres_requested
    shards = [item for item in items if item.name == "shard"]
    gpus = sum(item.count for item in items if item.name == "gpu")
    nodes = max(job.node_count, 1)
    if not items and job.tres_per_job:
        try:
            gpus = sum(item.count for item in parse_gres(job.tres_per_job) if item.name == "gpu") // nodes
        except InputError:
            gpus = 0
    if shards and not gpus:
        per_node, exclusive = 1, False
    elif gpus > 0:
        per_node, exclusive = gpus, True
    else:
        return None
    partitions = [p for p in (job.partition or "").split(",") if p]
    return JobRequest(str(job.job_id), job_class, gpus_per_node=per_node, nodes=nodes,
                      partition=partitions[0] if partitions else "", extra_partitions=tuple(partitions[1:]),
                      time_limit=limit_s(job), user=job.user, submit_time=float(job.submit_time or 0),
                      exclusive=exclusive)


def translate(snapshot: Snapshot, classes: ClassIndex, max_jobs_per_gpu=2, default_gpu_type="v100",
              gpu_memory_mb: Callable[[str], float] = lambda _t: 16384.0, needs_shards=False,
              expected_s: Optional[Callable[[str, str, Optional[float]], float]] = None) -> View:
    """The placement core's view of one snapshot (see the module docstring). ``needs_shards`` (the
    shard binding): nodes where Slurm offers no shards are left out. ``expected_s(user, job class,
    time limit in s)``: a job's expected run time (the duration estimator); a running job is expected
    to end that long after its start, never after Slurm's end time (start + limit)."""
    state = ClusterState(max_jobs_per_gpu=max_jobs_per_gpu, classes=classes)
    for node in snapshot.nodes:
        count = node_gpu_count(node)
        shards = node_shards_per_gpu(node, count)
        # after a backup controller took over, 22.05 showed typed shard counts of 0 (shard:g0:0) and
        # refused every shard job: the shard binding places nothing on a node that offers no shards
        if count == 0 or not node_usable(node) or (needs_shards and not shards):
            continue
        gpu_type = snapshot.features.get(node.name) or default_gpu_type
        state.add_node(node.name, gpu_type, count, gpu_memory_mb(gpu_type), node.partitions or ("default",),
                       **({"gpu_cap": shards} if shards else {}))
    state.build()
    view = View(state, set(), {}, set(), {}, 0, 0)
    now = snapshot.taken_at
    for job in snapshot.jobs:
        decision_id, fields = parse_horus_tokens(job.admin_comment)
        if decision_id and fields.get("mode") != KEPT_MODE:
            view.placed_tokens.add(decision_id)
        job_class = job_class_of(comment=job.comment, admin_comment=job.admin_comment)
        if job.state == "PENDING":
            if not job.state_reason.startswith(NOT_STARTING_SOON):  # held or dependent jobs are no pressure
                view.pending_jobs += 1
                view.pending_gpus += sum(item.count for item in job.gres_requested if item.name in ("gpu", "shard"))
            if decision_id and fields.get("mode") == KEPT_MODE:
                view.kept_tokens.add(decision_id)
                request = kept_request(job, job_class)
                if request is None:
                    view.unshaped[str(job.job_id)] = decision_id
                else:
                    view.kept[str(job.job_id)] = KeptJob(
                        str(job.job_id), decision_id, request, job.admin_comment or "",
                        placeable=not job.state_reason.startswith(NOT_PLACEABLE),
                        lease_end=float(job.start_time or 0))
                continue
            pinned = _pinned_pending_job(state, job, fields, job_class, now, expected_s)
            if pinned is not None:
                state.place(pinned)
            elif not fields.get("gpus") and not job.state_reason.startswith(NOT_STARTING_SOON):
                view.unpinned.append(job)
        elif job.state in RUNNING_STATES:
            running = _running_job(state, job, fields, job_class, now, expected_s)
            if running is not None:
                state.place(running)
    return view


def _running_job(state, job, fields, job_class, now, expected_s=None):
    by_node = job.gres_by_node()
    gpus = global_gpu_ids(state, [(node_name, item.indices) for node_name, items in by_node for item in items
                                  if item.name in ("gpu", "shard") and item.count > 0])
    if not gpus:
        return None
    holds_whole_gpu = any(item.name == "gpu" and item.count > 0 for _n, items in by_node for item in items)
    end = float(job.end_time) if job.end_time else now + DEFAULT_LIMIT_S
    if expected_s is not None and job.start_time:
        end = min(end, float(job.start_time) + expected_s(job.user, job_class, limit_s(job)))
    shards = [item.count for _n, items in by_node for item in items if item.name == "shard" and item.count > 0]
    return RunningJob(str(job.job_id), job_class, gpus, float(job.start_time or now), end,
                      exclusive=holds_whole_gpu, user=job.user, partition=job.partition,
                      gpu_units=_fraction_units(fields, shards, holds_whole_gpu))


def _fraction_units(fields, shards, holds_whole_gpu):
    """Shards a job holds of its one GPU as a fraction (capacity); 0 for whole GPUs and for the
    interference model's shared jobs (``mode=shared|shareable``: time-shared residents)."""
    if holds_whole_gpu or len(shards) != 1 or fields.get("mode") in ("shared", "shareable"):
        return 0
    return int(shards[0])


def reserve_where_slurm_starts(state, job, now):
    """Reserve, as exclusive, the GPUs Slurm will most likely give a pending GPU job horusd did not
    pin (a job array's tasks, a job with --nodelist or --exclusive, one left to Slurm), so that no
    job is pinned where it would wait behind it. The rule is cons_tres' first fit (the one
    ``placement/policies/slurm_default.py`` models): nodes in order (only those the job named, in its
    partition), on each the lowest free GPUs; one reservation per task that fits now. Call it after
    every pinned job and ledger entry is in ``state``."""
    per_node = sum(item.count for item in job.gres_requested if item.name == "gpu")
    if per_node < 1:
        return
    named = set(expand_hostlist(job.required_nodes)) if job.required_nodes else None
    partitions = set(job.partition.split(",")) if job.partition else None
    end = now + (job.time_limit * 60.0 if job.time_limit else 3600.0)
    for task in range(job.tasks):
        if state.n_free < per_node:
            return  # a full cluster (the common case under load) costs nothing to check
        for node_id, node in enumerate(state.nodes):
            if state.node_free[node_id] < per_node or (named is not None and node.name not in named) or \
                    (partitions and not partitions & set(node.partitions)):
                continue
            free = [g for g in range(node.first_gpu, node.first_gpu + node.n_gpus) if state.gpu_njobs[g] == 0]
            if len(free) >= per_node:
                state.place(RunningJob(f"{job.job_id}.slurm{task}", UNKNOWN_CLASS, tuple(free[:per_node]), now, end,
                                       exclusive=True, user=job.user, partition=job.partition))
                break
        else:
            return  # this task waits for GPUs to free: so do the ones after it


def _pinned_pending_job(state, job, fields, job_class, now, expected_s=None):
    """A queued job that a decision pinned (its token's ``gpus=``) holds those GPUs in our state
    until it runs: Slurm starts it there, and squeue showing its token has ended its ledger entry.
    Held or dependent jobs may wait for hours: they reserve nothing."""
    if not fields.get("gpus") or job.state_reason.startswith(NOT_STARTING_SOON):
        return None
    gpus = global_gpu_ids(state, parse_gpu_list(fields["gpus"]))
    if not gpus:
        return None
    run_s = expected_s(job.user, job_class, limit_s(job)) if expected_s is not None else limit_s(job) or DEFAULT_LIMIT_S
    shards = [item.count for item in job.gres_requested if item.name == "shard" and item.count > 0]
    return RunningJob(str(job.job_id), job_class, gpus, now, now + run_s,
                      exclusive=fields.get("mode") == "exclusive", user=job.user, partition=job.partition,
                      gpu_units=_fraction_units(fields, shards, False) if fields.get("mode") == FRACTION_MODE else 0)
