"""Resizable (elastic) training jobs as the placement core sees them, and the group knapsack.

An elastic job (Pollux, DeepBoot) runs on any number of replicas between 1 and ``max_replicas``; its
:class:`ElasticSpec` says how fast it progresses on each count (``goodput[r - 1]``: the share of the
job done per second on ``r`` GPUs packed on as few nodes as possible), which is what a Pollux-style
scheduler learns from the job's own profile. The scheduler reallocates such jobs in rounds: it picks a
replica count per job (:func:`group_knapsack`), and takes GPUs back from one job without stopping it
(:class:`Shrink`). Pure: numpy only.
"""

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class ElasticSpec:
    """How a resizable job scales: ``goodput[r - 1]`` = job fraction per second on ``r`` replicas."""

    goodput: Tuple[float, ...]
    application: str = ""

    @property
    def max_replicas(self) -> int:
        return len(self.goodput)

    def at(self, replicas: int) -> float:
        """Goodput on ``replicas`` GPUs (0 on none; beyond the curve, its last value)."""
        if replicas <= 0 or not self.goodput:
            return 0.0
        return self.goodput[min(replicas, len(self.goodput)) - 1]


@dataclass
class ElasticJob:
    """One training job in an allocation round: running (``replicas`` > 0) or waiting (0)."""

    job_id: str
    spec: ElasticSpec
    replicas: int  # GPUs it holds now
    submit_time: float
    restarts: int = 0  # reallocations it has had since its first start
    attained: float = 0.0  # GPU-seconds it has received (queue order of the round)
    max_replicas: int = 0  # the most replicas it may get this round (0: its spec's limit)


@dataclass(frozen=True)
class Shrink:
    """Take ``gpus`` back from running job ``job_id``, which keeps running on the rest (elastic
    reclaim); a job left with no GPU is preempted."""

    job_id: str
    gpus: Tuple[int, ...]


def group_knapsack(choices: Sequence[Sequence[Tuple[int, float]]], capacity: int) -> List[int]:
    """Pick at most one (weight, value) option per group, total weight ≤ ``capacity``, maximum total
    value; a group may also get nothing (weight 0). Returns the chosen weight of each group (0: none).

    The dynamic program of the multiple-choice knapsack, one numpy pass per group: ``best[j]`` is the
    highest value with at most ``j`` of the capacity used by the groups so far. Ties go to the earlier
    groups' smaller options, as a backward scan over the table finds them.
    """
    capacity = max(0, int(capacity))
    n = len(choices)
    table = np.zeros((n + 1, capacity + 1))
    picks = np.zeros((n + 1, capacity + 1), dtype=np.int64)
    for i, options in enumerate(choices, 1):
        prev = table[i - 1]
        best = prev.copy()
        pick = np.zeros(capacity + 1, dtype=np.int64)
        for weight, value in options:
            if weight <= 0 or weight > capacity:
                continue
            cand = np.full(capacity + 1, -np.inf)
            cand[weight:] = prev[:capacity + 1 - weight] + value
            better = cand > best + 1e-12
            best = np.where(better, cand, best)
            pick = np.where(better, weight, pick)
        table[i], picks[i] = best, pick
    out = [0] * n
    j = capacity
    for i in range(n, 0, -1):
        w = int(picks[i][j])
        out[i - 1] = w
        j -= w
    return out


def restart_factor(age: float, restarts: int, delay: float = 10.0) -> float:
    """DeepBoot's (and Pollux's) restart penalty: a reallocation is worth ``(age − restarts × delay) /
    (age + delay)`` of its speed-up, so a young or often restarted job is not moved for a small gain."""
    return max(age - restarts * delay, 0.0) / (age + delay)


def packed_nodes(replicas: int, gpus_per_node: int) -> int:
    return -(-replicas // max(1, gpus_per_node))


def fair_replicas(capacity: int, n_jobs: int) -> int:
    """Pollux's fair share: every job's goodput is measured against its goodput on this many GPUs."""
    return max(1, -(-capacity // max(1, n_jobs)))


def speedups(job: ElasticJob, fair: int, limit: int) -> Dict[int, float]:
    """Speed-up of ``job`` on 1..``limit`` replicas relative to its fair share (Pollux's speedup_fn)."""
    base = job.spec.at(fair) or job.spec.at(1) or 1.0
    return {r: job.spec.at(r) / base for r in range(1, limit + 1)}
