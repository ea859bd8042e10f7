"""Discrete-event simulation of one policy on one trace.

Events: arrivals, completions, retries after an OOM, reclaims (DeepBoot), timers of a policy's
runtime (DeepBoot's allocation rounds, stalls and pods: ``sim/elastic.py``). Between events every
running job progresses at its **true** normalized throughput for its co-runner set (a multi-GPU job at
its slowest GPU), times what its placement costs it whatever the co-runners (``Truth.job_factor``:
communication when spread over more nodes than needed, a slower micro-batch when sub-batched); when a
set changes, the affected jobs' remaining work is settled and their completion events are re-issued
(stale ones are skipped by a version number). The policy decides from its predictions only; each pair
it sees running is measured when the pair ends and reported back to it (``Policy.observe``) at
horusd's next feed from the history store (``SimOptions.learn_pairs_every_s``, ``FEED_EVERY_S``), the
way the live service learns from finished jobs. Durations likewise: by default (``durations="estimated"``) a job's
``predicted_duration`` is what the duration estimator of the placement core
(``placement/duration.py``) says, from the run times of the jobs that finished earlier in the run and
were fed to it by then (as horusd feeds it from sacct every ``FEED_EVERY_S``:
``learn_durations_every_s``) and the job's time limit, kept current while the job waits
(``QueueEstimates``); the trace's true durations only with ``durations="oracle"``, and always for a
policy with ``perfect_knowledge`` (the ``oracle`` reference). A co-location the truth
says cannot run (throughput 0, i.e. OOM) fails the new job at start: it is requeued after
``oom_penalty`` seconds and both directions of the pair are reported to the policy.
"""

import bisect
import contextlib
import gc
import heapq
import math
import operator
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..interference.classes import with_batch
from ..placement import JobRequest
from ..placement.cycle import CycleOptions, PendingQueue, may_reclaim, run_cycle
from ..placement.duration import (FEED_EVERY_S, DurationEstimate, DurationEstimator, DurationSettings, QueueEstimates,
                                  estimate_errors)
from ..placement.framework import Policy
from ..placement.state import ClusterState
from .elastic import DeepBootOptions, runtime_for
from .traces import TraceJob
from .truth import Truth

FINISH, ARRIVAL, CYCLE, TIMER = 0, 1, 2, 3  # at equal times completions go first: capacity frees before arrivals look
BAD_PAIR = 0.85


def trace_request(t: TraceJob, width: int, default_limit: Optional[float] = None,
                  true_duration: bool = True) -> JobRequest:
    """The JobRequest of a trace job: as few nodes as possible unless the trace says; a stated
    fraction of a GPU (``gpu_milli`` < 1000) becomes ``gpu_units``, stated whole GPUs are exclusive.
    Its time limit: the trace's, else ``default_limit``; its ``predicted_duration``: the true one only
    with ``true_duration`` (else None: the simulator's duration estimator fills it)."""
    n = t.num_gpus
    limit = t.time_limit if t.time_limit else default_limit
    predicted = t.duration if true_duration else None
    if n == 0:
        return JobRequest(t.job_id, t.job_class or "unknown", gpus_per_node=0, nodes=1, partition=t.partition,
                          time_limit=limit, predicted_duration=predicted, user=t.user, submit_time=t.submit_time,
                          cpu_milli=t.cpu_milli, memory_mib=t.memory_mib)
    gpn = t.gpus_per_node
    if not gpn:
        if n <= width:
            gpn = n
        else:
            nodes = math.ceil(n / width)
            while n % nodes:
                nodes += 1
            gpn = n // nodes
    fraction = t.gpu_milli if n == 1 and 0 < t.gpu_milli < 1000 else 0
    return JobRequest(t.job_id, t.job_class or "unknown", gpus_per_node=gpn, nodes=n // gpn,
                      mem_mb=t.mem_mb, partition=t.partition, time_limit=limit, predicted_duration=predicted,
                      user=t.user, submit_time=t.submit_time,
                      extra_partitions=("infer",) if t.partition == "train" else (),
                      exclusive=t.gpu_milli >= 1000, gpu_units=fraction, cpu_milli=t.cpu_milli,
                      memory_mib=t.memory_mib, gpu_types=tuple(t.gpu_types))


class SimJob:
    __slots__ = ("idx", "trace", "req", "work", "rate", "last", "version", "running", "first_start", "end",
                 "run_time", "shared_time", "bad_time", "ooms", "preemptions", "shared", "pair", "pair_since",
                 "gpu_types", "ever_shared", "run_class", "factor", "estimate")

    def __init__(self, idx: int, trace: TraceJob, req: JobRequest):
        self.idx = idx
        self.trace = trace
        self.req = req
        self.work = float(trace.duration)  # solo-seconds left
        self.rate = 0.0
        self.last = 0.0
        self.version = 0
        self.running = False
        self.first_start = None
        self.end = None
        self.run_time = 0.0
        self.shared_time = 0.0
        self.bad_time = 0.0
        self.ooms = 0
        self.preemptions = 0
        self.shared = False
        self.ever_shared = False
        self.pair = None  # (gpu_type, corunner class) while sharing one GPU with one job
        self.pair_since = 0.0
        self.gpu_types = ()
        self.run_class = req.job_class  # the class that runs (a micro-batch variant when sub-batched)
        self.factor = 1.0  # placement cost (communication, sub-batching): Truth.job_factor
        self.estimate: Optional[DurationEstimate] = None  # the estimator's answer when it first started


DURATION_MODES = ("estimated", "oracle", "limit")
# how late horusd learns (trace seconds): pairs and run times at each feed from the history store
# (service/history.py: the estimator is fed afresh, the pairs measured since are derived, screened and
# told to a rebuilt policy), every FEED_EVERY_S
LIVE_FEED_S = FEED_EVERY_S


@dataclass
class SimOptions:
    oom_penalty: float = 60.0  # seconds before a job that OOMed is tried again
    restart_cost: float = 30.0  # seconds of work redone by a preempted (reclaimed) job
    queue_depth: int = 100  # most jobs a scheduling pass tries to place (Slurm's default_queue_depth)
    max_timeline: int = 600  # points kept for the utilization plot
    window: int = 64  # waiting jobs whose classes a sharing policy may look at (partner choice)
    max_slowdown: Optional[float] = None  # horusd's slowdown_limit, when a run should apply it (None: none)
    durations: str = "estimated"  # what policies know of durations: "estimated", "oracle" (the trace's)
    # or "limit" (the time limit only: an estimator that never learns, as a fresh horusd has)
    time_limit: Optional[float] = None  # seconds; the limit of jobs whose trace gives none (DefaultTime)
    duration_settings: Optional[DurationSettings] = None  # the estimator's settings (None: defaults)
    # seconds from a job's end to the scheduling cycle that hands its GPUs on: 0 is an ideal scheduler.
    # A live one starts the next job later (Slurm's next scheduling pass, horusd's next look at the
    # queue, then Slurm starting the job): ``horus replay`` tells the simulator its live cadence
    # (replay/run.py LIVE_CADENCE), negligible at real speed, 40-60 s of trace time at speedup 200.
    # An arrival is decided at once (sbatch asks job_submit.lua and horusd, Slurm schedules at submit).
    end_to_cycle_s: float = 0.0
    # seconds a started job holds its GPUs beyond its work (Slurm launching the batch script, recording
    # its end): 0 ideally; the replay's live cadence too (0.2 s of wall time per job on the local cluster)
    launch_s: float = 0.0
    deepboot: Optional[DeepBootOptions] = None  # costs and rounds of DeepBoot's runtime (sim/elastic.py)
    # how late what ended jobs tell reaches the policy, in trace seconds: a pair measured
    # (``Policy.observe``) at the first event after the next multiple of ``learn_pairs_every_s``, a run
    # time (the duration estimator) after the next multiple of ``learn_durations_every_s``. The
    # defaults are horusd's own cadence (its 5-minute feed from the history store learns both; until
    # 2026-11-29 it learned pairs only at its hourly model refits, 3600): the simulator knows what the
    # live system knows. 0: at once (an ideal learner, the simulator's rule before 2026-11-29);
    # math.inf: never during the run (a live run that ingests nothing until it is over, as a replay)
    learn_pairs_every_s: float = LIVE_FEED_S
    learn_durations_every_s: float = LIVE_FEED_S
    # run times of the site's other jobs, as horusd's history store holds them (sacct): each is learned
    # by the duration estimator as the run's own are, at the first feed after its end; those that ended
    # before the run's first arrival, before the run starts. Empty (default): a site with no history
    # (the estimator starts cold). ``history_from_trace`` makes them from a trace's other jobs
    history: Sequence["HistoryRun"] = ()


@dataclass(frozen=True)
class HistoryRun:
    """A finished run the site's history store held (the duration estimator's input): its end in the
    simulated trace's seconds, user, class and run time."""

    end: float
    user: str
    job_class: str
    run_time: float


@dataclass
class SimResult:
    policy: str
    jobs: List[SimJob]
    n_gpus: int
    busy_gpu_time: float
    timeline: List[tuple]  # (t, busy GPUs, useful work rate in GPUs)
    oom_events: int
    preemptions: int
    observations: int
    start_time: float
    durations: str = "estimated"  # what this policy knew: "estimated" or "oracle"
    duration_errors: Optional[dict] = None  # the estimator's error (estimate_errors), each job estimated when it first started
    runtime: Dict[str, int] = None  # counters of the policy's runtime (DeepBoot: resizes, shrinks...)


_when = operator.itemgetter(0)  # the time of a told tuple: (time, arguments...)

# the cyclic garbage collector's thresholds during a run (``_few_collections``)
RUN_GC_THRESHOLDS = (50_000, 20, 100)


@contextlib.contextmanager
def _few_collections():
    """A run allocates millions of short-lived tuples (queue keys re-made at every new estimate,
    decisions) while it keeps its jobs, requests and queue for its whole length; at the interpreter's
    default thresholds (700, 10, 10) the cyclic collector scans the survivors again and again (on the
    82k loaded run of ``sjf`` 9.7 of 37 CPU s, a quarter; ``horus`` 2.8 of 64). During the run the young
    generation is collected every 50,000 net allocations, the older ones rarely (the run makes few
    reference cycles: peak memory unchanged); the thresholds are put back after it. Collection does
    not change what a run computes."""
    old = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(old, RUN_GC_THRESHOLDS)))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _one_by_one(learn):
    """A batch learner that hands each argument tuple of the batch to ``learn`` in turn."""
    def learn_all(batch):
        for args in batch:
            learn(*args)
    return learn_all


class Simulator:
    def __init__(self, state: ClusterState, truth: Truth, policy: Policy, trace: Sequence[TraceJob],
                 options: Optional[SimOptions] = None,
                 progress: Optional[Callable[[int, int], None]] = None):
        self.state = state
        state.build()
        self.truth = truth
        self.policy = policy
        self.options = options or SimOptions()
        if self.options.durations not in DURATION_MODES:
            raise ValueError(f"durations must be one of {', '.join(DURATION_MODES)}")
        self.progress = progress
        # the oracle reference knows everything, whatever the others are told
        self.true_durations = self.options.durations == "oracle" or policy.perfect_knowledge
        # run even when durations are true: its error is reported either way
        self.estimator = DurationEstimator(self.options.duration_settings)
        width = state.node_gpu_table.shape[1]
        self.jobs = [SimJob(i, t, self._request(t, width, self.options.time_limit, self.true_durations))
                     for i, t in enumerate(trace)]
        seen = set()
        for job in self.jobs:  # the queue and the cluster state key jobs by id: make ids unique
            if job.req.job_id in seen:
                job.req.job_id = f"{job.req.job_id}#{job.idx}"
            seen.add(job.req.job_id)
        self.heap: List[tuple] = []
        self.seq = 0
        self.queue = PendingQueue(policy)
        # waiting jobs carry the current estimate, as a scheduler re-reading its queue sees it
        self.estimates = None if self.true_durations else QueueEstimates(self.estimator, self.queue)
        self.cycle_options = CycleOptions(queue_depth=self.options.queue_depth, window=self.options.window,
                                          max_slowdown=self.options.max_slowdown)
        self.now = 0.0
        self.busy_gpu_time = 0.0
        self.last_t = None
        self.work_rate = 0.0
        self.timeline: List[tuple] = []
        self.oom_events = 0
        self.preemptions = 0
        self.n_observations = 0
        for every in (self.options.learn_pairs_every_s, self.options.learn_durations_every_s):
            if not every >= 0:
                raise ValueError("learning intervals must be 0 (at once), positive, or inf (never)")
        # what ended jobs tell, per kind: (held until learned: (time, arguments) in time order, the
        # interval, who learns a batch of arguments): pair measurements the policy, run times the
        # duration estimator (the waiting jobs' estimates re-estimated once per batch, after its last)
        self.pairs_told = ([], self.options.learn_pairs_every_s, _one_by_one(policy.observe))
        self.runs_told = ([], self.options.learn_durations_every_s,
                          self.estimates.observe_many if self.estimates is not None
                          else _one_by_one(self.estimator.observe))
        # the site's history (SimOptions.history) in end order: what ended before the first arrival is
        # learned now (the store held it when the run began), the rest is told, held with the run's own
        # run times until its feed (never, in a run that learns none until it is over)
        history = [] if self.options.durations == "limit" else sorted(
            ((h.end, h.user, h.job_class, h.run_time, h.end - h.run_time) for h in self.options.history
             if math.isfinite(h.end) and h.run_time > 0 and math.isfinite(h.run_time)), key=_when)
        first = min((j.trace.submit_time for j in self.jobs), default=0.0)
        before = bisect.bisect_right(history, first, key=_when)
        if before:
            self.runs_told[2]([told[1:] for told in history[:before]])
        if not math.isinf(self.runs_told[1]):
            self.runs_told[0].extend(history[before:])
        self.done = 0
        self.may_reclaim = may_reclaim(policy)
        self.ext = runtime_for(self)  # a policy's runtime in the simulator (DeepBoot), or None

    @staticmethod
    def _request(t: TraceJob, width: int, default_limit: Optional[float] = None,
                 true_duration: bool = False) -> JobRequest:
        return trace_request(t, width, default_limit, true_duration)

    # ---- event plumbing -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, idx: int, version: int = 0):
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, idx, version))

    def _advance(self, t: float):
        if self.last_t is not None and t > self.last_t:
            self.busy_gpu_time += self.state.busy_gpus() * (t - self.last_t)
        self.last_t = t
        self.now = t

    def run(self) -> SimResult:
        with _few_collections():
            return self._run()

    def _run(self) -> SimResult:
        for job in self.jobs:
            self._push(job.trace.submit_time, ARRIVAL, job.idx)
        start = min((j.trace.submit_time for j in self.jobs), default=0.0)
        total = len(self.jobs)
        next_report = 0
        while self.heap:
            t = self.heap[0][0]
            self._advance(t)
            if self.pairs_told[0] or self.runs_told[0]:
                self._learn_held(t)
            changed = timers = False
            while self.heap and self.heap[0][0] == t:
                _, kind, _, idx, version = heapq.heappop(self.heap)
                if kind == TIMER:
                    timers = True
                    continue
                job = self.jobs[idx]
                if kind == ARRIVAL:
                    self._enqueue(job)
                    changed = True
                elif kind == CYCLE:
                    changed = True
                elif job.running and version == job.version:
                    self._finish(job)
                    if self.options.end_to_cycle_s > 0:
                        self._push(t + self.options.end_to_cycle_s, CYCLE, idx)
                    else:
                        changed = True
            if changed and self.queue:
                self._schedule()
            if timers and self.ext.on_timer(self.now) and self.queue:
                self._schedule()
            self.timeline.append((self.now, self.state.busy_gpus(), self.work_rate))
            if self.progress and self.done >= next_report:
                self.progress(self.done, total)
                next_report = self.done + max(1, total // 200)
        if self.progress:
            self.progress(self.done, total)
        estimated = [j for j in self.jobs if j.estimate is not None]
        errors = estimate_errors([j.estimate for j in estimated], [j.trace.duration for j in estimated])
        errors["order"] = self.estimator.order_text  # the levels' order the run ended with
        return SimResult(self.policy.name, self.jobs, self.state.n_gpus, self.busy_gpu_time,
                         _thin(self.timeline, self.options.max_timeline), self.oom_events, self.preemptions,
                         self.n_observations, start, durations="oracle" if self.true_durations else "estimated",
                         duration_errors=errors,
                         runtime=self.ext.summary() if self.ext else self.policy.counters())

    def push_timer(self, t: float):
        """Wake the policy's runtime at ``t`` (``ext.on_timer``)."""
        self._push(t, TIMER, -1)

    # ---- queue ----------------------------------------------------------------------------------
    def _enqueue(self, job: SimJob):
        if self.ext is not None and self.ext.enqueue(job):
            return  # the runtime keeps it (DeepBoot: elastic jobs wait for the next round)
        if self.estimates is not None:
            self.estimates.add(job.req)
        else:
            self.queue.add(job.req)

    def _schedule(self):
        """One scheduling cycle of the placement core (the very one horusd runs)."""
        jobs = self.jobs_by_id
        run_cycle(self.state, self.policy, self.queue, self.now,
                  start=lambda req, decision: self._start(jobs[req.job_id], decision),
                  preempt=(lambda job_id: self._preempt(jobs[job_id])) if self.may_reclaim else None,
                  options=self.cycle_options, shrink=self.ext.shrink if self.ext is not None else None)

    @property
    def jobs_by_id(self) -> Dict[str, SimJob]:
        cached = getattr(self, "_by_id", None)
        if cached is None:
            cached = self._by_id = {j.req.job_id: j for j in self.jobs}
        return cached

    # ---- starting, rates, finishing -------------------------------------------------------------
    def _start(self, job: SimJob, decision) -> bool:
        state = self.state
        gpus = decision.gpu_ids
        cls = with_batch(job.req.job_class, decision.micro_batch) if decision.micro_batch else job.req.job_class
        if self.ext is not None:
            self.ext.before_start(job, decision)
        # OOM check against the truth: the new job fails at start, the residents are unharmed
        for g in gpus:
            if state.gpu_njobs[g]:
                gtype = state.gpu_type_of(g)
                classes = [self.running_by_id[r].run_class for r in state.gpu_jobs[g]] + [cls]
                tputs = self.truth.set_tputs(classes, gtype)
                if min(tputs) <= 0.0:
                    # the decision was applied, as live (Slurm started the job, which failed at once):
                    # the policy counts what ran (horus's probes, horus-risk's exploration budget)
                    self.policy.running_job(job.req, decision, self.now)
                    self.oom_events += 1
                    job.ooms += 1
                    for other in classes[:-1]:
                        self._observe(gtype, cls, other, self.truth.pair(gtype, cls, other))
                        self._observe(gtype, other, cls, self.truth.pair(gtype, other, cls))
                    self._push(self.now + self.options.oom_penalty, ARRIVAL, job.idx)
                    return True  # it left the queue (it re-enters on the retry)
        running = self.policy.running_job(job.req, decision, self.now)
        state.place(running)
        job.run_class = cls
        job.factor = 1.0 if not gpus else self.truth.job_factor(job.req.job_class, cls, state.gpu_type_of(gpus[0]), len(gpus),
                                           len(decision.nodes), state.node_gpu_table.shape[1])
        self.running_by_id[job.req.job_id] = job
        job.work += self.options.launch_s
        job.running = True
        job.last = self.now
        job.rate = 0.0
        job.gpu_types = tuple(state.gpu_type_of(g) for g in gpus)
        if job.first_start is None:
            job.first_start = self.now
            # the estimate the start was decided on (also kept, for its error, with true durations)
            job.estimate = self.estimator.estimate_request(job.req)
        self._refresh(self._jobs_on(gpus) if gpus else [job])
        return True

    @property
    def running_by_id(self) -> Dict[str, SimJob]:
        cached = getattr(self, "_running", None)
        if cached is None:
            cached = self._running = {}
        return cached

    def _jobs_on(self, gpus) -> List[SimJob]:
        seen, out = set(), []
        running = self.running_by_id
        for g in gpus:
            for jid in self.state.gpu_jobs[g]:
                if jid not in seen and jid in running:  # (not a runtime's holder: DeepBoot's idle pods)
                    seen.add(jid)
                    out.append(running[jid])
        return out

    def _settle(self, job: SimJob):
        dt = self.now - job.last
        if dt > 0:
            job.work -= job.rate * dt
            job.run_time += dt
            if job.shared:
                job.shared_time += dt
                if job.rate < BAD_PAIR:
                    job.bad_time += dt
        job.last = self.now

    def _true_rate(self, job: SimJob):
        state = self.state
        rate = 1.0
        shared = False
        pair = None
        running = self.running_by_id
        for g in state.jobs[job.req.job_id].gpus:
            residents = state.gpu_jobs[g]
            if len(residents) == 1:
                continue
            shared = True
            classes = [running[r].run_class for r in residents]
            tputs = self.truth.set_tputs(classes, state.gpu_type_of(g))
            mine = tputs[residents.index(job.req.job_id)]
            rate = min(rate, mine)
            if len(residents) == 2:
                other = classes[1] if residents[0] == job.req.job_id else classes[0]
                pair = (state.gpu_type_of(g), other)
        if self.ext is not None:
            rate *= self.ext.speed(job)
        return rate * job.factor, shared, pair

    def _refresh(self, jobs: Sequence[SimJob]):
        for job in jobs:
            self._settle(job)
            rate, shared, pair = self._true_rate(job)
            if job.pair is not None and job.pair != pair and self.now > job.pair_since:
                self._observe(job.pair[0], job.run_class, job.pair[1], job.rate / job.factor)
            if pair != job.pair:
                job.pair = pair
                job.pair_since = self.now
            self.work_rate += (rate - job.rate) * job.req.n_gpus
            job.rate = rate
            job.shared = shared
            job.ever_shared = job.ever_shared or shared
            job.version += 1
            if rate > 0:
                self._push(self.now + max(job.work, 0.0) / rate, FINISH, job.idx, job.version)

    def _observe(self, gpu_type: str, target: str, corunner: str, value: float):
        self.n_observations += 1
        self._tell(self.pairs_told, gpu_type, target, corunner, value)

    def _tell(self, told, *args):
        """Learned at once (interval 0), else held until the next multiple of the interval."""
        held, every, learn = told
        if every > 0:  # (after what was told at the same time; before the site's history told for later)
            bisect.insort_right(held, (self.now,) + args, key=_when)
        else:
            learn([args])

    def _learn_held(self, t: float):
        """Hand the policy (pairs) and the duration estimator (run times) what was told before the last
        multiple of their interval at or before ``t`` (a refit, a feed), in the order it was told."""
        for held, every, learn in (self.pairs_told, self.runs_told):
            if not held or math.isinf(every):
                continue
            # (interval 0 holds only the site's history: what ended by now)
            boundary = math.floor(t / every) * every if every > 0 else math.nextafter(t, math.inf)
            k = 0
            while k < len(held) and held[k][0] < boundary:
                k += 1
            if k:
                learn([told[1:] for told in held[:k]])
                del held[:k]

    def _stop(self, job: SimJob) -> List[SimJob]:
        """Take a running job off its GPUs; return the jobs whose co-runner set changed."""
        self._settle(job)
        if job.pair is not None and self.now > job.pair_since:
            self._observe(job.pair[0], job.run_class, job.pair[1], job.rate / job.factor)
        job.pair = None
        self.work_rate -= job.rate * job.req.n_gpus
        job.rate = 0.0
        job.running = False
        job.version += 1
        gpus = self.state.jobs[job.req.job_id].gpus
        self.state.release(job.req.job_id)
        del self.running_by_id[job.req.job_id]
        return self._jobs_on(gpus)

    def _finish(self, job: SimJob):
        gpus = self.state.jobs[job.req.job_id].gpus
        others = self._stop(job)
        job.work = 0.0
        job.end = self.now
        self.done += 1
        # what sacct tells a live site: how long it ran (slowed down when it shared); "limit": nothing
        # learned (a horusd whose history store holds no run times yet, as in a short replay)
        if self.options.durations != "limit":
            self._tell(self.runs_told, job.req.user, job.req.job_class, job.run_time, self.now - job.run_time)
        self._refresh(others)
        if self.ext is not None:
            self.ext.finished(job, gpus)

    def _preempt(self, job: SimJob):
        others = self._stop(job)
        job.preemptions += 1
        self.preemptions += 1
        job.work += self.ext.preempt_work(job) if self.ext is not None else self.options.restart_cost
        self._refresh(others)
        self._enqueue(job)

    def _resize(self, job: SimJob, gpus):
        """Move a running elastic job onto ``gpus`` (exclusive GPUs: nobody else's rate changes); the
        caller refreshes its rate."""
        self._settle(job)
        running = self.state.release(job.req.job_id)
        running.gpus = tuple(gpus)
        self.state.place(running)
        job.gpu_types = tuple(self.state.gpu_type_of(g) for g in gpus)


def _thin(points: List[tuple], limit: int) -> List[tuple]:
    if len(points) <= limit:
        return points
    step = len(points) / float(limit)
    return [points[int(i * step)] for i in range(limit)] + [points[-1]]


def assign_classes(trace: Sequence[TraceJob], classes: Sequence[str], seed: int):
    """Give every job without a class one drawn uniformly from ``classes`` (reproducible by seed)."""
    rng = np.random.default_rng(seed)
    missing = [j for j in trace if j.job_class is None]
    if missing and classes:
        picks = rng.integers(0, len(classes), size=len(missing))
        for job, k in zip(missing, picks):
            job.job_class = classes[int(k)]
