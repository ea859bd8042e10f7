"""The scheduling cycle: one pass over the pending queue, shared by the simulator and horusd.

A cycle is what a scheduler does when the cluster changes (a job ends, a job arrives, a claim, a
refresh): walk the waiting jobs in the policy's order and start those the policy places now. It is
Slurm's main scheduling loop in miniature, with the Kubernetes scheduling framework's per-cycle
state; the policy decides one job at a time (:meth:`Policy.decide`), the cycle decides *which* jobs
it is asked about and in what order:

* **queue order** — the policy's ``queue_key`` (FIFO, shortest expected job first...);
* **makespan guard** — jobs whose expected duration reaches the policy's ``urgent_duration`` go
  first, longest first (the tail of a burst must not leave the longest jobs alone at the end);
* **window** — sharing policies see the classes of the first ``window`` waiting jobs
  (``ctx.extra["window"]``), so a free slot can be kept for a better partner;
* **queue depth** — at most ``queue_depth`` decisions per cycle (Slurm's ``default_queue_depth``);
* **equivalence cache** — a request identical to one that did not fit since the last start is not
  asked again (the scheduling framework's equivalence class cache);
* **reclaim** — a job the policy cannot place may have running jobs preempted for it, or shrunk
  (:class:`~.elastic.Shrink`: an elastic job gives some GPUs back and keeps running; DeepBoot);
* **slowdown limit** — a site's cap on a pair's predicted slowdown (horusd's ``slowdown_limit``):
  a shared placement predicted to slow the job more is not made, and the job waits (``max_slowdown``;
  the simulator applies it only when asked, so that it measures the site's setting too);
* **context** — the clock, the number of waiting jobs, the GPUs and GPU-seconds they ask for.

The cycle is pure: it reads a :class:`ClusterState` and a :class:`PendingQueue` and reports what to
start through the caller's ``start`` callback, which applies a decision (the simulator checks the
truth and places the job; horusd records it and moves the Slurm job there). A caller that cannot
start a job says so, and the job stays queued.
"""

import bisect
import itertools

import numpy as np
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from .elastic import Shrink
from .framework import Policy, SchedulingContext
from .request import Decision, JobRequest
from .state import ClusterState


@dataclass
class CycleOptions:
    queue_depth: int = 100  # most jobs a cycle asks the policy about (Slurm's default_queue_depth)
    window: int = 64  # waiting jobs whose classes a sharing policy may look at (partner choice)
    max_slowdown: Optional[float] = None  # a shared placement predicted slower than this waits (None: no cap)


class PendingQueue:
    """Jobs waiting for GPUs, kept sorted in the policy's queue order, with the totals a cycle needs.

    Job ids are unique; adding a job that is already queued replaces it (horusd re-reads its queue
    from squeue). ``gpus`` and ``work`` are the GPUs and expected GPU-seconds of all waiting jobs.

    Removing a job takes its key out of the sorted list only when the list is next read: a job taken
    out and put back with the same key meanwhile (a duration estimate refreshed without changing a
    FIFO order, a squeue re-read) costs two dictionary operations instead of two shifts of a list of
    thousands.
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        self._keys: List[tuple] = []  # sorted (policy key, job id); may still hold the keys in _gone
        self._gone: Dict[str, tuple] = {}  # job id -> key removed from _jobs, not yet from _keys
        self._jobs: Dict[str, Tuple[tuple, JobRequest]] = {}
        self.gpus = 0
        self.work = 0.0

    def add(self, req: JobRequest):
        if req.job_id in self._jobs:
            self.remove(req.job_id)
        key = (self.policy.queue_key(req), req.job_id)
        old = self._gone.pop(req.job_id, None)
        if old != key:
            if old is not None:
                del self._keys[bisect.bisect_left(self._keys, old)]
            bisect.insort(self._keys, key)
        self._jobs[req.job_id] = (key, req)
        n = req.gpus_per_node * req.nodes
        self.gpus += n
        self.work += req.expected_duration() * n

    def remove(self, job_id: str) -> Optional[JobRequest]:
        found = self._jobs.pop(job_id, None)
        if found is None:
            return None
        key, req = found
        self._gone[job_id] = key
        n = req.gpus_per_node * req.nodes
        self.gpus -= n
        self.work -= req.expected_duration() * n
        if not self._jobs:
            self.gpus, self.work = 0, 0.0  # no float drift across an empty queue
            self._keys, self._gone = [], {}
        return req

    def _flush(self) -> List[tuple]:
        """The sorted keys of the waiting jobs only (removals applied)."""
        if self._gone:
            keys = self._keys
            for key in self._gone.values():
                del keys[bisect.bisect_left(keys, key)]
            self._gone.clear()
        return self._keys

    def live_keys(self) -> List[tuple]:
        """The keys of the waiting jobs, in queue order (a new list)."""
        return list(self._flush())

    def get(self, job_id: str) -> Optional[JobRequest]:
        found = self._jobs.get(job_id)
        return found[1] if found else None

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobRequest]:
        """Waiting jobs in queue order."""
        jobs = self._jobs
        return (jobs[key[1]][1] for key in self.live_keys())

    def head(self, n: int) -> List[JobRequest]:
        jobs = self._jobs
        return [jobs[key[1]][1] for key in self._flush()[:n]]


@dataclass
class CycleResult:
    started: List[Tuple[JobRequest, Decision]] = field(default_factory=list)
    preempted: List[str] = field(default_factory=list)  # running job ids the policy reclaimed
    shrunk: List[Shrink] = field(default_factory=list)  # GPUs taken back from running elastic jobs
    tried: int = 0  # decisions asked of the policy
    waiting: Dict[str, str] = field(default_factory=dict)  # job id -> why it still waits (tried ones)


def has_room(state: ClusterState, policy: Policy) -> bool:
    """Whether any job could start now: a free GPU, or (sharing policies) a GPU with a free slot."""
    if state.n_free > 0:
        return True
    if ((state.gpu_nplain == 0) & (state.gpu_used > 0) & (state.gpu_used < state.gpu_cap)).any():
        return True  # a fraction of a GPU is left
    return policy.share and bool((state.gpu_njobs < min(state.max_jobs_per_gpu, policy.max_jobs_per_gpu)).any())


def nodes_with_room(state: ClusterState, policy: Policy) -> "np.ndarray":
    """Per node: how many of its GPUs could take one more job under ``policy`` at all (free, or with
    a free slot and no exclusive job). Partitions and memory only remove GPUs from this."""
    limit = min(state.max_jobs_per_gpu, policy.max_jobs_per_gpu) if policy.share else 1
    if limit <= 1:
        return state.node_free
    njobs = state.gpu_njobs
    open_gpu = (njobs == 0) | ((njobs < limit) & ~state.gpu_exclusive)
    return np.bincount(state.gpu_node[open_gpu], minlength=len(state.nodes))


def may_reclaim(policy: Policy) -> bool:
    return type(policy).reclaim is not Policy.reclaim


def reclaim_for(state: ClusterState, policy: Policy, req: JobRequest, ctx: SchedulingContext, failed: Decision,
                preempt: Callable[[str], None], shrink: Optional[Callable[[Shrink], None]] = None,
                explain: bool = False, result: Optional[CycleResult] = None) -> Decision:
    """The reclaim step of the cycle, for a request the policy could not place (``failed``, returned
    as it is when there is nothing to reclaim): the policy names
    victims (``Policy.reclaim``: job ids, or :class:`~.elastic.Shrink`), each is preempted or shrunk
    through the caller's callbacks (a Shrink is a whole preemption without ``shrink``), and the policy
    decides again. The simulator's cycle and horusd (whose preemptions Slurm carries out) both reclaim
    here, so they take the same decision. The victims go to ``result`` when given."""
    victims = policy.reclaim(state, req, ctx)
    if not victims:
        return failed
    for victim in victims:
        if isinstance(victim, Shrink) and shrink is not None:
            shrink(victim)
            if result is not None:
                result.shrunk.append(victim)
        else:
            victim = victim.job_id if isinstance(victim, Shrink) else victim
            preempt(victim)
            if result is not None:
                result.preempted.append(victim)
    return policy.decide(state, req, ctx, explain=explain)


def cycle_order(state: ClusterState, policy: Policy, queue: PendingQueue,
                ctx: SchedulingContext) -> List[JobRequest]:
    """The waiting jobs in the order this cycle asks about them: queue order, except that jobs
    reaching the policy's ``urgent_duration`` (the makespan guard) go first, longest first."""
    return [req for req in _walk(state, policy, queue, ctx) if req is not None]


def _walk(state: ClusterState, policy: Policy, queue: PendingQueue,
          ctx: SchedulingContext) -> Iterator[Optional[JobRequest]]:
    """:func:`cycle_order`, lazily: a cycle asks about ``queue_depth`` jobs, not the whole queue.

    The order is fixed now (a snapshot of the queue, the guard's threshold); a job that has left the
    queue by the time the walk reaches it comes out as None.
    """
    keys = queue.live_keys()  # the cycle removes the jobs it starts: walk a snapshot
    jobs = queue._jobs
    k = len(keys)
    if type(policy).urgent_duration is not Policy.urgent_duration and keys:
        # the queue is in SJF order for policies with a guard, so the urgent jobs sit at its end
        threshold = policy.urgent_duration(state, ctx)
        while k > 0 and jobs[keys[k - 1][1]][1].expected_duration() >= threshold:
            k -= 1
    positions = itertools.chain(range(len(keys) - 1, k - 1, -1), range(k))
    return ((found[1] if found is not None and found[0] == keys[i] else None)
            for i, found in ((i, jobs.get(keys[i][1])) for i in positions))


def run_cycle(state: ClusterState, policy: Policy, queue: PendingQueue, now: float,
              start: Callable[[JobRequest, Decision], bool],
              preempt: Optional[Callable[[str], None]] = None,
              options: Optional[CycleOptions] = None, explain: bool = False,
              shrink: Optional[Callable[[Shrink], None]] = None) -> CycleResult:
    """One scheduling pass over ``queue`` at time ``now``.

    ``start(req, decision)`` applies a placed decision; it returns True when the job left the queue
    (it started, or the caller requeues it on its own later, e.g. after a simulated OOM), False when
    it could not be applied (the job stays queued). A started job must be in ``state`` when
    ``start`` returns: the next decision of the cycle sees it. ``preempt(job_id)`` takes a running job
    off its GPUs (and requeues it, if the caller wants it back) when the policy reclaims GPUs; without
    it, nothing is reclaimed. ``shrink(Shrink)`` takes some GPUs from a running elastic job, which
    keeps the rest; a caller without it preempts the whole job instead.
    """
    options = options or CycleOptions()
    result = CycleResult()
    reclaiming = preempt is not None and may_reclaim(policy)
    if not queue or (not has_room(state, policy) and not reclaiming):
        return result
    ctx = SchedulingContext(now, len(queue), queue.gpus, queue.work)
    order = _walk(state, policy, queue, ctx)
    if policy.share:
        classes = state.classes
        ctx.extra["window"] = [classes.id(req.job_class) for req in queue.head(options.window)]
    failed = set()  # request shapes that did not fit since the last start (equivalence cache)
    with_duration = policy.uses_duration
    # a multi-GPU job needs ``nodes`` nodes with ``gpus_per_node`` GPUs that can take a job: when too
    # few nodes have them, every policy's pipeline answers "wait" (its filter and select only narrow
    # this down), so the answer is given without running it (the count is redone after a start)
    roomy: Dict[int, int] = {}  # gpus_per_node -> nodes with that many GPUs with room
    prune = not reclaiming and not explain
    width = state.node_gpu_table.shape[1]
    for req in order:
        if result.tried >= options.queue_depth:
            break
        if req is None:
            continue  # a reclaim or the caller took it out meanwhile
        if not policy.share and req.gpu_units == 0 and req.n_gpus > state.n_free and not reclaiming:
            continue
        shape = (req.job_class, req.gpus_per_node, req.nodes, req.partition, req.extra_partitions, req.mem_mb,
                 req.exclusive, req.gpu_units, req.cpu_milli, req.memory_mib, req.gpu_type, req.gpu_types,
                 req.expected_duration() if with_duration else 0.0)
        if shape in failed:
            continue
        result.tried += 1
        k = req.gpus_per_node
        if prune and req.nodes * k > 1:
            if k not in roomy:
                roomy[k] = 0 if k > width else int((nodes_with_room(state, policy) >= k).sum())
            if roomy[k] < req.nodes:
                failed.add(shape)
                result.waiting[req.job_id] = "not enough nodes with free or shareable GPUs"
                state.classes.id(req.job_class)  # as a decision would: the class is known from now on
                continue
        decision = policy.decide(state, req, ctx, explain=explain)
        if not decision.placed and reclaiming:
            decision = reclaim_for(state, policy, req, ctx, decision, preempt, shrink, explain, result)
        if decision.placed and options.max_slowdown is not None and decision.shared \
                and decision.predicted_slowdown > options.max_slowdown:
            decision = Decision(req.job_id, False, decision.policy,
                                reason=f"predicted slowdown {decision.predicted_slowdown:.2f} over the limit",
                                n_feasible=decision.n_feasible)
        if not decision.placed:
            failed.add(shape)
            result.waiting[req.job_id] = decision.reason
        elif start(req, decision):
            failed.clear()
            roomy.clear()
            queue.remove(req.job_id)
            result.started.append((req, decision))
            ctx.n_waiting -= 1
            ctx.waiting_gpus -= req.n_gpus
            ctx.waiting_work -= req.expected_duration() * req.n_gpus
        if not has_room(state, policy) and not reclaiming:
            break
    return result

