"""A live run read back from sacct, as the metrics of ``sim/metrics.py`` need it (in trace seconds).

sacct's times are whole seconds (``time(NULL)``, rounded down): each is moved to the middle of its
second (+0.5 s) so that absolute times (the makespan) are not biased early; differences (JCT, wait)
are unaffected. A wall time ``w`` is trace time ``start + (w - t0) * speedup``, ``t0`` being the
wall time at which the replay submitted trace time ``start``.

Which GPU a job held comes from the sacct record (``collect/records.py``: per-GPU GRES types, or
the ``gpus=`` of the ``horus:`` token for a shard); who shared a GPU with whom, and for how long, from
``store/queries.overlaps`` (the one co-run reader).
"""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..sim.metrics import JobTimes, summarize_jobs
from ..sim.truth import Truth
from ..store.queries import job_gpus, overlaps

SACCT_MIDPOINT_S = 0.5
BAD_PAIR = 0.85  # the simulator's threshold (sim/engine.py)


@dataclass
class LiveJob:
    """One trace job on the live cluster: its Slurm attempts (a job failed like an OOM is resubmitted)."""

    idx: int
    trace: object  # sim.traces.TraceJob (times in trace seconds)
    attempts: List[int] = field(default_factory=list)  # Slurm job ids, in order
    oom_attempts: int = 0


@dataclass
class LiveRun:
    policy: str
    jobs: List[LiveJob]
    rows: Dict[int, dict]  # Slurm job id -> sacct job row (collect/records.py)
    t0: float  # wall time of trace time ``start``
    start: float  # trace time of the first arrival
    speedup: float
    n_gpus: int
    wall_s: float = 0.0
    submit_lag_s: List[float] = field(default_factory=list)  # actual - intended submission (wall)


def trace_time(run: LiveRun, epoch: Optional[float]) -> Optional[float]:
    if epoch is None:
        return None
    return run.start + (epoch + SACCT_MIDPOINT_S - run.t0) * run.speedup


def _busy_gpu_time(spans_by_gpu):
    total = 0.0
    for spans in spans_by_gpu.values():
        spans.sort()
        end = None
        for s, e in spans:
            if end is None or s > end:
                total += e - s
                end = e
            elif e > end:
                total += e - end
                end = e
    return total


def job_times(run: LiveRun, truth: Truth, gpu_type: str) -> List[JobTimes]:
    """Per trace job: first submit and start, last end (None unless its last attempt COMPLETED), time run
    over all attempts, and the part of it shared with another job (and at a bad pair's speed)."""
    final = [run.rows[j.attempts[-1]] for j in run.jobs if j.attempts and j.attempts[-1] in run.rows]
    classes = {row["job_id"]: row.get("job_class") for row in final}
    shared, bad = defaultdict(float), defaultdict(float)
    for gpu, a, b, seconds in overlaps(final):
        shared[a] += seconds
        shared[b] += seconds
        if truth.pair(gpu_type, classes[a] or "unknown", classes[b] or "unknown") < BAD_PAIR:
            bad[a] += seconds
        if truth.pair(gpu_type, classes[b] or "unknown", classes[a] or "unknown") < BAD_PAIR:
            bad[b] += seconds
    out = []
    for job in run.jobs:
        rows = [run.rows[a] for a in job.attempts if a in run.rows]
        if not rows:
            out.append(JobTimes(job.trace.submit_time, None, None, job.trace.duration, job.trace.num_gpus))
            continue
        last = rows[-1]
        done = last["state"] == "COMPLETED" and last.get("end_time")
        ran = sum(max(0, (r["end_time"] or r["start_time"] or 0) - (r["start_time"] or 0))
                  for r in rows if r.get("start_time"))
        starts = [r["start_time"] for r in rows if r.get("start_time")]
        out.append(JobTimes(
            submit=trace_time(run, rows[0]["submit_time"]),
            start=trace_time(run, starts[0]) if starts else None,
            end=trace_time(run, last["end_time"]) if done else None,
            duration=job.trace.duration, n_gpus=job.trace.num_gpus, run_time=ran * run.speedup,
            shared_time=shared.get(last["job_id"], 0.0) * run.speedup,
            bad_time=bad.get(last["job_id"], 0.0) * run.speedup))
    return out


def summarize_live(run: LiveRun, truth: Truth, gpu_type: str) -> Dict[str, float]:
    """The simulator's figures (``sim/metrics.summarize_jobs``) for a live run, in trace seconds."""
    spans = defaultdict(list)
    for job in run.jobs:
        for attempt in job.attempts:
            row = run.rows.get(attempt)
            if row and row.get("start_time") and row.get("end_time"):
                for gpu in job_gpus(row) or {("?", attempt)}:
                    spans[gpu].append((row["start_time"], row["end_time"]))
    return summarize_jobs(job_times(run, truth, gpu_type), run.n_gpus, run.start,
                          _busy_gpu_time(spans) * run.speedup,
                          oom_events=sum(j.oom_attempts for j in run.jobs))


def measure_cadence(run: LiveRun) -> Dict[str, Optional[float]]:
    """How late the live system acted, in wall seconds (what ``replay/run.LiveCadence`` tells the
    simulator), from sacct's whole seconds (means are unbiased; single values are +-1 s):

    * ``end_to_cycle_s``: for each job that waited (started 2 s or more after its submission), its
      start minus the last end, at or after its submission, of a job on one of its GPUs;
    * ``launch_s``: for each completed job that never shared a GPU, its time in sacct minus its work
      (trace duration / speedup)."""
    rows = [run.rows[a] for j in run.jobs for a in j.attempts if a in run.rows]
    work = {a: j.trace.duration / run.speedup for j in run.jobs for a in j.attempts}
    ends = defaultdict(list)
    for row in rows:
        if row.get("start_time") is not None and row.get("end_time") is not None:
            for gpu in job_gpus(row):
                ends[gpu].append(row["end_time"])
    gaps, launches = [], []
    shared = {a for _gpu, a, b, _s in overlaps(rows) for a in (a, b)}
    for row in rows:
        start, submit, end = row.get("start_time"), row.get("submit_time"), row.get("end_time")
        if start is None or submit is None:
            continue
        if start - submit >= 2:
            before = [e for gpu in job_gpus(row) for e in ends[gpu] if submit <= e <= start]
            if before:
                gaps.append(start - max(before))
        if row["state"] == "COMPLETED" and end is not None and row["job_id"] not in shared:
            launches.append(end - start - work[row["job_id"]])

    def mean(values):
        return round(sum(values) / len(values), 3) if values else None

    return {"end_to_cycle_s": mean(gaps), "launch_s": mean(launches), "queued_starts": len(gaps),
            "jobs_alone": len(launches)}
