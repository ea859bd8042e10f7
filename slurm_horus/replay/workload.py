"""A Philly-like workload anyone may replay: drawn from the Philly sample shipped with slurm-horus.

:func:`philly_like`: ``n_jobs`` single-GPU jobs drawn (seeded, without replacement) from the jobs of
``slurm_horus/data/philly_sample.csv`` (800 jobs of Microsoft's Philly trace as cut by Pollux,
Apache-2.0; origin in ``slurm_horus/data/README.md``) that ran on one GPU for ``min_s``..``max_s``
seconds, kept in their order of arrival with their own durations; their arrival times are then
scaled so that the **offered load** -- the work they bring (GPU-seconds) over what ``n_gpus`` GPUs
do between the first and the last arrival -- is ``load``. Classes are left to the replay (drawn from
the truth's classes by seed, as the simulator does).
"""

import csv
from typing import List

import numpy as np

from ..errors import InputError
from ..resources import package_data_path
from ..sim.traces import TraceJob, read_trace


def offered_load(jobs: List[TraceJob], n_gpus: int) -> float:
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    work = sum(j.duration * j.num_gpus for j in jobs)
    return work / (n_gpus * span) if span > 0 else float("inf")


def philly_like(n_jobs: int = 120, load: float = 1.5, n_gpus: int = 8, min_s: float = 60.0,
                max_s: float = 3600.0, seed: int = 0) -> List[TraceJob]:
    pool = [j for j in read_trace(str(package_data_path("philly_sample.csv")))
            if j.num_gpus == 1 and min_s <= j.duration <= max_s]
    if n_jobs < 2 or n_jobs > len(pool):
        raise InputError(f"philly-like workload: {n_jobs} jobs asked, 2..{len(pool)} available")
    picks = sorted(np.random.default_rng(seed).choice(len(pool), n_jobs, replace=False))
    jobs = [pool[int(i)] for i in picks]
    first = jobs[0].submit_time
    scale = offered_load(jobs, n_gpus) / load
    return [TraceJob(f"philly{k}", (j.submit_time - first) * scale, j.duration, 1, user=j.user,
                     source=f"philly_sample.csv:{j.job_id}") for k, j in enumerate(jobs)]


def write_generic(jobs: List[TraceJob], path) -> None:
    """Write ``jobs`` in the generic trace format (``docs/simulator.md``)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "submit_time", "duration", "num_gpus", "user"])
        for j in jobs:
            writer.writerow([j.job_id, f"{j.submit_time:.3f}", f"{j.duration:.3f}", j.num_gpus, j.user])
