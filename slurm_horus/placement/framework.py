"""The placement pipeline: filter → score → select, in the style of the Kubernetes scheduling
framework (a policy is a few small plugins over a per-decision cycle state) and Slurm's cons_tres
(feasibility first, then ordering, then a selection strategy, each its own function).

A policy subclasses :class:`Policy` and overrides only what differs:

* ``queue_key(req)``: the queue order (FIFO or shortest-job-first are the two provided);
* ``filter_gpus(cycle)``: which GPUs may take the job (the shared cons_tres-style feasibility test
  covers partition, free/shareable, memory, jobs per GPU and predicted OOM);
* ``score_gpus(cycle)``: one number per feasible GPU, higher is better, ``-inf`` rejects a GPU;
* ``select(cycle)``: pick GPUs from the scores (first best GPU; for multi-GPU jobs the best nodes,
  each filled with its best GPUs, preferring one NVLink/PCIe group).

Everything is a numpy vector over the feasible GPUs; the per-GPU arrays of :class:`ClusterState`
make each decision O(number of GPUs) in C, not in Python.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .pairs import PairTable
from .request import Candidate, Decision, JobRequest
from .state import ClusterState, RunningJob

NEG_INF = -np.inf
NO_QUALIFYING_GPU = "no GPU qualifies under this policy"  # the pipeline's wait when some GPU scored


@dataclass
class SchedulingContext:
    """What the caller knows beyond the cluster: the clock and the queue."""

    now: float = 0.0
    n_waiting: int = 0  # jobs waiting, this one included
    waiting_gpus: int = 0  # GPUs those jobs ask for
    waiting_work: float = 0.0  # their predicted GPU-seconds
    extra: Dict[str, object] = field(default_factory=dict)


@dataclass
class Cycle:
    """Per-decision scratch state shared by the plugins (the framework's CycleState)."""

    state: ClusterState
    req: JobRequest
    ctx: SchedulingContext
    class_id: int
    idx: np.ndarray = None  # feasible GPU ids
    free: np.ndarray = None  # bool per idx: nobody there
    resident: np.ndarray = None  # class id of the first resident per idx (-1 when free)
    job_tput: np.ndarray = None  # predicted normalized throughput of the new job per idx
    res_tput: np.ndarray = None  # predicted throughput the resident keeps once joined
    score: np.ndarray = None
    notes: Dict[str, object] = field(default_factory=dict)
    feasible: "Feasible" = None  # idx with what decisions read of it, shared within a cycle (read-only)


class Feasible:
    """The feasible GPUs of a request (``filter_gpus``) and what decisions read of them, computed once
    per cluster version and request shape within a cycle: a cycle's decisions that place nothing
    leave the cluster as it was, so the next job of the same shape finds the same GPUs. Every array
    is read-only (shared by the cycle's decisions)."""

    def __init__(self, state: ClusterState, idx: np.ndarray):
        self.state = state
        self.idx = idx
        idx.flags.writeable = False
        self._resident = None
        self._first_free = None
        self._ends = None
        self._remaining = None
        self.memo: Dict[object, object] = {}  # what a policy found of this cluster version (its own keys)

    @property
    def resident(self) -> np.ndarray:
        """Class id of the first resident per feasible GPU (-1 when free)."""
        if self._resident is None:
            self._resident = self.state.gpu_class0[self.idx]
            self._resident.flags.writeable = False
        return self._resident

    @property
    def first_free(self) -> int:
        """Position in ``idx`` of the first free GPU, -1 when none is free."""
        if self._first_free is None:
            free = self.resident < 0
            self._first_free = int(np.argmax(free)) if free.any() else -1
        return self._first_free

    def end_range(self, n: int):
        """(lo, hi), one entry per class id below ``n``: the least and the greatest expected end of
        the first resident over the feasible GPUs that hold a job of that class (inf and -inf when
        none does). A pair test that is monotone, or convex piecewise linear, in the resident's
        remaining time passes on some GPU of a class only if it passes at one of these two ends."""
        if self._ends is None or len(self._ends[0]) < n:
            resident = self.resident
            busy = resident >= 0
            classes = resident[busy]
            ends = self.state.gpu_end0[self.idx[busy]]
            size = max(n, len(self.state.classes), int(classes.max()) + 1 if len(classes) else 0)
            lo, hi = np.full(size, np.inf), np.full(size, -np.inf)
            np.minimum.at(lo, classes, ends)
            np.maximum.at(hi, classes, ends)
            self._ends = (lo, hi)
        lo, hi = self._ends
        return lo[:n], hi[:n]

    def remaining(self, n: int, now: float):
        """(e_b, present): the remaining times ``max(end - now, 1)`` at the two ends of
        :meth:`end_range` (rows: least, greatest; one column per class id below ``n``), and whether
        any feasible GPU holds a job of the class."""
        if self._remaining is None or self._remaining[0] != (n, now):
            lo, hi = self.end_range(n)
            self._remaining = ((n, now), np.maximum(np.stack((lo, hi)) - now, 1.0), hi >= lo)
        return self._remaining[1], self._remaining[2]


class Policy:
    """Base policy: FIFO, exclusive, first fit (override the plugins to change any of it)."""

    name = "base"
    share = False  # may a job join a GPU that already runs something
    max_jobs_per_gpu = 2  # with sharing: at most this many jobs on one GPU
    lending = False  # may jobs use GPUs of their ``extra_partitions``
    comm_penalty = 0.05  # score lost per extra NVLink/PCIe group a multi-GPU job spans
    # whether a decision depends on the job's predicted duration (not only its class and shape):
    # callers may reuse a "does not fit" answer for an identical request while nothing changed
    uses_duration = False
    # whether ``queue_key`` reads the expected duration (the queue re-sorts a job whose estimate
    # moved); None: only the FIFO key here is known not to (:func:`queue_reads_duration`)
    queue_key_reads_duration: Optional[bool] = None
    # the simulator's reference: reads the true durations (and its pair table is the truth)
    perfect_knowledge = False
    # a sharing policy that reads the classes of the first waiting jobs (``ctx.extra["window"]``,
    # filled by the cycle only for those)
    reads_window = False

    def __init__(self, pairs: Optional[PairTable] = None, **options):
        self.pairs = pairs
        for key, value in options.items():
            if not hasattr(self, key):
                raise ValueError(f"policy {self.name}: unknown option {key!r}")
            setattr(self, key, value)

    # ---- queue order ----------------------------------------------------------------------------
    def queue_key(self, req: JobRequest):
        """Sort key of the waiting queue (smaller first). FIFO by submission."""
        return (req.submit_time, req.job_id)

    def order(self, queue: Sequence[JobRequest]) -> List[JobRequest]:
        return sorted(queue, key=self.queue_key)

    def pair_tables(self) -> List[PairTable]:
        return [self.pairs] if self.pairs is not None else []

    # ---- learning -------------------------------------------------------------------------------
    def observe(self, gpu_type: str, target: str, corunner: str, norm_tput: float):
        """A pair was measured on the cluster (finished jobs, NVML): refine the predictions."""
        if self.pairs is not None:
            self.pairs.observe(gpu_type, target, corunner, norm_tput)

    def counters(self) -> Dict[str, int]:
        """What the policy counted while it ran (the simulator's ``SimResult.runtime``)."""
        return {}

    def carry_over(self, old: "Policy"):
        """Keep what ``old`` learned while it ran and the history database does not hold: horusd builds
        a new policy at every reload (a refit reloads), the simulator keeps one for the whole trace, and
        live must not forget at a rebuild what the simulator remembers. Here: the workload of request
        shapes fragmentation is measured against. The pairs measured on the cluster come back from the
        history database instead (``service/history.History.local_pairs``)."""
        fragmentation, before = getattr(self, "fragmentation", None), getattr(old, "fragmentation", None)
        if fragmentation is not None and before is not None and fragmentation is not before:
            fragmentation.carry_over(before)

    def urgent_duration(self, state: ClusterState, ctx: SchedulingContext) -> float:
        """Waiting jobs predicted to run at least this long go first (inf: none; see horus)."""
        return math.inf

    def reclaim(self, state: ClusterState, req: JobRequest, ctx: SchedulingContext) -> list:
        """Running jobs to preempt (their ids) or shrink (:class:`~.elastic.Shrink`) so that ``req``
        can start (none by default)."""
        return []

    # ---- filter ---------------------------------------------------------------------------------
    def partitions_of(self, req: JobRequest) -> Sequence[str]:
        parts = [req.partition] if req.partition else []
        if self.lending and req.extra_partitions:
            parts += list(req.extra_partitions)
        return parts

    def filter_gpus(self, cycle: Cycle) -> np.ndarray:
        """cons_tres-style feasibility: a bool mask over all GPUs."""
        state, req = cycle.state, cycle.req
        njobs = state.gpu_njobs
        parts = self.partitions_of(req)
        if parts:
            mask = np.zeros(state.n_gpus, dtype=bool)
            for p in parts:
                pm = state.partition_mask.get(p)
                if pm is not None:
                    mask |= pm
        else:
            mask = np.ones(state.n_gpus, dtype=bool)
        types = (req.gpu_type,) if req.gpu_type else req.gpu_types
        if types:
            ids = [state.gpu_types.index(t) for t in types if t in state.gpu_types]
            if not ids:
                return np.zeros(state.n_gpus, dtype=bool)
            mask &= np.isin(state.gpu_type_id, ids)
        if req.cpu_milli > 0 or req.memory_mib > 0:
            mask &= state.node_room(req.cpu_milli, req.memory_mib)[state.gpu_node]
        if req.gpu_units > 0:
            # a fraction of one GPU: enough units left, whatever the policy (capacity is the rule)
            ok = (state.gpu_left() >= req.gpu_units) & ~state.gpu_exclusive
        else:
            ok = njobs == 0
        if req.mem_mb > 0:
            ok &= state.gpu_mem_total >= req.mem_mb
        if self.share and not req.exclusive and req.gpu_units == 0:
            limit = min(state.max_jobs_per_gpu, self.max_jobs_per_gpu)
            if limit > 1:
                # time sharing (the interference model) never joins a GPU that fractional jobs hold
                shareable = (njobs > 0) & (njobs < limit) & ~state.gpu_exclusive & (state.gpu_used == 0)
                if req.mem_mb > 0:
                    shareable &= state.gpu_mem_used + req.mem_mb <= state.gpu_mem_total
                ok |= shareable
        return mask & ok

    def _feasible(self, cycle: Cycle) -> Feasible:
        """The request's feasible GPUs: ``filter_gpus``, computed once per cluster version and
        request shape within a cycle (``ctx.extra``) unless the policy filters on its own."""
        state, req = cycle.state, cycle.req
        if type(self).filter_gpus is not Policy.filter_gpus or type(self).partitions_of is not Policy.partitions_of:
            return Feasible(state, np.flatnonzero(self.filter_gpus(cycle)))
        cache, shape = self._feasible_cache(state, req, cycle.ctx)
        found = cache.get(shape)
        if found is None:
            found = cache[shape] = Feasible(state, np.flatnonzero(self.filter_gpus(cycle)))
        return found

    def _feasible_cache(self, state: ClusterState, req: JobRequest, ctx: SchedulingContext):
        """(the cycle's Feasible per request shape for this cluster version, ``req``'s shape)."""
        extra = ctx.extra
        version = (id(self), id(state), state.version, self.share, self.max_jobs_per_gpu, self.lending)
        cache = extra.get("_feasible")
        if cache is None or cache[0] != version:
            cache = extra["_feasible"] = (version, {})
        shape = (req.partition, tuple(req.extra_partitions) if self.lending else (), req.gpu_type, tuple(req.gpu_types),
                 req.cpu_milli, req.memory_mib, req.gpu_units, req.mem_mb, req.exclusive)
        return cache[1], shape

    def cycle_feasible(self, state: ClusterState, req: JobRequest, ctx: SchedulingContext) -> Optional[Feasible]:
        """What :meth:`wait_reason` reads: the feasible GPUs of ``req``'s shape on this cluster version,
        as :meth:`decide` finds them (kept for the cycle's later decisions; found here, after decide's
        first steps, when no decision of this cycle needed them yet), when the decision's class is
        known and it asks for at least as many GPUs as there are (None: the class is new, too few
        GPUs, or the policy filters on its own)."""
        if type(self)._feasible is not Policy._feasible or type(self).filter_gpus is not Policy.filter_gpus \
                or type(self).partitions_of is not Policy.partitions_of or req.job_class not in state.classes.ids:
            return None
        cache, shape = self._feasible_cache(state, req, ctx)
        feasible = cache.get(shape)
        if feasible is None:
            state.build()  # as decide: the cluster's arrays, the pair tables on its classes
            for table in self.pair_tables():
                table.bind(state.classes)
            feasible = self._feasible(Cycle(state, req, ctx, state.classes.ids[req.job_class]))
        return feasible if len(feasible.idx) >= req.n_gpus else None

    def wait_reason(self, state: ClusterState, req: JobRequest, ctx: SchedulingContext) -> Optional[str]:
        """Why ``req`` must wait, when the policy knows it from the feasible GPUs of its shape on this
        cluster version (:meth:`cycle_feasible`; the reason :meth:`decide` would give); None: ask
        :meth:`decide`. The cycle asks this first (not when reclaiming or explaining); the base
        policy never knows."""
        return None

    def wait_epoch(self, state: ClusterState, ctx: SchedulingContext) -> Optional[tuple]:
        """What :meth:`wait_reason` reads besides the request, the cluster (this version of it) and the
        clock, as a token; None (the base policy): nothing is kept from one cycle to the next.

        A policy that gives a token promises that a wait its :meth:`wait_reason` answered stays a
        wait (:meth:`decide` places nothing) under an equal token, on the same cluster or one where
        more jobs were placed since (a placement only takes room: a free GPU becomes busy, a shared
        one full), at any later time, for any job of the same request (:func:`~.cycle.request_shape`
        less the duration) expected to run no shorter when the policy ``uses_duration``. The cycle
        then answers those without asking, from cycle to cycle until a job that leaves gives back
        room they could use (:meth:`waits_after_release`; the queue keeps them: a saturated queue
        is asked again at every arrival and after every start)."""
        return None

    def waits_after_token(self, state: ClusterState, ctx: SchedulingContext, old: tuple, new: tuple,
                          waits: dict) -> dict:
        """The kept waits (``KnownWaits``: request -> (least expected duration known to wait, stamp,
        a request asked)) answered under the token ``old`` (:meth:`wait_epoch`) that hold under
        ``new``, a different one. The base keeps none."""
        return {}

    def waits_after_release(self, state: ClusterState, ctx: SchedulingContext, waits: dict,
                            nodes: np.ndarray) -> dict:
        """The kept waits (``KnownWaits``: request -> (least expected duration known to wait, stamp,
        a request asked)) that still hold now that jobs left ``nodes`` (node ids), under the token
        :meth:`wait_epoch` gives now (the cycle checked it holds): a release gives room back on the
        nodes it leaves only, so a wait holds when those nodes, as they are now, could not change its
        answer. The base keeps none."""
        return {}

    def wait_stamp(self, req: JobRequest):
        """What else a wait of ``req`` reads that is not in :meth:`wait_epoch`'s token, as a value a
        kept wait is checked against (None: nothing; e.g. the measurements of the job's class)."""
        return None

    def node_mask(self, state: ClusterState, req: JobRequest) -> np.ndarray:
        """Nodes a CPU-only job may use: partition, CPUs and host memory."""
        parts = self.partitions_of(req)
        ok = state.node_room(req.cpu_milli, req.memory_mib)
        if parts:
            ok &= np.array([bool(set(parts) & set(node.partitions)) for node in state.nodes], dtype=bool)
        return ok

    def score_cpu_nodes(self, state: ClusterState, req: JobRequest, nodes: np.ndarray) -> np.ndarray:
        """Higher is better, one per candidate node of a CPU-only job; the default is first fit."""
        return np.zeros(len(nodes))

    def _decide_cpu_only(self, state: ClusterState, req: JobRequest) -> Decision:
        nodes = np.flatnonzero(self.node_mask(state, req))
        if len(nodes) == 0:
            return Decision(req.job_id, False, self.name, reason="no node has the CPUs and memory asked")
        score = self.score_cpu_nodes(state, req, nodes)
        best = int(nodes[int(np.argmax(score))])
        name = state.nodes[best].name
        return Decision(req.job_id, True, self.name, nodes=[name], gpus={name: []}, reason="CPU only",
                        n_feasible=len(nodes), cpu_node=best)

    def _fill_predictions(self, cycle: Cycle):
        state, idx = cycle.state, cycle.idx
        feasible = cycle.feasible
        resident = feasible.resident if feasible is not None and feasible.idx is idx else state.gpu_class0[idx]
        free = resident < 0
        cycle.free, cycle.resident = free, resident
        if self.pairs is None:
            # no model: sharing is a blind guess of half speed each
            cycle.job_tput = cycle.res_tput = np.where(free, 1.0, 0.5)
            return
        c = cycle.class_id
        if len(state.gpu_types) == 1:
            # row/column of the pair matrix with a trailing 1.0: index -1 (free GPU) reads "alone"
            mat = self.pairs.matrix(state.gpu_types[0])
            cycle.job_tput = np.append(mat[c], 1.0)[resident]
            cycle.res_tput = np.append(mat[:, c], 1.0)[resident]
            return
        types = state.gpu_type_id[idx]
        job_tput, res_tput = np.ones(len(idx)), np.ones(len(idx))
        for t in np.unique(types[~free]):
            mat = self.pairs.matrix(state.gpu_types[t])
            sel = (types == t) & ~free
            job_tput[sel] = mat[c, resident[sel]]
            res_tput[sel] = mat[resident[sel], c]
        cycle.job_tput, cycle.res_tput = job_tput, res_tput

    # ---- score ----------------------------------------------------------------------------------
    def score_gpus(self, cycle: Cycle) -> np.ndarray:
        """Higher is better; equal scores keep GPU order, so the default is first fit."""
        return np.zeros(len(cycle.idx))

    # ---- select ---------------------------------------------------------------------------------
    def select(self, cycle: Cycle) -> Optional[np.ndarray]:
        """Positions in ``cycle.idx`` of the chosen GPUs, or None to wait."""
        req = cycle.req
        score = cycle.score
        if req.n_gpus == 1:
            if len(score) == 0:
                return None
            best = int(np.argmax(score))
            return None if score[best] == NEG_INF else np.array([best])
        return self._select_multi(cycle)

    def _select_multi(self, cycle: Cycle) -> Optional[np.ndarray]:
        state, req = cycle.state, cycle.req
        k = req.gpus_per_node
        n = state.n_gpus
        table = state.node_gpu_table
        if k > table.shape[1]:
            return None
        usable = cycle.score > NEG_INF
        # only nodes with at least k usable GPUs are worth sorting
        nodes = nodes_holding(state, cycle.idx[usable], k)
        if len(nodes) < req.nodes:
            return None
        full = np.full(n + 1, NEG_INF)  # last slot: padding of short nodes
        # a GPU whose switch group has more usable GPUs ranks first at equal score, so the chosen
        # GPUs of a node span as few NVLink/PCIe groups as possible
        groups = state.gpu_group[cycle.idx]
        usable_per_group = np.bincount(groups[usable], minlength=state.n_groups)
        full[cycle.idx] = cycle.score + 1e-3 * usable_per_group[groups]
        rows = table[nodes]
        padded = np.where(rows >= 0, rows, n)
        node_scores = full[padded]
        if len(nodes) > 4 * req.nodes:
            # rank nodes by their k best scores first; only the best few get the exact,
            # group-aware evaluation below (sorting every node's GPUs costs more than it decides)
            top_sorted = -np.sort(-node_scores, axis=1)[:, :k]
            rough = top_sorted[:, -1] + top_sorted.mean(axis=1)
            keep = np.argpartition(-rough, 4 * req.nodes - 1)[:4 * req.nodes]
            keep.sort()  # node order breaks ties: first fit
            padded, node_scores = padded[keep], node_scores[keep]
        order = np.argsort(-node_scores, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(node_scores, order, axis=1)
        chosen_gpus = np.take_along_axis(padded, order, axis=1)
        if k > 1:
            spans = 1 + (np.diff(np.sort(state.gpu_group[chosen_gpus], axis=1), axis=1) != 0).sum(axis=1)
        else:
            spans = np.ones(len(chosen_gpus))
        node_value = top.min(axis=1) + top.mean(axis=1) - self.comm_penalty * (spans - 1)
        best = np.argsort(-node_value, kind="stable")[:req.nodes]
        return np.searchsorted(cycle.idx, chosen_gpus[best].ravel())  # idx is sorted (flatnonzero)

    # ---- the pipeline ---------------------------------------------------------------------------
    def decide(self, state: ClusterState, req: JobRequest, ctx: Optional[SchedulingContext] = None,
               explain: bool = False) -> Decision:
        state.build()
        for table in self.pair_tables():
            table.bind(state.classes)
        ctx = ctx or SchedulingContext()
        if req.n_gpus == 0:
            return self._decide_cpu_only(state, req)
        cycle = Cycle(state, req, ctx, state.classes.id(req.job_class))
        cycle.feasible = self._feasible(cycle)
        cycle.idx = cycle.feasible.idx
        if len(cycle.idx) < req.n_gpus:
            return Decision(req.job_id, False, self.name, reason="not enough free or shareable GPUs",
                            n_feasible=len(cycle.idx))
        if not explain:
            quick = self.decide_quickly(cycle)
            if quick is not None:
                return quick
        self._fill_predictions(cycle)
        # a predicted 0 means the pair cannot run together (memory): never a candidate
        cycle.score = np.where(cycle.job_tput > 0, self.score_gpus(cycle), NEG_INF)
        chosen = self.select(cycle)
        cands = self._candidates(cycle) if explain else []
        if chosen is None:
            reason = cycle.notes.get("wait_reason", NO_QUALIFYING_GPU)
            return Decision(req.job_id, False, self.name, reason=str(reason), candidates=cands,
                            n_feasible=len(cycle.idx))
        return self._decision(cycle, chosen, cands)

    def decide_quickly(self, cycle: Cycle) -> Optional[Decision]:
        """A shortcut to the pipeline's answer (never a different one), or None to run the pipeline.

        Called after the filter, when no explanation is asked; a policy whose rule allows it can find
        the GPU the pipeline would select without scoring every feasible GPU (see horus)."""
        return None

    def _decision_at(self, cycle: Cycle, positions: Sequence[int]) -> Decision:
        """The Decision for the GPUs at ``positions`` of ``cycle.idx``: predictions are filled for
        those GPUs only (what :meth:`decide_quickly` needs)."""
        n_feasible = len(cycle.idx)
        cycle.idx = cycle.idx[np.asarray(positions)]
        self._fill_predictions(cycle)
        decision = self._decision(cycle, np.arange(len(cycle.idx)), [])
        decision.n_feasible = n_feasible
        return decision

    def _decision(self, cycle: Cycle, chosen: np.ndarray, cands: List[Candidate]) -> Decision:
        state, req = cycle.state, cycle.req
        gpu_ids = tuple(int(g) for g in cycle.idx[chosen])
        gpus: Dict[str, List[int]] = {}
        corunners: Dict[str, float] = {}
        shared = False
        job_tput = 1.0
        for pos, g in zip(chosen, gpu_ids):
            node = state.nodes[state.gpu_node[g]].name
            gpus.setdefault(node, []).append(int(state.gpu_index[g]))
            if not cycle.free[pos]:
                shared = True
                job_tput = min(job_tput, float(cycle.job_tput[pos]))
                for other in state.gpu_jobs[g]:
                    corunners[other] = min(corunners.get(other, 1.0), float(cycle.res_tput[pos]))
        reason = cycle.notes.get("reason") or ("joins a running job" if shared else "a free GPU")
        return Decision(req.job_id, True, self.name, nodes=list(gpus), gpus=gpus, gpu_ids=gpu_ids,
                        shared=shared, predicted_norm_tput=job_tput,
                        predicted_slowdown=(1.0 / job_tput) if job_tput > 0 else math.inf,
                        corunner_norm_tput=corunners, reason=str(reason), candidates=cands,
                        n_feasible=len(cycle.idx))

    def _candidates(self, cycle: Cycle, limit: int = 8) -> List[Candidate]:
        if cycle.score is None or len(cycle.idx) == 0:
            return []
        top = np.argsort(-cycle.score, kind="stable")[:limit]
        out = []
        for pos in top:
            g = int(cycle.idx[pos])
            resident = int(cycle.resident[pos])
            note = "free" if resident < 0 else f"with {cycle.state.classes.names[resident]}"
            out.append(Candidate(cycle.state.gpu_label(g), float(cycle.score[pos]), resident >= 0,
                                 float(cycle.job_tput[pos]), note,
                                 float(cycle.res_tput[pos]) if resident >= 0 else 1.0))
        return out

    # ---- applying a decision --------------------------------------------------------------------
    def running_job(self, req: JobRequest, decision: Decision, now: float) -> RunningJob:
        """The decision is applied: the job runs. Its record is :meth:`job_record`'s; a policy that
        learns from what runs (the workload FGD measures against, exploration counts) hooks here."""
        return self.job_record(req, decision, now)

    def job_record(self, req: JobRequest, decision: Decision, now: float) -> RunningJob:
        """The RunningJob record for a placed decision (expected end from the predictions), without
        any side effect (horusd's joint offers place such records as phantoms)."""
        tput = decision.predicted_norm_tput if decision.predicted_norm_tput > 0 else 1.0
        return RunningJob(req.job_id, req.job_class, decision.gpu_ids, now,
                          now + req.expected_duration() / tput, exclusive=req.exclusive,
                          mem_mb=req.mem_mb, user=req.user, partition=req.partition,
                          gpu_units=req.gpu_units, cpu_milli=req.cpu_milli, memory_mib=req.memory_mib,
                          node=decision.cpu_node)


def queue_reads_duration(policy: "Policy") -> bool:
    """Whether ``policy``'s queue order may move when a waiting job's expected duration does: what the
    policy says (``queue_key_reads_duration``), else False only for the FIFO key of :class:`Policy`."""
    says = policy.queue_key_reads_duration
    return type(policy).queue_key is not Policy.queue_key if says is None else bool(says)


class SJFMixin:
    """Shortest (predicted) job first; ties by submission."""

    def queue_key(self, req: JobRequest):
        return (req.expected_duration(), req.submit_time, req.job_id)


def shareable_gpus(state: ClusterState, max_jobs_per_gpu: int, gpus=slice(None)) -> np.ndarray:
    """Per GPU (of ``gpus``, any index; all by default): whether it runs a job another may join at all
    (room for one more, nobody exclusive, no fraction of it held): what a policy's filter allows to
    share, before partitions and memory."""
    njobs = state.gpu_njobs[gpus]
    return (njobs > 0) & (njobs < min(state.max_jobs_per_gpu, max_jobs_per_gpu)) & ~state.gpu_exclusive[gpus] \
        & (state.gpu_used[gpus] == 0)


def kept_after_release(state: ClusterState, waits: dict, nodes: np.ndarray, max_jobs_per_gpu: int, now: float,
                       gpu_limits, margin: float = 0.0) -> dict:
    """:meth:`Policy.waits_after_release` for a policy whose waits all say that fewer than ``nodes``
    nodes hold ``gpus_per_node`` feasible GPUs the job may take (one GPU: none at all), a GPU it may
    take being a free one or a shared one whose limit (the E_a below which a job of its class may join
    that resident; ``gpu_limits(req, class id, resident class ids, remaining times max(end − now,
    1))``) is above the job's E_a less ``margin`` of it — horus, sjf-bsbf, iasp-iapp (whose limits
    are inf or 0: its E_a is 0). A limit at a later time is no greater (e_b only shrinks): under the
    token, off the released nodes such GPUs only became fewer. A wait holds when no released node
    holds as many GPUs that may take a job of its class at the least E_a known to wait; counted
    wider than the policies' filter (partitions, memory and CPUs not checked), so only waits that
    surely hold are kept."""
    table = state.node_gpu_table[nodes]
    valid = table >= 0
    gpus = np.where(valid, table, 0)
    njobs = state.gpu_njobs[gpus]
    free = valid & (njobs == 0)
    shared = valid & shareable_gpus(state, max_jobs_per_gpu, gpus)
    most_free = int(free.sum(axis=1).max()) if len(nodes) else 0
    most_open = int((free | shared).sum(axis=1).max()) if len(nodes) else 0
    residents = state.gpu_class0[gpus[shared]]
    e_b = np.maximum(state.gpu_end0[gpus[shared]] - now, 1.0)
    ids = state.classes.ids
    kept, found, most = {}, {}, {}
    for request, value in waits.items():
        req = value[2]
        k = req.gpus_per_node
        if k > most_open:
            kept[request] = value  # no released node has that many GPUs with room
            continue
        c = ids.get(req.job_class)
        if k <= most_free or c is None:
            continue  # free GPUs enough on a released node: ask again
        key = (c, req.n_gpus == 1)
        at = (key, value[0] * (1.0 - margin))
        usable = most.get(at)  # the most GPUs a released node has for that class at that E_a
        if usable is None:
            limits = found.get(key)
            if limits is None:
                limits = found[key] = np.where(free, np.inf, 0.0)
                limits[shared] = gpu_limits(req, c, residents, e_b)
            usable = most[at] = int((limits > at[1]).sum(axis=1).max())
        if usable < k:
            kept[request] = value
    return kept


def nodes_holding(state: ClusterState, gpu_ids: np.ndarray, k: int) -> np.ndarray:
    """The nodes holding at least ``k`` of ``gpu_ids``: where a request for ``k`` GPUs per node may go
    (a multi-GPU select's first step, and the waits that foresee it)."""
    return np.flatnonzero(np.bincount(state.gpu_node[gpu_ids], minlength=len(state.nodes)) >= k)


def pressure(cycle: Cycle) -> bool:
    """More GPUs wanted by the queue than free: a free GPU is worth keeping for someone else."""
    return cycle.ctx.waiting_gpus > cycle.state.n_free
