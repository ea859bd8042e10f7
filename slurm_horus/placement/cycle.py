"""The scheduling cycle: one pass over the pending queue, shared by the simulator and horusd.

A cycle is what a scheduler does when the cluster changes (a job ends, a job arrives, a claim, a
refresh): walk the waiting jobs in the policy's order and start those the policy places now. It is
Slurm's main scheduling loop in miniature, with the Kubernetes scheduling framework's per-cycle
state; the policy decides one job at a time (:meth:`Policy.decide`), the cycle decides *which* jobs
it is asked about and in what order:

* **queue order** — the policy's ``queue_key`` (FIFO, shortest expected job first...);
* **makespan guard** — jobs whose expected duration reaches the policy's ``urgent_duration`` go
  first, longest first (the tail of a burst must not leave the longest jobs alone at the end);
* **window** — sharing policies that ask (``reads_window``) see the classes of the first
  ``window`` waiting jobs (``ctx.extra["window"]``), so a free slot can be kept for a better partner;
* **queue depth** — at most ``queue_depth`` decisions per cycle (Slurm's ``default_queue_depth``);
  jobs passed over without asking the policy do not count (Slurm counts every job its main loop
  tests; counting them here starved small jobs behind a head of large ones: slurm-default's mean
  JCT 2.4 times worse on the 82k-job Philly table at load 6, since the simulator has no backfill
  pass to start them — docs/simulator.md);
* **equivalence cache** — a request identical to one that did not fit since the last start is not
  asked again (the scheduling framework's equivalence class cache; Slurm's main scheduler likewise
  skips a job whose resource request already failed in this pass);
* **known waits** — a wait the policy answered from the feasible GPUs (``wait_reason``)
  is kept by the queue until a job that leaves the cluster gives back room it could use
  (:class:`KnownWaits`, ``Policy.waits_after_release``): a later question, in
  this cycle or a later one, about a job of the same request expected to run no shorter is answered
  from it without asking, when the policy's ``wait_epoch`` says what else its waits read (a
  saturated queue is asked again at every arrival and after every start);
* **free capacity** — a cycle stops as soon as no job could start at all (no free GPU, no slot a
  sharing policy could use), checked again only when the cluster changed; an exclusive policy's
  cycle walks only the jobs that ask for at most the free GPUs (the queue keeps one sorted list
  per request size), since it passes over the others without asking;
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
import functools
import heapq
import itertools
import operator

import numpy as np
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from .elastic import Shrink
from .framework import Policy, SchedulingContext, queue_reads_duration
from .request import Decision, JobRequest, SharedEstimate
from .state import ClusterState


@dataclass
class CycleOptions:
    queue_depth: int = 100  # most waiting jobs a cycle examines (Slurm's default_queue_depth)
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

    A cycle walks a :meth:`snapshot` of the sorted keys, which is the list itself until the queue
    next changes its order (copy on write) or the cycle ends: a cycle that only starts jobs copies
    nothing. The keys are also kept sorted per request geometry (GPUs per node, nodes; (0, 0) for a
    fraction of a GPU), so that an exclusive policy's cycle walks only the jobs that may fit the free
    GPUs, and a cycle can leave out a geometry that cannot start now.
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        # a job's key and shape stay when its estimate moves (FIFO order, no decision reads it)
        self._fixed_keys = not queue_reads_duration(policy) and not policy.uses_duration
        self._keys: List[tuple] = []  # sorted (policy key, job id); may still hold the keys in _gone
        self._by_size: Dict[tuple, List[tuple]] = {}  # request geometry -> its jobs' keys, sorted (as _keys)
        self._gone: Dict[str, Tuple[tuple, tuple]] = {}  # job id -> (key, geometry) removed from _jobs, not yet from the lists
        # job id -> [its key in the lists, its key now, geometry]: re-keyed (a new estimate), the
        # lists not yet moved; moved together when next read or changed (:meth:`_apply_moves`)
        self._moves: Dict[str, list] = {}
        self._jobs: Dict[str, Tuple[tuple, JobRequest, int]] = {}  # job id -> (key, request, shape id)
        # request shapes (:func:`request_shape`) of the waiting jobs: shape -> its id, id -> jobs of it
        self._shape_ids: Dict[tuple, int] = {}
        self._shapes: Dict[int, list] = {}  # id -> [waiting jobs of it, the shape]
        self._next_shape = 0
        self._lent = False  # the lists are held by a snapshot: copy them before changing them
        self.known_waits = KnownWaits()  # the policy's waits, from cycle to cycle (the cycle's)
        self.gpus = 0
        self.work = 0.0

    @staticmethod
    def _size(req: JobRequest) -> tuple:
        """The request's geometry: (GPUs per node, nodes), (0, 0) for a fraction of one GPU."""
        return (0, 0) if req.gpu_units > 0 else (req.gpus_per_node, req.nodes)

    def _own(self):
        if self._lent:
            self._keys = list(self._keys)
            self._by_size = {size: list(keys) for size, keys in self._by_size.items()}
            self._lent = False

    def _insert(self, key: tuple, size: tuple):
        bisect.insort(self._keys, key)
        keys = self._by_size.get(size)
        if keys is None:
            keys = self._by_size[size] = []
        bisect.insort(keys, key)

    def _delete(self, key: tuple, size: tuple):
        keys = self._keys
        del keys[bisect.bisect_left(keys, key)]
        keys = self._by_size[size]
        del keys[bisect.bisect_left(keys, key)]

    def add(self, req: JobRequest):
        if self._moves:
            self._apply_moves()
        if req.job_id in self._jobs:
            self.remove(req.job_id)
        key = (self.policy.queue_key(req), req.job_id)
        size = self._size(req)
        old = self._gone.pop(req.job_id, None)
        if old != (key, size):
            self._own()
            if old is not None:
                self._delete(*old)
            self._insert(key, size)
        self._jobs[req.job_id] = (key, req, self._count_shape(req))
        n = req.gpus_per_node * req.nodes
        shared = req.shared_estimate
        if shared is not None:
            shared.jobs += 1
            shared.gpus += n
        self.gpus += n
        self.work += req.expected_duration() * n

    def remove(self, job_id: str) -> Optional[JobRequest]:
        if self._moves:
            self._apply_moves()
        found = self._jobs.pop(job_id, None)
        if found is None:
            return None
        key, req, sid = found
        self._drop_shape(sid)
        self._gone[job_id] = (key, self._size(req))
        n = req.gpus_per_node * req.nodes
        self.gpus -= n
        self.work -= req.expected_duration() * n
        shared = req.shared_estimate
        if shared is not None:  # it leaves with the estimate it carries now
            shared.jobs -= 1
            shared.gpus -= n
            req.predicted_duration, req.duration_sigma, req.shared_estimate = shared.seconds, shared.sigma, None
        if not self._jobs:
            self.gpus, self.work = 0, 0.0  # no float drift across an empty queue
            self._keys, self._by_size, self._gone, self._lent, self._moves = [], {}, {}, False, {}
            self._shapes, self._shape_ids = {}, {}
        return req

    def _count_shape(self, req: JobRequest) -> int:
        """The id of ``req``'s shape, counting one more waiting job of it."""
        shape = request_shape(req, self.policy.uses_duration)
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self._next_shape
            self._next_shape += 1
            self._shapes[sid] = [0, shape]
        self._shapes[sid][0] += 1
        return sid

    def _drop_shape(self, sid: int):
        counted = self._shapes[sid]
        counted[0] -= 1
        if not counted[0]:
            del self._shapes[sid]
            del self._shape_ids[counted[1]]

    def shapes_in(self, shape_ids) -> bool:
        """Whether every waiting job's shape id is in ``shape_ids``."""
        return len(shape_ids) >= len(self._shapes) and all(sid in shape_ids for sid in self._shapes)

    def retime(self, req: JobRequest, seconds: float):
        """Give the queued ``req`` a new ``predicted_duration`` (the duration estimator learned):
        the same as taking it out and adding it again, without touching the sorted keys when its
        queue key does not depend on the duration (FIFO)."""
        self.retime_all([req], seconds)

    @property
    def fixed_keys(self) -> bool:
        """Whether a job's place and shape stay when its estimate moves (FIFO key, no decision
        reads the duration): its estimate may then be a :class:`SharedEstimate`."""
        return self._fixed_keys

    def retime_shared(self, shared: SharedEstimate, seconds: float, sigma: Optional[float]):
        """A new estimate for every waiting job that carries ``shared`` (a queue with
        :attr:`fixed_keys`): the total follows, nothing else moves."""
        if not self._fixed_keys:
            raise ValueError("a queue whose order reads durations re-keys each job (retime_all)")
        self.work += (seconds - shared.seconds) * shared.gpus
        shared.seconds, shared.sigma = seconds, sigma

    def retime_all(self, reqs: List[JobRequest], seconds: float):
        """:meth:`retime` for each of ``reqs`` (queued jobs), in one call (the float sums as remove,
        then add)."""
        work = self.work
        if self._fixed_keys:  # only the request and the total move (the same sums as below)
            for req in reqs:
                n = req.gpus_per_node * req.nodes
                work -= req.expected_duration() * n
                req.predicted_duration = seconds
                work += req.expected_duration() * n
            self.work = work
            return
        jobs, key_of = self._jobs, self.policy.queue_key
        with_duration = self.policy.uses_duration
        for req in reqs:
            job_id = req.job_id
            key, _, sid = jobs[job_id]
            n = req.gpus_per_node * req.nodes
            work -= req.expected_duration() * n
            if with_duration:
                self._drop_shape(sid)
            req.predicted_duration = seconds
            new = (key_of(req), job_id)
            if new != key:
                pending = self._moves.get(job_id)
                if pending is None:
                    self._moves[job_id] = [key, new, self._size(req)]
                else:
                    pending[1] = new
            if with_duration:
                sid = self._count_shape(req)
            jobs[job_id] = (new, req, sid)
            work += req.expected_duration() * n
        self.work = work

    # more keys than this to move rebuild the sorted lists in one pass (a copy of each list, instead
    # of a shift of it per key: a user's new estimate re-keys every waiting job of that user)
    BULK_MOVE = 4

    def _apply_moves(self):
        """Move the re-keyed jobs' keys in the sorted lists (:meth:`retime_all` defers it, so that
        the re-times of a feed of run times move each list once)."""
        moved: Dict[tuple, Tuple[List[tuple], List[tuple]]] = {}  # geometry -> (keys listed, keys now)
        for listed, now, size in self._moves.values():
            if listed != now:
                pair = moved.get(size)
                if pair is None:
                    pair = moved[size] = ([], [])
                pair[0].append(listed)
                pair[1].append(now)
        self._moves = {}
        if sum(len(olds) for olds, _news in moved.values()) <= self.BULK_MOVE:
            for size, (olds, news) in moved.items():
                self._own()
                for old, new in zip(olds, news):
                    self._delete(old, size)
                    self._insert(new, size)
            return
        # new lists: a snapshot that a cycle holds keeps the old ones, nothing to copy first
        self._keys = _moved(self._keys, [k for olds, _ in moved.values() for k in olds],
                            [k for _, news in moved.values() for k in news])
        by_size = dict(self._by_size)
        for size, (olds, news) in moved.items():
            by_size[size] = _moved(by_size[size], olds, news)
        self._by_size = by_size

    def _flush(self) -> List[tuple]:
        """The sorted keys of the waiting jobs only (removals and re-keys applied)."""
        if self._moves:
            self._apply_moves()
        if self._gone:
            self._own()
            for key, size in self._gone.values():
                self._delete(key, size)
            self._gone.clear()
        return self._keys

    def live_keys(self) -> List[tuple]:
        """The keys of the waiting jobs, in queue order (a new list)."""
        return list(self._flush())

    def snapshot(self, max_size: Optional[int] = None, after: Optional[tuple] = None, leave_out=()):
        """The keys of the waiting jobs, in queue order, to read only until :meth:`end_snapshot`
        (the queue copies them before changing them meanwhile: a cycle's walk starts jobs as it
        goes). With ``max_size``: an iterator over the keys of the jobs asking for at most that many
        GPUs in all (a fraction of one, or none, included), past the key ``after`` when given,
        leaving out the geometries in ``leave_out``."""
        if max_size is None:
            keys = self._flush()
            self._lent = True
            return keys
        if after is None or self._moves:
            self._flush()
        self._lent = True
        lists = []
        for (per_node, nodes), keys in self._by_size.items():
            if per_node * nodes <= max_size and keys and (per_node, nodes) not in leave_out:
                first = 0 if after is None else bisect.bisect_right(keys, after)
                if first < len(keys):
                    lists.append(map(keys.__getitem__, range(first, len(keys))))
        return lists[0] if len(lists) == 1 else heapq.merge(*lists)

    def largest(self, max_size: int) -> int:
        """The most GPUs a waiting job's geometry asks for, among those asking for at most ``max_size``
        (removed jobs not yet flushed may count)."""
        if self._moves:
            self._apply_moves()
        return max((per_node * nodes for (per_node, nodes), keys in self._by_size.items()
                    if keys and per_node * nodes <= max_size), default=0)

    def end_snapshot(self):
        """The cycle that read the last snapshot is done with it."""
        self._lent = False

    def get(self, job_id: str) -> Optional[JobRequest]:
        found = self._jobs.get(job_id)
        return found[1] if found else None

    def requests(self, job_ids) -> List[Optional[JobRequest]]:
        """:meth:`get` of each of ``job_ids``, in order (None: not queued), in one call."""
        return [found[1] if found else None for found in map(self._jobs.get, job_ids)]

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


# ``_moved``: a share of the list's keys moving above which the list is filtered and merged (a pass
# over every key, in C) rather than each key found by bisection (measured crossover: about 1 in 12)
FILTER_SHARE = 1 / 12


def _moved(keys: List[tuple], olds: List[tuple], news: List[tuple]) -> List[tuple]:
    """A new sorted list: ``keys`` (sorted, unique) without ``olds`` (each in it) and with ``news``
    (none in it). Few keys: one pass, positions found by bisection, the rest copied by slices; many
    (a user's new estimate re-keys most of a long queue): the kept keys, filtered, then the new ones,
    merged by one sort of the two sorted runs."""
    if len(olds) > FILTER_SHARE * len(keys):
        gone = set(olds)
        out = [key for key in keys if key not in gone]
        out += sorted(news)
        out.sort()  # two sorted runs: one merge
        return out
    bisect_left = bisect.bisect_left
    gone = sorted(bisect_left(keys, k) for k in olds)
    out: List[tuple] = []
    prev, i, n_gone = 0, 0, len(gone)
    for key in sorted(news):
        at = bisect_left(keys, key)  # it goes before the element at ``at`` of ``keys``
        while i < n_gone and gone[i] < at:
            out += keys[prev:gone[i]]
            prev = gone[i] + 1
            i += 1
        out += keys[prev:at]
        prev = at
        out.append(key)
    while i < n_gone:
        out += keys[prev:gone[i]]
        prev = gone[i] + 1
        i += 1
    out += keys[prev:]
    return out


def request_shape(req: JobRequest, with_duration: bool) -> tuple:
    """What a decision reads of a request (its expected duration too when ``with_duration``, the
    policy's ``uses_duration``): the cycle's equivalence cache asks one job of each shape, once,
    until a job starts."""
    return (req.job_class, req.gpus_per_node, req.nodes, req.partition, req.extra_partitions, req.mem_mb,
            req.exclusive, req.gpu_units, req.cpu_milli, req.memory_mib, req.gpu_type, req.gpu_types,
            req.expected_duration() if with_duration else 0.0)


@dataclass
class CycleResult:
    started: List[Tuple[JobRequest, Decision]] = field(default_factory=list)
    preempted: List[str] = field(default_factory=list)  # running job ids the policy reclaimed
    shrunk: List[Shrink] = field(default_factory=list)  # GPUs taken back from running elastic jobs
    tried: int = 0  # decisions asked of the policy
    examined: int = 0  # waiting jobs the cycle looked at (asked, or passed over without asking)
    waiting: Dict[str, str] = field(default_factory=dict)  # job id -> why it still waits (tried ones)


def has_room(state: ClusterState, policy: Policy) -> bool:
    """Whether any job could start now: a free GPU, or (sharing policies) a GPU with a free slot."""
    if state.n_free > 0 or state.n_fraction_room > 0:
        return True  # a free GPU, or a fraction of one left
    # (the state counts its GPUs per number of jobs on them)
    return policy.share and any(state.njobs_count[:min(state.max_jobs_per_gpu, policy.max_jobs_per_gpu)])


def nodes_with_room(state: ClusterState, policy: Policy) -> "np.ndarray":
    """Per node: how many of its GPUs could take one more job under ``policy`` at all (free, or with
    a free slot and no exclusive job). Partitions and memory only remove GPUs from this."""
    limit = min(state.max_jobs_per_gpu, policy.max_jobs_per_gpu) if policy.share else 1
    if limit <= 1:
        return state.node_free
    if limit == state.max_jobs_per_gpu:
        return state.node_free + state.node_joinable  # (counts the state keeps)
    if limit == 2:
        return state.node_free + state.node_single
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
    try:
        return [entry[1] for key, entry in _walk(state, policy, queue, ctx) if _current(key, entry)]
    finally:
        queue.end_snapshot()


def _walk(state: ClusterState, policy: Policy, queue: PendingQueue,
          ctx: SchedulingContext, max_size: Optional[int] = None) -> Iterator[Tuple[tuple, Optional[tuple]]]:
    """:func:`cycle_order`, lazily: a cycle asks about ``queue_depth`` jobs, not the whole queue.
    Yields (key, the queue's entry: key, request, shape id), as :func:`_entries`.

    The order is fixed now (a snapshot of the queue, the guard's threshold); a job that has left the
    queue by the time the walk reaches it is not :func:`_current`. ``max_size`` (only without a guard):
    walk only the jobs asking for at most that many GPUs (a fraction of one, or none, included).
    The caller ends the snapshot (``queue.end_snapshot()``) when it is done.
    """
    guard = type(policy).urgent_duration is not Policy.urgent_duration
    jobs = queue._jobs
    if max_size is not None and not guard:
        return _narrow(queue, max_size)
    keys = queue.snapshot()  # the cycle removes the jobs it starts: walk a snapshot
    k = len(keys)
    if guard and keys:
        # the queue is in SJF order for policies with a guard, so the urgent jobs sit at its end
        threshold = policy.urgent_duration(state, ctx)
        while k > 0 and jobs[keys[k - 1][1]][1].expected_duration() >= threshold:
            k -= 1
    if k == len(keys):
        return _entries(jobs, keys)
    return _entries(jobs, (keys[i] for i in itertools.chain(range(len(keys) - 1, k - 1, -1), range(k))))


def _entries(jobs: dict, keys) -> Iterator[Tuple[tuple, Optional[tuple]]]:
    """Pairs (key, the queue's entry of its job now: None when it left) for ``keys`` in order, built
    without a Python-level step per key (a cycle walks hundreds of jobs to ask a few): the entry is
    the walk's only when it is still under that key (:func:`_current`)."""
    if isinstance(keys, list):
        return zip(keys, map(jobs.get, map(_JOB_ID, keys)))
    keys, ids = itertools.tee(keys)
    return zip(keys, map(jobs.get, map(_JOB_ID, ids)))


_JOB_ID = operator.itemgetter(1)


def _current(key: tuple, entry: Optional[tuple]) -> bool:
    """Whether a walked job is still waiting under ``key`` (it may have started, or come back under
    another key, since the walk's snapshot)."""
    return entry is not None and (entry[0] is key or entry[0] == key)


# why a job the cycle did not ask waits (KnownWaits)
KNOWN_WAIT = "waits as a job of the same request expected to run no longer did on this cluster"


class KnownWaits:
    """Waits the policy answered (``Policy.wait_reason``), kept from cycle to cycle: per request
    (:func:`request_shape` less the duration), the least expected duration that waits. A policy's
    ``wait_epoch`` says what else its waits read; under an equal token a wait holds at a later time,
    after more jobs were placed (a placement only takes room), and for a job expected to run no
    shorter (``Policy.wait_epoch``). A saturated queue is asked again at every arrival and after
    every start: the cycle answers from here what it was already told. A job that leaves (the
    cluster's change log shows a release) gives room back on its nodes only: the policy's
    ``waits_after_release`` says which waits hold whatever those nodes now offer; the others are
    dropped (all of them, for a policy that does not say). Kept by the queue."""

    def __init__(self):
        self._state = None
        self._token = None
        self._seen = 0  # the position in the state's change log read up to
        self._since = 0.0  # the latest time a wait was kept at
        self._waits: Dict[tuple, tuple] = {}

    def at(self, state: ClusterState, token: Optional[tuple], now: float,
           released: Optional[Callable[[dict, "np.ndarray"], dict]] = None,
           retoken: Optional[Callable[[tuple, tuple, dict], dict]] = None) -> Optional[Dict[tuple, tuple]]:
        """The waits that hold on ``state`` as it is now under ``token`` at ``now``, to read and add
        to: request -> (the least expected duration known to wait, the policy's ``wait_stamp`` then,
        the request asked). None: the policy keeps none. Under a new token, ``retoken(old, new,
        waits)`` (the policy's ``waits_after_token``) gives the waits that still hold; after jobs
        left, ``released(waits, nodes)`` (``waits_after_release``; node ids of the jobs that left);
        without them none does."""
        if token is None:
            self._state, self._waits = None, {}
            return None
        base, changes = state.changes_base, state.changes
        fresh = self._state is not state or now < self._since or self._seen < base
        if not fresh and self._token != token:
            if retoken is None or not self._waits:
                fresh = True
            else:
                self._waits = retoken(self._token, token, self._waits)
        if not fresh and self._waits:
            left = [job for sign, job in changes[self._seen - base:] if sign < 0]  # room may be back
            if left and released is None:
                fresh = True
            elif left:
                nodes = sorted({k for job in left for k in state.job_nodes(job)})
                self._waits = released(self._waits, np.array(nodes, dtype=np.intp))
        if fresh:
            self._state, self._waits = state, {}
        self._token = token
        self._seen = base + len(changes)
        self._since = now
        return self._waits


def _narrow(queue: PendingQueue, max_size: int, after: Optional[tuple] = None,
            leave_out=()) -> Iterator[Tuple[tuple, Optional[tuple]]]:
    """The walk of an exclusive policy's cycle: the jobs asking for at most ``max_size`` GPUs, in
    queue order, past the key ``after``, leaving out the geometries in ``leave_out``."""
    return _entries(queue._jobs, queue.snapshot(max_size, after, leave_out))


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
    reclaiming = preempt is not None and may_reclaim(policy)
    if not queue or (not has_room(state, policy) and not reclaiming):
        return CycleResult()
    ctx = SchedulingContext(now, len(queue), queue.gpus, queue.work)
    # an exclusive policy passes over the jobs larger than the free GPUs without asking (below), and
    # the free GPUs only go down in a cycle without reclaims: walk only the jobs that may fit
    narrow = not policy.share and not reclaiming and type(policy).urgent_duration is Policy.urgent_duration
    order = _walk(state, policy, queue, ctx, max_size=int(state.n_free) if narrow else None)
    try:
        return _cycle(state, policy, queue, ctx, order, start, preempt, options, explain, shrink, reclaiming, narrow)
    finally:
        queue.end_snapshot()


def _cycle(state, policy, queue, ctx, order, start, preempt, options, explain, shrink, reclaiming,
           narrow) -> CycleResult:
    result = CycleResult()
    if policy.share and policy.reads_window:
        classes = state.classes
        ctx.extra["window"] = [classes.id(req.job_class) for req in queue.head(options.window)]
    failed = set()  # request shapes that did not fit since the last start (equivalence cache)
    # a multi-GPU job needs ``nodes`` nodes with ``gpus_per_node`` GPUs that can take a job: when too
    # few nodes have them, every policy's pipeline answers "wait" (its filter and select only narrow
    # this down), so the answer is given without running it (the count is redone after a start)
    roomy: Dict[int, int] = {}  # gpus_per_node -> nodes with that many GPUs with room
    # geometries (GPUs per node, nodes) found not to fit by that count: any job asking for one of
    # them waits too, whatever its class (an equivalence on the resource request alone, as Slurm's
    # main scheduler skips a request identical to one that failed); passed over without asking
    blocked = set()
    jobs = queue._jobs
    prune = not reclaiming and not explain
    knows_waits = prune and type(policy).wait_reason is not Policy.wait_reason
    carry = knows_waits and type(policy).wait_epoch is not Policy.wait_epoch
    stamped = type(policy).wait_stamp is not Policy.wait_stamp
    released = retoken = None  # the policy's waits_after_release and waits_after_token, at this cycle's context
    if carry and type(policy).waits_after_release is not Policy.waits_after_release:
        released = functools.partial(policy.waits_after_release, state, ctx)
    if carry and type(policy).waits_after_token is not Policy.waits_after_token:
        retoken = functools.partial(policy.waits_after_token, state, ctx)
    known = None  # request -> (least expected duration known to wait, the policy's stamp, request): KnownWaits
    known_version = -1  # the cluster version ``known`` was taken at
    shapes = queue._shapes
    width = state.node_gpu_table.shape[1]
    room_version = state.version  # has_room was true at this version of the cluster
    walk_cap = int(state.n_free)  # an exclusive policy's walk: jobs asking for at most this many GPUs
    walk = iter(order)
    depth, tried, examined = options.queue_depth, 0, 0
    while tried < depth:
        # pass over, one C-level step each, the jobs that left (a reclaim or the caller took them
        # out meanwhile: :func:`_current`, inlined) and those of a request shape that did not fit (most
        # of a long queue)
        for key, entry in walk:
            if entry is not None and (entry[0] is key or entry[0] == key):
                examined += 1
                if entry[2] not in failed:
                    break
        else:
            break  # the walk is done
        req, shape = entry[1], entry[2]  # shape: the id of request_shape(req, policy.uses_duration)
        if not policy.share and req.gpu_units == 0 and req.n_gpus > state.n_free and not reclaiming:
            continue
        k = req.gpus_per_node
        if blocked and req.gpu_units == 0 and (k, req.nodes) in blocked:
            failed.add(shape)  # (both are cleared at the next start): its likes are passed over sooner
            continue
        tried += 1
        if prune and req.nodes * k > 1:
            if k not in roomy:
                roomy[k] = 0 if k > width else int((nodes_with_room(state, policy) >= k).sum())
            if roomy[k] < req.nodes:
                failed.add(shape)
                blocked.add((k, req.nodes))
                result.waiting[req.job_id] = "not enough nodes with free or shareable GPUs"
                state.classes.id(req.job_class)  # as a decision would: the class is known from now on
                if narrow:  # walk on without that geometry
                    walk_cap = int(state.n_free)
                    walk = _narrow(queue, walk_cap, jobs[req.job_id][0], blocked)
                continue
        if knows_waits:
            if carry and known_version != state.version:
                known = queue.known_waits.at(state, policy.wait_epoch(state, ctx), ctx.now, released, retoken)
                known_version = state.version
            least = None
            if known is not None:
                request = shapes[shape][1][:-1]
                least = known.get(request)
                expected = req.expected_duration() if policy.uses_duration else 0.0
            if least is not None and expected >= least[0] and \
                    (not stamped or policy.wait_stamp(req) == least[1]):
                reason = KNOWN_WAIT  # asked, it would wait (its reason may differ)
            else:
                reason = policy.wait_reason(state, req, ctx)
                if reason is not None and known is not None:
                    known[request] = (expected, policy.wait_stamp(req) if stamped else None, req)
            if reason is not None:  # what decide would answer, known from this cycle's decisions
                failed.add(shape)
                result.waiting[req.job_id] = reason
                if queue.shapes_in(failed):
                    break
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
            if not reclaiming and queue.shapes_in(failed):
                break  # every waiting job is of a shape that did not fit: the walk would ask none
        else:
            key = jobs[req.job_id][0]
            if start(req, decision):
                failed.clear()
                roomy.clear()
                queue.remove(req.job_id)
                result.started.append((req, decision))
                ctx.n_waiting -= 1
                ctx.waiting_gpus -= req.n_gpus
                ctx.waiting_work -= req.expected_duration() * req.n_gpus
                if narrow and state.n_free > 0 and (blocked or state.n_free < queue.largest(walk_cap)):
                    # fewer free GPUs than a walked geometry asks, or a blocked geometry back
                    walk_cap = int(state.n_free)
                    walk = _narrow(queue, walk_cap, key, ())
                blocked.clear()
        if not reclaiming and state.version != room_version:
            if not has_room(state, policy):
                break  # nothing could start any more: no free GPU, no usable slot
            room_version = state.version
    result.tried, result.examined = tried, examined
    return result

