"""Interference model: how much of its solo speed a DL job keeps when sharing a GPU.

Public API (others code against these names): see docs/interference.md.
"""

from .base import Observation, Prediction, Predictor, SoloProfile, compose_norm_tputs
from .classes import class_name, gavel_class
from .gpus import GPU_MEMORY_MB, gpu_memory_mb
from .io import load_observations_csv, load_profiles_csv, write_observations_csv, write_profiles_csv
from .model import PREDICTORS, build_model, class_summary, explain_set, model_from_dict, predict_set
from .priors import builtin_priors
from .table import SOURCES

__all__ = [
    "Observation", "Prediction", "Predictor", "SoloProfile", "compose_norm_tputs", "class_name", "gavel_class",
    "GPU_MEMORY_MB", "gpu_memory_mb", "load_observations_csv", "load_profiles_csv", "write_observations_csv",
    "write_profiles_csv", "PREDICTORS", "build_model", "class_summary", "model_from_dict", "predict_set", "explain_set", "builtin_priors",
    "SOURCES",
]
