"""DeepBoot's runtime in the simulator: elastic training rounds, start and rescale costs (AFE), and
the inference pods' protect/sleep lifecycle. The decisions are the policy's
(``placement/policies/deepboot.py``); this module is what happens to the jobs.

* **Elastic training** (policy ``elastic``): a training job whose trace says how it scales
  (``TraceJob.scaling``: the application's ``placements.csv``/``scalability.csv``/``validation-*.csv``)
  does not wait in the placement queue: every ``interval`` seconds (DeepBoot: 60) the policy's ATS
  gives every training job a replica count, and this module shrinks, grows, starts or stops the jobs
  (shrinks first, then grows in increasing size, as DeepBoot applies a round). Between rounds a job
  progresses at ``duration × 1 / time_to_target(its placement)`` solo-seconds per second: its trace
  duration is its run at the requested size, and ``time_to_target`` is Pollux's goodput read off the
  traces (:meth:`PolluxApplications.time_to_target`) for the replicas it has on each node. The policy
  sees the same curve packed on full nodes (``JobRequest.elastic``).
* **Costs** (:class:`DeepBootOptions`): a change of placement stalls the job (it holds its GPUs and
  makes no progress) for a number of seconds. With AFE, as DeepBoot's code charges them
  (``calculate_rescale_time``): a start costs the application's start cost; a shrink its rescale
  cost; a grow from ``a`` to ``b`` replicas ``rescale + (start − rescale) × (b − a) // b``; a move
  at the same count a start. Without AFE every change costs a start; ``restart`` replaces every
  change's cost by one flat figure (the restart-cost sweep). A rigid job pays its start cost at each
  (re)start. A cold inference pod pays its model's start-up; a warm pod nothing.
* **Inference pods**: a request runs in a pod; when it ends the pod stays on its GPU (a RunningJob with
  ``pod_app``), protected for ``min(protect + bonus × hits, protect_max)`` s (30, 15, 120 in DeepBoot),
  then asleep until a job takes the GPU. ``hits`` counts the requests in a row that found the pod
  protected (a request that finds it asleep starts the count again).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..placement import Decision
from ..placement.elastic import ElasticJob, ElasticSpec, Shrink
from ..placement.state import RunningJob

MAX_REPLICAS = 64  # Pollux's and DeepBoot's simulators cap a job's replica count here


@dataclass
class DeepBootOptions:
    """Costs (seconds) and timing of DeepBoot's runtime. Per-application figures override the
    defaults: ``start_costs`` / ``rescale_costs`` by training application, ``inference_costs`` by
    inference class (``infer-<model>``)."""

    interval: float = 60.0  # seconds between ATS rounds
    start: float = 30.0  # a training job's start (container, data, warm-up)
    rescale: float = 3.0  # AFE: a change of replica count of a running job
    inference_start: float = 5.0  # a cold inference pod's start-up
    start_costs: Dict[str, float] = field(default_factory=dict)
    rescale_costs: Dict[str, float] = field(default_factory=dict)
    inference_costs: Dict[str, float] = field(default_factory=dict)
    afe: bool = True  # False: every change of placement costs a start
    restart: Optional[float] = None  # a flat cost for every change of a started job (overrides AFE)
    protect: float = 30.0
    protect_bonus: float = 15.0
    protect_max: float = 120.0
    pods: bool = True  # False: an inference pod leaves with its request (no lifecycle)

    def start_cost(self, app: str) -> float:
        return float(self.start_costs.get(app, self.start))

    def restart_cost(self, app: str) -> float:
        """A rigid job started again after a preemption."""
        return float(self.restart) if self.restart is not None else self.start_cost(app)

    def change_cost(self, app: str, old: int, new: int, moved: bool = True) -> float:
        """Seconds a job stalls when its replica count goes from ``old`` to ``new``."""
        first = self.start_cost(app)
        if old == 0:
            return first
        if new == 0 or (old == new and not moved):
            return 0.0
        if self.restart is not None:
            return float(self.restart)
        if not self.afe:
            return first
        step = float(self.rescale_costs.get(app, self.rescale))
        if new > old:
            return step + float((first - step) * (new - old) // new)
        if new < old:
            return step
        return first

    def inference_cost(self, job_class: str) -> float:
        return float(self.inference_costs.get(job_class, self.inference_start))

    def protect_time(self, hits: int) -> float:
        return min(self.protect + self.protect_bonus * hits, self.protect_max)


class _State:
    __slots__ = ("stall_until", "restarts", "profiled", "attained", "since", "hits", "resizes", "started")

    def __init__(self):
        self.stall_until = 0.0
        self.restarts = 0
        self.profiled = 0  # most replicas it has run on
        self.attained = 0.0  # GPU-seconds received
        self.since = 0.0
        self.hits = 0  # inference: requests in a row its pod served protected
        self.resizes = 0
        self.started = False


def goodput_curve(trace, gpus_per_node: int) -> Optional[ElasticSpec]:
    """The job's goodput on 1..n replicas packed on ``gpus_per_node``-GPU nodes (1 / seconds to
    target), up to the largest count any measured batch size allows (at most 64)."""
    apps, app = trace.scaling, trace.extra.get("application", "")
    if apps is None or not app:
        return None
    curve = []
    for r in range(1, MAX_REPLICAS + 1):
        full, rest = divmod(r, gpus_per_node)
        t = apps.time_to_target(app, [gpus_per_node] * full + ([rest] if rest else []))
        if not t < float("inf"):
            break
        curve.append(1.0 / t)
    return ElasticSpec(tuple(curve), app) if curve else None


class DeepBootRuntime:
    """The engine's extension for DeepBoot policies (see the module docstring)."""

    def __init__(self, sim, options: DeepBootOptions):
        self.sim = sim
        self.policy = sim.policy
        self.options = options
        self.elastic = bool(getattr(self.policy, "elastic", False))
        self.info: Dict[int, _State] = {}
        self.active: Dict[str, object] = {}  # elastic training jobs in the system (job id -> SimJob)
        self.round_at: Optional[float] = None
        self.timers: Dict[float, bool] = {}
        self.stalled: Dict[int, float] = {}
        self.n_pods = 0
        self.pod_hits: Dict[str, int] = {}  # idle pod -> requests in a row it served protected
        self.resizes = 0
        self.shrinks = 0  # GPUs taken back from running elastic jobs for inference
        self.cold_starts = 0
        self.warm_starts = 0
        width = sim.state.node_gpu_table.shape[1]
        for job in sim.jobs:
            job.req.application = job.trace.extra.get("application", "")
            if self.elastic and job.trace.kind == "train":
                job.req.elastic = goodput_curve(job.trace, width)
            self.info[job.idx] = _State()

    # ---- timers ---------------------------------------------------------------------------------
    def _timer(self, t: float):
        if t not in self.timers:
            self.timers[t] = True
            self.sim.push_timer(t)

    def on_timer(self, now: float) -> bool:
        """Stalls that ended, a due round; True: the queue should get a pass (a pod fell asleep)."""
        self.timers.pop(now, None)
        ended = [idx for idx, until in self.stalled.items() if until <= now]
        for idx in ended:
            del self.stalled[idx]
        if ended:
            self.sim._refresh([self.sim.jobs[idx] for idx in ended if self.sim.jobs[idx].running])
        if self.round_at is not None and self.round_at <= now:
            self.round_at = None
            self.round(now)
        return True

    def _ensure_round(self):
        if self.elastic and self.active and self.round_at is None:
            interval = self.options.interval
            now = self.sim.now
            self.round_at = (int(now // interval) + 1) * interval
            self._timer(self.round_at)

    def _stall(self, job, seconds: float):
        if seconds <= 0:
            return
        until = max(self.info[job.idx].stall_until, self.sim.now + seconds)
        self.info[job.idx].stall_until = until
        self.stalled[job.idx] = until
        self._timer(until)

    # ---- engine hooks ---------------------------------------------------------------------------
    def speed(self, job) -> float:
        """Factor on the job's true rate: 0 while it stalls; an elastic job's goodput on its placement."""
        if self.info[job.idx].stall_until > self.sim.now:
            return 0.0
        if job.req.elastic is None:
            return 1.0
        state = self.sim.state
        per_node: Dict[int, int] = {}
        for g in state.jobs[job.req.job_id].gpus:
            per_node[int(state.gpu_node[g])] = per_node.get(int(state.gpu_node[g]), 0) + 1
        t = job.trace.scaling.time_to_target(job.req.application, list(per_node.values()))
        return job.trace.duration / t if t > 0 and t < float("inf") else 0.0

    def enqueue(self, job) -> bool:
        """An arriving or preempted job: elastic training waits for the next round (True)."""
        if job.req.elastic is None:
            return False
        self.active[job.req.job_id] = job
        self._ensure_round()
        return True

    def preempt_work(self, job) -> float:
        return 0.0  # the restart is charged as a stall when the job starts again

    def before_start(self, job, decision: Decision):
        """Take idle pods off the chosen GPUs; charge the start."""
        info = self.info[job.idx]
        warm = self._take_pods(decision.gpu_ids, job)
        if job.trace.kind == "infer":
            if warm is None:
                info.hits = 0
                self.cold_starts += 1
                self._stall(job, self.options.inference_cost(job.req.job_class))
            else:
                info.hits = warm
                self.warm_starts += 1
        elif job.req.elastic is not None:
            self._stall(job, self.options.change_cost(job.req.application, 0, len(decision.gpu_ids)))
        else:
            app = job.req.application
            self._stall(job, self.options.restart_cost(app) if info.started else self.options.start_cost(app))
        info.started = True
        info.since = self.sim.now
        info.profiled = max(info.profiled, len(decision.gpu_ids))

    def finished(self, job, gpus: Tuple[int, ...]):
        self._account(job, 0)
        self.active.pop(job.req.job_id, None)
        if job.trace.kind == "infer" and self.options.pods and job.req.application:
            now = self.sim.now
            until = now + self.options.protect_time(self.info[job.idx].hits)
            self.n_pods += 1
            pod = RunningJob(f"pod#{self.n_pods}", job.req.job_class, tuple(gpus), now, until, exclusive=True,
                             partition=job.req.partition, application=job.req.application,
                             pod_app=job.req.application, protect_until=until)
            self.sim.state.place(pod)
            self.pod_hits[pod.job_id] = self.info[job.idx].hits
            self._timer(until)

    def _take_pods(self, gpus, job) -> Optional[int]:
        """Release the idle pods on ``gpus``; the hit count the job carries on when one of them was its
        own application's (warm start), else None."""
        state, now = self.sim.state, self.sim.now
        warm = None
        for g in gpus:
            for resident in list(state.gpu_jobs[g]):
                pod = state.jobs[resident]
                if not pod.pod_app:
                    continue
                hits = self.pod_hits.pop(resident, 0)
                if job.trace.kind == "infer" and pod.pod_app == job.req.application:
                    warm = hits + 1 if now < pod.protect_until else 0
                state.release(resident)
        return warm

    # ---- elastic training -----------------------------------------------------------------------
    def _account(self, job, replicas_after: int):
        info = self.info[job.idx]
        held = len(self.sim.state.jobs[job.req.job_id].gpus) if job.running else 0
        info.attained += held * max(0.0, self.sim.now - info.since)
        info.since = self.sim.now
        if replicas_after:
            info.profiled = max(info.profiled, replicas_after)

    def _resize(self, job, gpus: Tuple[int, ...]):
        old = len(self.sim.state.jobs[job.req.job_id].gpus)
        self._account(job, len(gpus))
        self._take_pods(gpus, job)
        info = self.info[job.idx]
        info.restarts += 1
        info.resizes += 1
        self.resizes += 1
        self.sim._resize(job, gpus)
        self._stall(job, self.options.change_cost(job.req.application, old, len(gpus)))
        self.sim._refresh([job])

    def _stop(self, job):
        self._account(job, 0)
        self.info[job.idx].restarts += 1
        self.sim._preempt(job)  # back to the pool (enqueue), counted as a preemption

    def shrink(self, shrink: Shrink):
        """ATS-I took GPUs back from a running elastic job for inference."""
        job = self.sim.jobs_by_id[shrink.job_id]
        current = self.sim.state.jobs[shrink.job_id].gpus
        keep = tuple(g for g in current if g not in set(shrink.gpus))
        self.shrinks += len(current) - len(keep)
        if keep:
            self._resize(job, keep)
        else:
            self._stop(job)

    def round(self, now: float):
        """One ATS round: ask the policy for every job's replica count and apply it."""
        state = self.sim.state
        views: List[ElasticJob] = []
        for job_id, job in self.active.items():
            info = self.info[job.idx]
            self._account(job, 0)
            held = len(state.jobs[job_id].gpus) if job.running else 0
            views.append(ElasticJob(job_id, job.req.elastic, held, job.trace.submit_time, info.restarts,
                                    info.attained))
        profiled = {job_id: self.info[job.idx].profiled for job_id, job in self.active.items()}
        targets = self.policy.allocate(state, views, now, profiled)
        current = {v.job_id: v.replicas for v in views}
        # shrinks and stops first (they free GPUs), then grows and starts, smallest first
        for job_id in sorted(targets, key=lambda j: (targets[j], j)):
            job, target = self.active[job_id], targets[job_id]
            if target >= current[job_id]:
                continue
            if target == 0:
                self._stop(job)
            else:
                gpus = self.policy.resize_gpus(state, job_id, state.jobs[job_id].gpus, target, now)
                self._resize(job, gpus)
        for job_id in sorted(targets, key=lambda j: (targets[j], j)):
            job, target = self.active[job_id], targets[job_id]
            if target <= current[job_id]:
                continue
            held = state.jobs[job_id].gpus if job.running else ()
            gpus = self.policy.resize_gpus(state, job_id, held, target, now)
            if gpus is None:
                continue
            if job.running:
                self._resize(job, gpus)
            else:
                self.sim._start(job, Decision(job_id, True, self.policy.name, gpu_ids=tuple(gpus)))
        self._ensure_round()

    def summary(self) -> Dict[str, int]:
        return {"resizes": self.resizes, "shrinks_for_inference": self.shrinks,
                "inference_cold_starts": self.cold_starts, "inference_warm_starts": self.warm_starts}


def runtime_for(sim) -> Optional[DeepBootRuntime]:
    """The runtime a policy needs in the simulator (DeepBoot's), or None."""
    from ..placement.policies.deepboot import DeepBoot

    if not isinstance(sim.policy, DeepBoot):
        return None
    return DeepBootRuntime(sim, sim.options.deepboot or DeepBootOptions())
