"""Metrics of a run (all times in seconds): one place computes makespan, JCT and the rest, for the
simulator's runs and for the live runs of ``horus replay`` (read from sacct) alike."""

import csv
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .engine import SimResult

RUN_KEYS = ("makespan", "mean_jct", "median_jct", "p99_jct", "mean_queueing_delay",
            "gpu_allocation_ratio", "effective_utilization", "shared_share", "mean_shared_slowdown",
            "bad_pair_share", "oom_events", "preemptions", "jobs", "unfinished")
# what a simulated policy knew of durations (summarize adds them; a live run has none)
KNOWLEDGE_KEYS = ("durations", "duration_mare", "estimator")
SUMMARY_KEYS = RUN_KEYS + KNOWLEDGE_KEYS


@dataclass
class JobTimes:
    """One job of a run, as the metrics need it (a simulated job or one read back from sacct)."""

    submit: float
    start: Optional[float]  # first start
    end: Optional[float]  # None: never finished
    duration: float  # its work alone (the trace's duration), seconds
    n_gpus: int = 1
    run_time: float = 0.0  # time it held GPUs, all attempts
    shared_time: float = 0.0  # of which another job was on one of its GPUs
    bad_time: float = 0.0  # of which it ran at a true normalized throughput < 0.85


def job_times(result: SimResult) -> List[JobTimes]:
    return [JobTimes(j.trace.submit_time, j.first_start, j.end, j.trace.duration, j.req.n_gpus, j.run_time,
                     j.shared_time if j.ever_shared else 0.0, j.bad_time) for j in result.jobs]


def summarize(result: SimResult) -> Dict[str, float]:
    """The figures of a simulated run (see :func:`summarize_jobs`), with what it knew of durations
    (:func:`_knowledge`)."""
    return summarize_jobs(job_times(result), result.n_gpus, result.start_time, result.busy_gpu_time,
                          result.oom_events, result.preemptions) | _knowledge(result)


def summarize_jobs(jobs: Sequence[JobTimes], n_gpus: int, start_time: float, busy_gpu_time: float,
                   oom_events: int = 0, preemptions: int = 0) -> Dict[str, float]:
    """Makespan, JCT statistics, queueing delay, allocation and effective utilization, sharing quality.

    ``effective_utilization`` = useful work (solo GPU-seconds of the finished jobs) / (GPUs ×
    makespan): 1.0 is a cluster doing one job's worth of work per GPU all the time; sharing can
    exceed 1. ``gpu_allocation_ratio`` = allocated GPU-time (``busy_gpu_time``: GPU-seconds with at
    least one job) / (GPUs × makespan). ``shared_share`` = job-time spent with another job on one of
    its GPUs / job-time. ``bad_pair_share`` = job-time spent shared at a true normalized throughput
    < 0.85 / job-time.
    """
    done = [j for j in jobs if j.end is not None]
    if not done:
        return {k: 0.0 for k in RUN_KEYS} | {"jobs": len(jobs), "unfinished": len(jobs)}
    submit = np.array([j.submit for j in done])
    end = np.array([j.end for j in done])
    first = np.array([j.start for j in done])
    jct = end - submit
    makespan = float(end.max() - start_time)
    work = float(sum(j.duration * j.n_gpus for j in done))
    capacity = n_gpus * makespan if makespan > 0 else 1.0
    shared = [j for j in done if j.shared_time > 0 and j.duration > 0]
    run_time = float(sum(j.run_time for j in done))
    return {
        "makespan": makespan,
        "mean_jct": float(jct.mean()),
        "median_jct": float(np.median(jct)),
        "p99_jct": float(np.percentile(jct, 99)),
        "mean_queueing_delay": float((first - submit).mean()),
        "gpu_allocation_ratio": busy_gpu_time / capacity,
        "effective_utilization": work / capacity,
        "shared_share": float(sum(j.shared_time for j in done) / run_time) if run_time > 0 else 0.0,
        "mean_shared_slowdown": float(np.mean([j.run_time / j.duration for j in shared])) if shared else 1.0,
        "bad_pair_share": float(sum(j.bad_time for j in done) / run_time) if run_time > 0 else 0.0,
        "oom_events": int(oom_events),
        "preemptions": int(preemptions),
        "jobs": len(jobs),
        "unfinished": len(jobs) - len(done),
    }


def _knowledge(result: SimResult) -> dict:
    """``durations``: what the policy knew of durations ("estimated", "oracle" or "limit");
    ``duration_mare``: the median absolute relative error of the durations it used (0 with oracle
    durations); ``estimator``: the duration estimator's error figures (``estimate_errors``), reported
    even when the policy used the true durations."""
    errors = result.duration_errors or {}
    mare = 0.0 if result.durations == "oracle" else errors.get("mare", 0.0)
    return {"durations": result.durations, "duration_mare": mare, "estimator": errors}


def jct_by_kind(result: SimResult, kind: str) -> float:
    values = [j.end - j.trace.submit_time for j in result.jobs if j.end is not None and j.trace.kind == kind]
    return float(np.mean(values)) if values else 0.0


JOB_COLUMNS = ("policy", "job_id", "job_class", "kind", "num_gpus", "submit_time", "start_time", "end_time",
               "jct", "queueing_delay", "duration", "estimated_duration", "estimate_source", "run_time",
               "shared_time", "bad_pair_time", "ooms", "preemptions")


def job_rows(result: SimResult) -> List[dict]:
    rows = []
    for j in result.jobs:
        rows.append({
            "policy": result.policy, "job_id": j.req.job_id, "job_class": j.req.job_class, "kind": j.trace.kind,
            "num_gpus": j.req.n_gpus, "submit_time": j.trace.submit_time, "start_time": j.first_start,
            "end_time": j.end, "jct": None if j.end is None else j.end - j.trace.submit_time,
            "queueing_delay": None if j.first_start is None else j.first_start - j.trace.submit_time,
            "duration": j.trace.duration,
            "estimated_duration": j.estimate.seconds if j.estimate is not None else None,
            "estimate_source": j.estimate.source if j.estimate is not None else None, "run_time": j.run_time, "shared_time": j.shared_time,
            "bad_pair_time": j.bad_time, "ooms": j.ooms, "preemptions": j.preemptions})
    return rows


def write_jobs_csv(path, results: List[SimResult]):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=JOB_COLUMNS)
        writer.writeheader()
        for result in results:
            for row in job_rows(result):
                writer.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
