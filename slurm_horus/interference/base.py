"""What the rest of slurm-horus may rely on from the interference model (the contract).

A *job class* is a string (``resnet50-bs64``, ``lm-bs20``...). A GPU type is a lower-case string
(``v100``, ``p100``, ``rtx3090``). The one question everything downstream asks:

    predict(target_class, corunner_classes, gpu_type) -> normalized throughput in [0, 1]

(the fraction of its solo speed the target keeps; 0 means the set cannot run together, e.g. OOM;
slowdown = 1 / normalized throughput). This module is pure: numpy/scipy only, no Slurm, no SQLite.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple


@dataclass(frozen=True)
class SoloProfile:
    """How a job class behaves alone on one GPU type. Any measurement may be None (unknown)."""

    job_class: str
    gpu_type: str
    gpu_util: Optional[float] = None  # NVML duty cycle, 0..100
    mem_util: Optional[float] = None  # memory-controller utilization, 0..100
    gmem_mb: Optional[float] = None  # peak GPU memory, MB
    solo_tput: Optional[float] = None  # throughput alone (steps/s or samples/s)
    extra: Dict[str, float] = field(default_factory=dict)  # richer features when known


@dataclass(frozen=True)
class Observation:
    """On ``gpu_type``, ``job_class`` sharing with ``corunner_class`` kept ``norm_tput`` of its solo speed."""

    gpu_type: str
    job_class: str
    corunner_class: str
    norm_tput: float


@dataclass(frozen=True)
class Prediction:
    norm_tput: float
    source: str  # which predictor answered: measured, cf, mlp, utilization, default, memory


class Predictor:
    """Interface shared by every predictor (utilization, cf, mlp, measured, chain)."""

    name = "base"

    def fit(self, profiles: Sequence[SoloProfile], observations: Sequence[Observation]) -> "Predictor":
        raise NotImplementedError

    def predict(self, target: str, corunners: Sequence[str], gpu_type: str) -> float:
        return self.explain(target, corunners, gpu_type).norm_tput

    def explain(self, target: str, corunners: Sequence[str], gpu_type: str) -> Prediction:
        raise NotImplementedError

    def predict_pairs(self, targets, corunners, gpu_type: str):
        """Vectorized pair prediction: arrays of target and co-runner classes -> numpy array."""
        raise NotImplementedError

    def covers(self, target: str, corunner: str, gpu_type: str) -> bool:
        """Whether this predictor has its own answer for the pair (used by chain)."""
        return True


PairKey = Tuple[str, str, str]  # (gpu_type, job_class, corunner_class)


def compose_norm_tputs(pair_values):
    """Normalized throughput of a job sharing a GPU with several co-runners, from its pair values.

    Rule (additive slowdown): each co-runner K_i alone would stretch the target's step time by
    ``1/x_i - 1``; with several co-runners the stretches add up, so
    ``x = 1 / (1 + sum_i (1/x_i - 1))``. It reduces to ``x_1`` for one co-runner, gives ``1/n`` for n
    jobs that each time-slice the GPU evenly (every ``x_i = 1/2``), never exceeds the smallest pair
    value, and is 0 as soon as one pair cannot run together. Pair values are clipped to [0, 1] first.
    """
    stretch = 0.0
    for value in pair_values:
        value = min(1.0, float(value))
        if value <= 0.0:
            return 0.0
        stretch += 1.0 / value - 1.0
    return 1.0 / (1.0 + stretch)
