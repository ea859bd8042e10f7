"""What is asked (JobRequest) and what is answered (Decision)."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .elastic import ElasticSpec


class SharedEstimate:
    """One duration estimate that several waiting requests carry (the simulator's queue estimates,
    for a queue whose order reads no duration): a new estimate is one assignment here, not one per
    job. The queue counts the jobs and GPUs that carry it and hands each its value when it leaves."""

    __slots__ = ("seconds", "sigma", "jobs", "gpus")

    def __init__(self, seconds: float, sigma: Optional[float]):
        self.seconds = seconds
        self.sigma = sigma
        self.jobs = 0  # waiting jobs that carry it
        self.gpus = 0  # the GPUs they ask for


@dataclass
class JobRequest:
    """A job waiting for GPUs, as the scheduler sees it at submission."""

    job_id: str
    job_class: str
    gpus_per_node: int = 1
    nodes: int = 1
    mem_mb: float = 0.0  # per GPU; 0 = unknown (memory is then not checked)
    partition: str = ""  # "" = any partition
    time_limit: Optional[float] = None  # seconds
    predicted_duration: Optional[float] = None  # seconds alone on a GPU
    # spread of that estimate: standard deviation of log(run time) (the duration estimator's
    # ``log_sigma``); None: the duration is taken as known (the simulator's oracle durations)
    duration_sigma: Optional[float] = None
    user: str = ""
    submit_time: float = 0.0
    exclusive: bool = False  # the user asked for whole GPUs
    extra_partitions: Tuple[str, ...] = ()  # partitions it may borrow from (DeepBoot lending)
    application: str = ""  # what it runs (DeepBoot: an inference pod kept warm serves one application)
    elastic: Optional[ElasticSpec] = None  # resizable: the scheduler picks its replica count
    gpu_type: str = ""  # "" = any; else only GPUs of this type (the user asked for it)
    # fractional GPU (issue 21): units of one GPU's capacity (milli-GPU in the simulator, shards on a
    # live shard cluster); 0 = not a fraction (whole GPUs, or the interference model's sharing)
    gpu_units: int = 0
    cpu_milli: float = 0.0  # per node; 0 = not checked
    memory_mib: float = 0.0  # host memory per node; 0 = not checked
    gpu_types: Tuple[str, ...] = ()  # any of these GPU types (Alibaba's gpu_spec ``V100M16|V100M32``)
    # while it waits, the estimate it shares with the jobs of its group (``predicted_duration`` and
    # ``duration_sigma`` are then those it had when queued; the queue writes them back when it leaves)
    shared_estimate: Optional[SharedEstimate] = field(default=None, repr=False, compare=False)

    def duration_spread(self) -> Optional[float]:
        """The spread (log-σ) of the expected duration (``duration_sigma``, or the shared estimate's)."""
        shared = self.shared_estimate
        return shared.sigma if shared is not None else self.duration_sigma

    @property
    def n_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def expected_duration(self, default: float = 3600.0) -> float:
        """Best guess of the run time alone: prediction, else time limit, else ``default``."""
        shared = self.shared_estimate
        if shared is not None and shared.seconds > 0:
            return float(shared.seconds)
        if self.predicted_duration is not None and self.predicted_duration > 0:
            return float(self.predicted_duration)
        if self.time_limit is not None and self.time_limit > 0:
            return float(self.time_limit)
        return default


@dataclass
class Candidate:
    """One placement that was considered (for ``--explain``)."""

    where: str  # "node:gpu0,gpu1"
    score: float
    shared: bool
    job_tput: float
    note: str = ""
    corunner_tput: float = 1.0  # predicted throughput the job already on that GPU keeps (1.0: none)


@dataclass
class Decision:
    """The answer for one JobRequest. ``placed`` False means: keep waiting (``reason`` says why)."""

    job_id: str
    placed: bool
    policy: str = ""
    nodes: List[str] = field(default_factory=list)
    gpus: Dict[str, List[int]] = field(default_factory=dict)  # node -> GPU indices
    gpu_ids: Tuple[int, ...] = ()  # flat ids in the ClusterState
    shared: bool = False
    predicted_norm_tput: float = 1.0  # of the job itself
    predicted_slowdown: float = 1.0
    corunner_norm_tput: Dict[str, float] = field(default_factory=dict)  # job_id -> its tput after
    reason: str = ""
    candidates: List[Candidate] = field(default_factory=list)
    # run with a smaller per-step batch and accumulate gradients (SJF-BSBF, when a pair does not fit
    # in memory otherwise): ``micro_batch`` samples per step, ``grad_accum`` steps per update, the
    # global batch unchanged; 0 / 1 = as submitted. Reaches the job as HORUS_MICRO_BATCH / HORUS_GRAD_ACCUM.
    micro_batch: int = 0
    grad_accum: int = 1
    n_feasible: int = 0  # GPUs that passed the filter (``candidates`` lists the best of them)
    cpu_node: int = -1  # a CPU-only job's node id in the ClusterState

    @property
    def exclusive(self) -> bool:
        return self.placed and not self.shared

    def to_dict(self) -> dict:
        return {
            "job_id": self.job_id, "placed": self.placed, "policy": self.policy,
            "nodes": list(self.nodes), "gpus": {k: list(v) for k, v in self.gpus.items()},
            "shared": self.shared, "predicted_norm_tput": round(self.predicted_norm_tput, 4),
            "predicted_slowdown": round(self.predicted_slowdown, 4),
            "corunner_norm_tput": {k: round(v, 4) for k, v in self.corunner_norm_tput.items()},
            "reason": self.reason, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "candidates": [{"where": c.where, "score": round(c.score, 4), "shared": c.shared,
                            "job_tput": round(c.job_tput, 4), "note": c.note} for c in self.candidates],
        }
