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


def class_summary(model, gpu_types=None):
    """What a fitted table model knows of each class, per GPU type: [{gpu_type, job_class, gpu_util,
    mem_util, gmem_mb, solo_tput (the class's own profile there; None where not measured),
    measured_pairs (observations with it as the target there), partners_known (classes it has a
    model answer with, other than the conservative default), partners (all known classes),
    cannot_share_with (partners it never fits beside)}]."""
    from .table import SOURCE_CODE

    names = list(model.index.names)
    rows = []
    for gpu in gpu_types or model.gpu_types:
        own = {f: model.profile_table.own(f, gpu) for f in ("gpu_util", "mem_util", "gmem_mb", "solo_tput")}
        _full, codes, _rows, _code_rows = model._table(gpu)
        measured = {}
        for obs in model.observations:
            if obs.gpu_type == gpu:
                measured[obs.job_class] = measured.get(obs.job_class, 0) + 1
        for i, name in enumerate(names):
            row = codes[i, :len(names)]
            rows.append({
                "gpu_type": gpu, "job_class": name,
                **{f: (None if own[f][i] != own[f][i] else round(float(own[f][i]), 3)) for f in own},
                "measured_pairs": measured.get(name, 0),
                "partners_known": int((row != SOURCE_CODE["default"]).sum()),
                "cannot_share_with": int((row == SOURCE_CODE["memory"]).sum()),
                "partners": len(names),
            })
    return rows
