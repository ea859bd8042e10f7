"""The simulator's ground truth: how fast each job really runs next to its co-runners.

Only the simulator reads it (and the ``oracle`` policy, which exists to show the upper bound).
Truth sources (``--truth``): ``gavel:<gpu>`` (Gavel's measured pairs shipped as built-in priors),
a path to an observations CSV (``gpu_type,job_class,corunner_class,norm_tput``), ``none`` (no
interference: every job keeps full speed when sharing) or ``infeasible`` (no pair can run
together). A pair the truth does not list runs at ``missing`` (0.5, fair time slicing); a set of
three or more jobs composes its pair values by additive slowdown (``compose_norm_tputs``).
"""

from typing import Dict, Iterable, List, Optional, Sequence

from ..errors import InputError
from ..interference import compose_norm_tputs
from ..interference.base import Observation, Prediction, Predictor, SoloProfile


class Truth:
    def __init__(self, observations: Iterable[Observation], profiles: Iterable[SoloProfile] = (),
                 classes: Optional[Sequence[str]] = None, missing: float = 0.5, name: str = "custom",
                 constant: Optional[float] = None):
        self.name = name
        self.missing = missing
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
        """True normalized throughput of each job of a set sharing one GPU."""
        n = len(classes)
        if n == 1:
            return [1.0]
        if n == 2:
            a, b = classes
            return [min(1.0, self.pair(gpu_type, a, b)), min(1.0, self.pair(gpu_type, b, a))]
        return [compose_norm_tputs([self.pair(gpu_type, c, o) for j, o in enumerate(classes) if j != i])
                for i, c in enumerate(classes)]

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
