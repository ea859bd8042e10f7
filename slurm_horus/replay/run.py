"""``horus replay``: a trace on real Slurm, one local cluster per policy, beside the simulator's prediction.

For each policy a fresh local cluster (real slurmctld, slurmd, slurmdbd; fake GPUs) is started:
``slurm-default`` is plain Slurm (no job_submit plugin, no horusd); any other policy runs horusd with
that policy and the placing job_submit.lua. Every trace job is submitted with plain ``sbatch`` at its
arrival time divided by the speedup X, as a fake GPU job (``horus fake-job``) doing its duration / X
of work and slowing down as the truth says when it shares a GPU. A job failed like an OOM is
submitted again ``oom_penalty`` / X later, as the simulator retries it. When every job has ended,
sacct is read and the simulator's figures are computed from it (``replay/live.py``), in trace
seconds, next to those of the simulator for the same trace, cluster, truth, policy and knowledge
(:data:`KNOWLEDGE`). An interrupted replay (Ctrl-C) stops every daemon and collector it started.
"""

import copy
import math
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InputError
from ..localcluster.cluster import TERMINAL_STATES
from ..sim.fakejob import job_script
from .live import LiveJob, LiveRun, measure_cadence, summarize_live

OOM_MARK = "out of memory (emulated)"
SUBMIT_THREADS = 4


@dataclass(frozen=True)
class Knowledge:
    """What the live system knows, so that the simulator is told the same (the one place to switch).

    ``holdout``: whether the policies' priors hide the truth GPU type's measured pairs. horusd builds
    its model from the built-in priors as shipped (``interference.build_model``), Gavel's V100 and
    P100 pairs included, so a replay against ``gavel:v100`` does not hide them.
    ``durations``: what a policy is told of a job's run time (``SimOptions.durations``). horusd's
    duration estimator learns from the run times in its history store (read at start and every 5
    minutes); a replay's fresh cluster has none and a replay lasts about 4 minutes, so the live
    knowledge is the time limit only (``"limit"``: the simulator's estimator that never learns); the
    trace's true durations are the simulator's ``"oracle"``.
    ``pairs_learned``: whether the live system learns pairs while the replay runs. horusd learns them
    at its feed (every 5 minutes) and its model refits, from what ``horus ingest`` stored; a replay
    lasts minutes and ingests nothing until it is over, so no: its simulator holds every pair
    measured until after the run (``SimOptions.learn_pairs_every_s`` infinite), where it would learn
    each at once.
    """

    holdout: bool = False
    durations: str = "limit"
    pairs_learned: bool = False


KNOWLEDGE = Knowledge()


@dataclass(frozen=True)
class LiveCadence:
    """How late the live system acts, in wall seconds, so that the simulator is told the same.

    The simulator's scheduler acts at once; a live one does not, and at speedup X each wall second is
    X trace seconds (200 s at X = 200, against a mean job of ~1,900 s). ``end_to_cycle_s``: from a
    job's end to the next job started on what it freed (plain Slurm: its next scheduling pass,
    ``bf_interval=1``; horusd: its cycle and move at once when horus_epilog.lua tells it of the end,
    else after its next squeue read, ``refresh_s = 1``; then Slurm starting the job). ``launch_s``:
    how much longer than its work a job holds its GPU in sacct (Slurm starting the batch script and
    recording its end). Measured on the local cluster with
    ``bench/bench_replay.py --seed 0`` (``live_cadence`` in its output: the same measurement,
    ``replay/live.measure_cadence``, on every run) and used unchanged on other traces.
    """

    end_to_cycle_s: float
    launch_s: float


# bench_replay.py --seed 0 (120 jobs, 2 x 4, X = 200), this 2-core VM: plain Slurm 0.29 s / 0.19 s,
# horusd 1.24 s / 0.32 s; horusd told of each end by horus_epilog.lua (EpilogSlurmctld, which local
# clusters set since 2026-11-27) 0.18 s / 0.02 s (docs/replay.md)
LIVE_CADENCE = {"slurm-default": LiveCadence(0.3, 0.2), "horusd": LiveCadence(0.2, 0.0)}
IDEAL = LiveCadence(0.0, 0.0)


def cadence_of(policy: str) -> LiveCadence:
    return LIVE_CADENCE["slurm-default" if policy == "slurm-default" else "horusd"]


@dataclass
class ReplaySetup:
    jobs: list  # prepared TraceJobs (classes assigned, arrivals scaled by the load), trace seconds
    truth: object  # sim.truth.Truth
    truth_spec: str
    nodes: int
    gpus: int
    gpu_type: str
    speedup: float = 200.0
    time_limit_min: int = 0  # wall minutes given to every job (0: from the longest job)
    oom_penalty: float = 60.0  # trace seconds before a job failed like an OOM is submitted again
    period_s: float = 0.1  # how often a fake job looks at who shares its GPU
    history_dir: Optional[Path] = None  # per policy: POLICY.db with sacct + GPU samples (+ decisions)
    work_dir: Optional[Path] = None  # cluster directories (default: temporary, removed)
    collect_interval_s: float = 0.5
    knowledge: Knowledge = KNOWLEDGE
    extra: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.speedup <= 0:
            raise InputError("--speedup must be positive")
        # daemons and collectors get these paths: absolute, whatever their working directory
        self.history_dir = Path(self.history_dir).resolve() if self.history_dir is not None else None
        self.work_dir = Path(self.work_dir).resolve() if self.work_dir is not None else None
        if not self.time_limit_min:
            longest = max((j.duration for j in self.jobs), default=60.0)
            # room for a job slowed 4x by sharing: Slurm must never kill a fake job for its time
            self.time_limit_min = max(1, math.ceil(4 * longest / self.speedup / 60))
        for job in self.jobs:
            job.time_limit = self.time_limit_min * 60.0 * self.speedup  # trace seconds, what a policy sees

    @property
    def n_gpus(self):
        return self.nodes * self.gpus


def safe_name(policy: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in policy)


def history_db(setup: ReplaySetup, policy: str) -> Optional[Path]:
    return None if setup.history_dir is None else Path(setup.history_dir) / f"{safe_name(policy)}.db"


def _request_args(job, gpus_per_node):
    n = job.num_gpus
    gpn = job.gpus_per_node or (n if n <= gpus_per_node else gpus_per_node)
    nodes = max(1, n // gpn)
    args = [f"--gres=gpu:{gpn}"]
    if nodes > 1:
        args += [f"--nodes={nodes}"]
    return args


class LiveReplay:
    """One policy on one fresh local cluster."""

    def __init__(self, setup: ReplaySetup, policy: str, progress: Callable[[str], None]):
        self.setup = setup
        self.policy = policy
        self.progress = progress
        self.cluster = None
        self.collectors = None
        self.jobs = [LiveJob(i, t) for i, t in enumerate(setup.jobs)]
        self.by_slurm_id: Dict[int, LiveJob] = {}
        self.states: Dict[int, str] = {}

    # ---- cluster --------------------------------------------------------------------------------
    def start_cluster(self):
        from ..localcluster import LocalCluster

        setup = self.setup
        plain = self.policy == "slurm-default"
        directory = None
        if setup.work_dir is not None:
            directory = Path(setup.work_dir) / safe_name(self.policy)
            if directory.exists():
                shutil.rmtree(directory)
        db = history_db(setup, self.policy)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            if db.exists():
                db.unlink()
        settings = {"policy": self.policy, "gpu_type": setup.gpu_type}
        if db is not None:
            settings["db"] = str(db)  # horusd's decisions (predicted slowdowns) land in the history too
        self.cluster = LocalCluster(directory=str(directory) if directory else None, nodes=setup.nodes,
                                    gpus=setup.gpus, with_dbd=True, horus=not plain, job_submit_plugin=not plain,
                                    horus_settings=settings)
        self.cluster.up()
        self.status_dir = self.cluster.root / "run" / "fakegpu"
        self.status_dir.mkdir(exist_ok=True)
        if db is not None:
            from ..localcluster.collectors import StandinCollectors

            self.collectors = StandinCollectors(self.cluster, db, interval_s=setup.collect_interval_s).start()

    def stop(self, interrupted=False):
        if self.collectors is not None:
            if interrupted:
                self.collectors.kill()
            else:
                self.collectors.stop()
            self.collectors = None
        if self.cluster is not None:
            survivors = self.cluster.down(remove=self.setup.work_dir is None)
            self.cluster = None
            if survivors:
                self.progress(f"processes left behind: {survivors}")

    # ---- submissions ----------------------------------------------------------------------------
    def _submit(self, job: LiveJob) -> int:
        """sbatch one attempt of ``job`` (called from the submitting threads)."""
        setup = self.setup
        work = job.trace.duration / setup.speedup
        script = job_script(work, job.trace.job_class, setup.truth_spec, status_dir=str(self.status_dir),
                            gpu_type=setup.gpu_type, period_s=setup.period_s)
        args = _request_args(job.trace, setup.gpus) + [
            f"--time={setup.time_limit_min}", f"--job-name={job.trace.job_id}",
            f"--comment=class={job.trace.job_class} solo_s={work:.3f}"]
        return self.cluster.sbatch(args, script)

    def run(self) -> LiveRun:
        """Submit every job at its time, resubmit those failed like an OOM, wait until all ended.

        sbatch runs in a few threads, so that a slow sbatch (slurmctld busy, job_submit.lua asking
        horusd) does not delay the next arrivals; each lag (actual - intended wall time) is kept."""
        setup = self.setup
        start = min((j.trace.submit_time for j in self.jobs), default=0.0)
        due = sorted(((j.trace.submit_time - start) / setup.speedup, j.idx) for j in self.jobs)
        retries: List[tuple] = []
        lags = []
        lock = threading.Lock()
        active = set()
        t0 = time.time()
        began = time.monotonic()

        def submit(job, at):
            slurm_id = self._submit(job)
            with lock:
                job.attempts.append(slurm_id)
                self.by_slurm_id[slurm_id] = job
                active.add(slurm_id)
                lags.append(time.time() - t0 - at)

        next_poll = next_note = 0.0
        inflight = []
        # a job that never ends (a placement Slurm cannot honour, a node gone) must not hang the
        # replay: after the arrivals plus three times the work on the cluster, what is left is cut off
        work = sum(j.trace.duration * j.trace.num_gpus for j in self.jobs) / setup.n_gpus
        give_up_s = max(120.0, (due[-1][0] if due else 0.0) + 3 * work / setup.speedup)
        with ThreadPoolExecutor(max_workers=SUBMIT_THREADS, thread_name_prefix="replay-sbatch") as pool:
            while due or retries or active or inflight:
                now = time.time() - t0
                if now > give_up_s and not due and not inflight:
                    self.progress(f"{self.policy}: {len(active)} job(s) still not ended after {now:.0f} s: "
                                  "giving up on them (they count as unfinished)")
                    break
                while due and due[0][0] <= now:
                    at, idx = due.pop(0)
                    inflight.append(pool.submit(submit, self.jobs[idx], at))
                retries.sort()
                while retries and retries[0][0] <= now:
                    at, idx = retries.pop(0)
                    inflight.append(pool.submit(submit, self.jobs[idx], at))
                for future in [f for f in inflight if f.done()]:
                    inflight.remove(future)
                    future.result()  # an sbatch that failed stops the replay (its daemons are stopped)
                if now >= next_poll:
                    next_poll = now + 0.5
                    with lock:
                        watched = set(active)
                    for slurm_id in self._finished(watched):
                        with lock:
                            active.discard(slurm_id)
                        job = self.by_slurm_id[slurm_id]
                        if self.states[slurm_id] == "FAILED" and self._failed_like_oom(slurm_id):
                            job.oom_attempts += 1
                            retries.append((now + setup.oom_penalty / setup.speedup, job.idx))
                if now >= next_note:
                    next_note = now + 2.0
                    self._note(now, len(self.jobs) - len(due), active)
                waits = [0.05] + ([due[0][0] - now] if due else []) + ([retries[0][0] - now] if retries else [])
                time.sleep(max(0.002, min(waits)))
        self._note(time.time() - t0, len(self.jobs), active)
        rows = self._sacct(t0, [j for j, state in self.states.items() if state in TERMINAL_STATES])
        return LiveRun(self.policy, self.jobs, rows, t0, start, setup.speedup, setup.n_gpus,
                       wall_s=time.monotonic() - began, submit_lag_s=lags)

    def _finished(self, active):
        try:
            states = self.cluster.job_states(sorted(active))
        except Exception as exc:  # a slow slurmctld: look again at the next poll
            self.progress(f"squeue failed ({exc}); retrying")
            return []
        self.states.update(states)
        return [j for j in active if states.get(j) in TERMINAL_STATES]

    def _failed_like_oom(self, slurm_id):
        try:
            return OOM_MARK in self.cluster.job_output(slurm_id)
        except OSError:
            return False

    def _note(self, now, submitted, active):
        running = sum(1 for j in active if self.states.get(j) == "RUNNING")
        done = sum(1 for j in self.jobs if j.attempts and self.states.get(j.attempts[-1]) in TERMINAL_STATES)
        self.progress(f"{self.policy}: {now:6.1f} s wall = {now * self.setup.speedup / 3600:5.2f} h of trace; "
                      f"{submitted}/{len(self.jobs)} submitted, {running} running, "
                      f"{len(active) - running} waiting, {done} done")

    def _sacct(self, t0, ended, timeout=90.0):
        """sacct's record of every attempt; waits until those that ``ended`` show their end there
        (slurmdbd stores a finished job a moment after it ends)."""
        from ..collect.ingest import SacctSource

        source = SacctSource(slurm_conf=str(self.cluster.slurm_conf), mode="json")
        wanted = set(self.by_slurm_id)
        deadline = time.monotonic() + timeout
        while True:
            jobs, _steps = source.fetch(int(t0) - 60, int(time.time()) + 60)
            rows = {row["job_id"]: row for row in jobs if row["job_id"] in wanted}
            missing = [j for j in ended if not (j in rows and rows[j].get("end_time")
                                                 and rows[j]["state"] in TERMINAL_STATES)]
            if not missing or time.monotonic() > deadline:
                if missing:
                    self.progress(f"sacct lacks the end of {len(missing)} job(s) after {timeout:g} s")
                self._verify_tokens(list(rows.values()))
                return rows
            time.sleep(0.5)

    def _verify_tokens(self, rows):
        """A ``horus:`` token is believed (its class, the GPU of a shard job) only when horusd
        recorded its decision in its history database, as the ingest does (``collect/ingest.py``)."""
        from ..collect.ingest import verify_tokens
        from ..store.db import open_db

        path = history_db(self.setup, self.policy) or (self.cluster.root / "horus.db")
        if not any(r.get("horus_id") for r in rows) or not Path(path).exists():
            return
        db = open_db(str(path))
        try:
            verify_tokens(db, rows)
        finally:
            db.close()

    def ingest_history(self, t0):
        """Copy sacct into the policy's history database (after the collectors shipped)."""
        from ..collect.ingest import SacctSource, ingest
        from ..store.db import open_db

        db_path = history_db(self.setup, self.policy)
        if db_path is None:
            return None
        db = open_db(str(db_path))
        try:
            return ingest(db, SacctSource(slurm_conf=str(self.cluster.slurm_conf)), since=int(t0) - 60)
        finally:
            db.close()


def run_live(setup: ReplaySetup, policy: str, progress: Callable[[str], None]) -> LiveRun:
    """Replay the trace with ``policy`` on a fresh local cluster; the daemons are stopped whatever happens."""
    replay = LiveReplay(setup, policy, progress)
    interrupted = True
    try:
        started = time.monotonic()
        replay.start_cluster()
        progress(f"{policy}: local cluster {setup.nodes}x{setup.gpus} up in {time.monotonic() - started:.1f} s"
                 f" ({'plain Slurm' if policy == 'slurm-default' else 'horusd policy ' + policy})")
        result = replay.run()
        if replay.collectors is not None:
            replay.collectors.stop()
            replay.collectors = None
        replay.ingest_history(result.t0)
        interrupted = False
        return result
    finally:
        replay.stop(interrupted=interrupted)


def run_sim(setup: ReplaySetup, policy: str, cadence: Optional[LiveCadence] = None):
    """The simulator on the same trace, cluster, truth and policy, told what the live system knows and
    how late it acts (``cadence``, wall seconds; default the policy's :data:`LIVE_CADENCE`)."""
    from ..sim.engine import SimOptions
    from ..sim.run import parse_cluster, run_policies

    cadence = cadence_of(policy) if cadence is None else cadence
    groups = parse_cluster(f"{setup.nodes}x{setup.gpus}:{setup.gpu_type}")
    from ..config import SETTINGS

    # horusd's cycle refuses a pair predicted over its slowdown_limit (the replay runs it with the
    # defaults); plain Slurm has no such limit
    limit = None if policy == "slurm-default" else SETTINGS["slowdown_limit"].default
    options = SimOptions(oom_penalty=setup.oom_penalty, durations=setup.knowledge.durations,
                         end_to_cycle_s=cadence.end_to_cycle_s * setup.speedup,
                         launch_s=cadence.launch_s * setup.speedup, max_slowdown=limit,
                         learn_pairs_every_s=0.0 if setup.knowledge.pairs_learned else math.inf)
    jobs = [copy.copy(j) for j in setup.jobs]
    return run_policies(jobs, groups, setup.truth, [policy], holdout=setup.knowledge.holdout, options=options,
                        max_jobs_per_gpu=2)[0]


LIVE_VS_SIM_KEYS = ("makespan", "mean_jct", "median_jct", "p99_jct", "mean_queueing_delay", "shared_share")


def replay(setup: ReplaySetup, policies: Sequence[str], progress: Callable[[str], None] = None):
    """Replay every policy live and in the simulator. Returns (the payload of ``--json``,
    {policy: {"live": LiveRun, "sim": SimResult}})."""
    from ..sim.metrics import summarize

    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    out = {}
    runs = {}
    for policy in policies:
        sim_result = run_sim(setup, policy)
        sim = summarize(sim_result)
        ideal = summarize(run_sim(setup, policy, IDEAL))  # an ideal scheduler: what X = 1 approaches
        started = time.monotonic()
        live_run = run_live(setup, policy, progress)
        total_s = time.monotonic() - started  # cluster up, the run, sacct, history, cluster down
        live = summarize_live(live_run, setup.truth, setup.gpu_type)
        runs[policy] = {"live": live_run, "sim": sim_result}
        lags = sorted(live_run.submit_lag_s) or [0.0]
        out[policy] = {
            "live": live, "sim": sim, "sim_ideal": ideal,
            "cadence": {"told_sim": asdict(cadence_of(policy)), "measured": measure_cadence(live_run)},
            "live_vs_sim": {k: (live[k] / sim[k] if sim[k] else None) for k in LIVE_VS_SIM_KEYS},
            "wall_s": round(live_run.wall_s, 1), "total_s": round(total_s, 1),
            "submit_lag_s": {"median": round(lags[len(lags) // 2], 3), "max": round(lags[-1], 3)},
            "history_db": str(history_db(setup, policy)) if setup.history_dir else None,
        }
        progress(f"{policy}: live makespan {live['makespan'] / 3600:.2f} h, mean JCT {live['mean_jct'] / 3600:.2f} h"
                 f" | simulated {sim['makespan'] / 3600:.2f} h, {sim['mean_jct'] / 3600:.2f} h"
                 f" ({live_run.wall_s:.0f} s wall)")
    return {"policies": out, "speedup": setup.speedup, "cluster": f"{setup.nodes}x{setup.gpus}",
            "gpu_type": setup.gpu_type, "truth": setup.truth_spec, "jobs": len(setup.jobs),
            "knowledge": asdict(setup.knowledge), "time_limit_min": setup.time_limit_min,
            "period_s": setup.period_s,
            "ratios_to_slurm_default": _ratios(out)}, runs


def _ratios(out):
    base = out.get("slurm-default")
    if not base:
        return {}
    ratios = {}
    for name, entry in out.items():
        ratios[name] = {side: {k: (entry[side][k] / base[side][k] if base[side][k] else None)
                               for k in ("makespan", "mean_jct", "p99_jct", "mean_queueing_delay")}
                        for side in ("live", "sim", "sim_ideal")}
    return ratios
