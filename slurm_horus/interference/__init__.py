"""Interference model: how much of its solo speed a DL job keeps when sharing a GPU.

Public API (others code against these names): see docs/interference.md. The names are imported on
first use, so that a light user (the fake GPU jobs, which read only the pair data and the
composition rule) does not pay for the predictors and scipy.
"""

import importlib

_HOMES = {
    ".base": ("Observation", "Prediction", "Predictor", "SoloProfile", "compose_norm_tputs"),
    ".classes": ("class_name", "gavel_class"),
    ".gpus": ("GPU_MEMORY_MB", "gpu_memory_mb"),
    ".io": ("load_observations_csv", "load_profiles_csv", "write_observations_csv", "write_profiles_csv"),
    ".model": ("PREDICTORS", "build_model", "class_summary", "explain_set", "model_from_dict", "predict_set"),
    ".priors": ("builtin_priors",),
    ".table": ("SOURCES",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Observation", "Prediction", "Predictor", "SoloProfile", "compose_norm_tputs", "class_name", "gavel_class",
    "GPU_MEMORY_MB", "gpu_memory_mb", "load_observations_csv", "load_profiles_csv", "write_observations_csv",
    "write_profiles_csv", "PREDICTORS", "build_model", "class_summary", "model_from_dict", "predict_set", "explain_set", "builtin_priors",
    "SOURCES",
]


def __getattr__(name):
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
