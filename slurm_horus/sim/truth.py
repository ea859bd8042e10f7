"""The simulator's ground truth: how fast each job really runs next to its co-runners.

Only the simulator reads it (and the ``oracle`` policy, which exists to show the upper bound).
Truth sources (``--truth``): ``gavel:<gpu>`` (Gavel's measured pairs shipped as built-in priors),
a path to an observations CSV (``gpu_type,job_class,corunner_class,norm_tput``), ``none`` (no
interference: every job keeps full speed when sharing) or ``infeasible`` (no pair can run
together). A pair the truth does not list runs at ``missing`` (0.5, fair time slicing); a set of
three or more jobs composes its pair values by additive slowdown (``compose_norm_tputs``).

Besides co-location, the truth says what a placement itself costs a job (:meth:`Truth.job_factor`):

* **communication**: a multi-GPU job spread over more nodes than it needs (more than
  ⌈GPUs / GPUs per node⌉) runs at Gavel's measured unconsolidated/consolidated throughput ratio of
  its class and size (``gavel_scaling.csv``; a size not measured takes the nearest measured size
  below it, a class or GPU type not measured the median ratio of that size; capped at 1);
* **sub-batching**: a job run with a smaller per-step batch and gradient accumulation (SJF-BSBF)
  runs at the solo samples/s of the smaller batch over those of its own (Gavel measured every
  batch size of a model), for the rest of its run.
"""

import math
import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import InputError
from ..interference import compose_norm_tputs
from ..interference.base import Observation, Prediction, Predictor, SoloProfile
from ..interference.classes import micro_batch_speed
from ..interference.priors import builtin_scaling

SCALING_SIZES = (2, 4, 8)


class Truth:
    def __init__(self, observations: Iterable[Observation], profiles: Iterable[SoloProfile] = (),
                 classes: Optional[Sequence[str]] = None, missing: float = 0.5, name: str = "custom",
                 constant: Optional[float] = None,
                 scaling: Optional[Dict[Tuple[str, str, int], Tuple[float, float]]] = None):
        self.name = name
        # (gpu type, class, GPUs) -> (steps/s in one server, spread over servers); Gavel's by default
        self.scaling = builtin_scaling() if scaling is None else dict(scaling)
        self.missing = missing
        self._sets: Dict[tuple, List[float]] = {}  # set_tputs per (gpu type, classes): the truth is fixed
        self.constant = constant  # every pair has this value (the no-interference / infeasible truths)
        self.pairs: Dict[tuple, float] = {}
        seen: List[str] = []
        for obs in observations:
            self.pairs[(obs.gpu_type, obs.job_class, obs.corunner_class)] = float(obs.norm_tput)
            for c in (obs.job_class, obs.corunner_class):
                if c not in seen:
                    seen.append(c)
        self.solo: Dict[tuple, float] = {}
        for p in profiles:
            if p.solo_tput:
                self.solo[(p.gpu_type, p.job_class)] = float(p.solo_tput)
        self.classes: List[str] = list(classes) if classes else sorted(seen)
        self.gpu_types = sorted({k[0] for k in self.pairs})

    def pair(self, gpu_type: str, target: str, corunner: str) -> float:
        if self.constant is not None:
            return self.constant
        return self.pairs.get((gpu_type, target, corunner), self.missing)

    def set_tputs(self, classes: Sequence[str], gpu_type: str) -> List[float]:
        """True normalized throughput of each job of a set sharing one GPU (kept per set: the
        simulator asks for every GPU of a job at every start and end next to it)."""
        n = len(classes)
        if n == 1:
            return [1.0]
        key = (gpu_type, tuple(classes))
        found = self._sets.get(key)
        if found is not None:
            return found
        if n == 2:
            a, b = classes
            found = [min(1.0, self.pair(gpu_type, a, b)), min(1.0, self.pair(gpu_type, b, a))]
        else:
            found = [compose_norm_tputs([self.pair(gpu_type, c, o) for j, o in enumerate(classes) if j != i])
                     for i, c in enumerate(classes)]
        self._sets[key] = found
        return found

    def spread_factor(self, job_class: str, gpu_type: str, n_gpus: int) -> float:
        """Throughput of a ``n_gpus`` job spread over servers / the same job in one server (≤ 1)."""
        if n_gpus < 2 or not self.scaling:
            return 1.0
        size = max([s for s in SCALING_SIZES if s <= n_gpus] or [SCALING_SIZES[0]])

        def ratio(value):
            together, spread = value
            return min(1.0, spread / together) if together > 0 else 1.0

        found = self.scaling.get((gpu_type, job_class, size))
        if found is not None:
            return ratio(found)
        same = [ratio(v) for (g, _, s), v in self.scaling.items() if s == size and g == gpu_type]
        same = same or [ratio(v) for (_, _, s), v in self.scaling.items() if s == size]
        return float(statistics.median(same)) if same else 1.0

    def job_factor(self, job_class: str, run_class: str, gpu_type: str, n_gpus: int, nodes: int,
                   gpus_per_node: int) -> float:
        """What a placement costs a job regardless of its co-runners: communication when its GPUs span
        more nodes than needed, and the slower samples/s of a micro-batch (``run_class``) when sub-batched."""
        factor = 1.0
        if nodes > math.ceil(n_gpus / max(gpus_per_node, 1)):
            factor *= self.spread_factor(job_class, gpu_type, n_gpus)
        if run_class != job_class:
            speed = micro_batch_speed(job_class, self.solo_tput(job_class, gpu_type),
                                      run_class, self.solo_tput(run_class, gpu_type))
            factor *= speed if speed is not None else 1.0
        return factor

    def solo_tput(self, job_class: str, gpu_type: str) -> Optional[float]:
        found = self.solo.get((gpu_type, job_class))
        if found is None:
            for (t, c), v in self.solo.items():
                if c == job_class:
                    return v
        return found

    def has_class(self, job_class: str) -> bool:
        return job_class in self.classes

    def as_predictor(self) -> Predictor:
        return TruthPredictor(self)


class TruthPredictor(Predictor):
    """The truth behind the Predictor contract (for the oracle only)."""

    name = "truth"

    def __init__(self, truth: Truth):
        self.truth = truth

    def fit(self, profiles, observations):
        return self

    def explain(self, target, corunners, gpu_type):
        values = [self.truth.pair(gpu_type, target, c) for c in corunners]
        return Prediction(compose_norm_tputs(values) if values else 1.0, "truth")

    def predict_pairs(self, targets, corunners, gpu_type):
        import numpy as np  # here, so that the fake GPU jobs read the truth without numpy

        return np.array([self.truth.pair(gpu_type, t, c) for t, c in zip(targets, corunners)], dtype=float)


def load_truth(spec: str, profiles_path: Optional[str] = None) -> Truth:
    """``gavel:v100`` | ``none`` | ``infeasible`` | path to observations.csv."""
    from ..interference import builtin_priors, load_observations_csv, load_profiles_csv

    prior_profiles, prior_obs = builtin_priors()
    profiles = list(prior_profiles)
    if profiles_path:
        profiles += list(load_profiles_csv(profiles_path))
    if spec in ("none", "infeasible"):
        classes = sorted({p.job_class for p in prior_profiles})
        return Truth([], profiles, classes=classes, name=spec, constant=1.0 if spec == "none" else 0.0)
    if spec.startswith("gavel:"):
        gpu = spec.split(":", 1)[1].lower()
        obs = [o for o in prior_obs if o.gpu_type == gpu]
        if not obs:
            known = sorted({o.gpu_type for o in prior_obs})
            raise InputError(f"--truth {spec}: no Gavel measurements for {gpu!r} (known: {', '.join(known)})")
        return Truth(obs, profiles, name=spec)
    try:
        obs = list(load_observations_csv(spec))
    except FileNotFoundError:
        raise InputError(f"--truth {spec}: no such file (or use gavel:<gpu>, none, infeasible)") from None
    if not obs:
        raise InputError(f"--truth {spec}: no observations in the file")
    return Truth(obs, profiles, name=spec)
