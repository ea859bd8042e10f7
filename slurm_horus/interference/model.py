"""Building, composing and storing models: the entry points the rest of slurm-horus uses."""

from .base import Prediction
from .cf import CFPredictor
from .chain import ChainPredictor
from .measured import MeasuredPredictor
from .mlp import DeepMLPPredictor, MLPPredictor
from .ncf import NCFPredictor
from .priors import builtin_priors
from .utilization import UtilizationPredictor

PREDICTORS = {
    "measured": MeasuredPredictor,
    "cf": CFPredictor,
    "utilization": UtilizationPredictor,
    "mlp": MLPPredictor,
    "mlp-deep": DeepMLPPredictor,
    "ncf": NCFPredictor,
    "chain": ChainPredictor,
}


def build_model(name="chain", profiles=None, observations=None, gpu_memory_mb=None, **options):
    """A fitted predictor ``name``; profiles/observations default to the built-in Gavel priors.

    ``gpu_memory_mb`` maps GPU type -> memory (MB), overriding the built-in sizes.
    """
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r} (known: {', '.join(sorted(PREDICTORS))})")
    if profiles is None and observations is None:
        profiles, observations = builtin_priors()
    model = PREDICTORS[name](gpu_memory_mb=gpu_memory_mb, **options)
    return model.fit(profiles or [], observations or [])


def explain_set(model, classes, gpu_type):
    """One Prediction (value and source) per job of a set sharing one GPU (see compose_norm_tputs)."""
    classes = list(classes)
    if len(classes) == 1:
        return [Prediction(1.0, "solo")]
    return [model.explain(job, classes[:i] + classes[i + 1:], gpu_type) for i, job in enumerate(classes)]


def predict_set(model, classes, gpu_type):
    """Normalized throughput of each job of a set sharing one GPU, in the order of ``classes``."""
    return [answer.norm_tput for answer in explain_set(model, classes, gpu_type)]


def model_from_dict(state):
    """Inverse of ``model.to_dict()``."""
    if state.get("format") != 1 or state.get("name") not in PREDICTORS:
        raise ValueError("not a stored slurm-horus interference model")
    options = dict(state["options"])
    for key in ("order", "layers"):
        if key in options:
            options[key] = tuple(options[key])
    model = PREDICTORS[state["name"]](gpu_memory_mb=state["gpu_memory_mb"], **options)
    return model._restore(state)
