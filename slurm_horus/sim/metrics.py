"""Metrics of a simulation run (all times in seconds)."""

import csv
from typing import Dict, List

import numpy as np

from .engine import SimResult

SUMMARY_KEYS = ("makespan", "mean_jct", "median_jct", "p99_jct", "mean_queueing_delay",
                "gpu_allocation_ratio", "effective_utilization", "mean_shared_slowdown", "bad_pair_share",
                "oom_events", "preemptions", "jobs", "unfinished", "durations", "duration_mare", "estimator")


def summarize(result: SimResult) -> Dict[str, float]:
    """Makespan, JCT statistics, queueing delay, allocation and effective utilization, sharing quality.

    ``effective_utilization`` = useful work (solo GPU-seconds of the finished jobs) / (GPUs ×
    makespan): 1.0 is a cluster doing one job's worth of work per GPU all the time; sharing can
    exceed 1. ``gpu_allocation_ratio`` = allocated GPU-time / (GPUs × makespan).
    ``bad_pair_share`` = job-time spent shared at a true normalized throughput < 0.85 / job-time.
    ``durations``: what the policy knew of durations ("estimated" or "oracle"); ``duration_mare``: the
    median absolute relative error of the durations it used (0 with oracle durations);
    ``estimator``: the duration estimator's error figures (``estimate_errors``), reported even when
    the policy used the true durations.
    """
    done = [j for j in result.jobs if j.end is not None]
    knowledge = _knowledge(result)
    if not done:
        return {k: 0.0 for k in SUMMARY_KEYS} | knowledge | {"jobs": len(result.jobs),
                                                              "unfinished": len(result.jobs)}
    submit = np.array([j.trace.submit_time for j in done])
    end = np.array([j.end for j in done])
    first = np.array([j.first_start for j in done])
    jct = end - submit
    makespan = float(end.max() - result.start_time)
    work = float(sum(j.trace.duration * j.req.n_gpus for j in done))
    capacity = result.n_gpus * makespan if makespan > 0 else 1.0
    shared = [j for j in done if j.ever_shared and j.trace.duration > 0]
    run_time = float(sum(j.run_time for j in done))
    return {
        "makespan": makespan,
        "mean_jct": float(jct.mean()),
        "median_jct": float(np.median(jct)),
        "p99_jct": float(np.percentile(jct, 99)),
        "mean_queueing_delay": float((first - submit).mean()),
        "gpu_allocation_ratio": result.busy_gpu_time / capacity,
        "effective_utilization": work / capacity,
        "mean_shared_slowdown": float(np.mean([j.run_time / j.trace.duration for j in shared])) if shared else 1.0,
        "bad_pair_share": float(sum(j.bad_time for j in done) / run_time) if run_time > 0 else 0.0,
        "oom_events": int(result.oom_events),
        "preemptions": int(result.preemptions),
        "jobs": len(result.jobs),
        "unfinished": len(result.jobs) - len(done),
    } | knowledge


def _knowledge(result: SimResult) -> dict:
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
