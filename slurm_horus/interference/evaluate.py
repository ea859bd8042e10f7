"""Scoring a fitted predictor on held-out observations (used by ``horus model eval`` and bench/)."""

import numpy as np
from scipy.stats import spearmanr


def predict_observations(model, observations):
    """(truth, predicted, sources) arrays in the order of ``observations``."""
    truth = np.array([o.norm_tput for o in observations], dtype=float)
    predicted = np.zeros(len(observations))
    sources = np.empty(len(observations), dtype=object)
    by_gpu = {}
    for i, o in enumerate(observations):
        by_gpu.setdefault(o.gpu_type, []).append(i)
    for gpu, rows in by_gpu.items():
        targets = [observations[i].job_class for i in rows]
        corunners = [observations[i].corunner_class for i in rows]
        predicted[rows] = model.predict_pairs(targets, corunners, gpu)
        sources[rows] = model.sources_pairs(targets, corunners, gpu)
    return truth, predicted, sources


def score(truth, predicted, sources=None):
    """MAE, RMSE, Spearman, share of infeasible pairs predicted feasible, coverage, count."""
    truth, predicted = np.asarray(truth, float), np.asarray(predicted, float)
    error = predicted - truth
    infeasible = truth <= 0
    result = {
        "n": int(len(truth)),
        "mae": float(np.mean(np.abs(error))) if len(truth) else float("nan"),
        "rmse": float(np.sqrt(np.mean(error ** 2))) if len(truth) else float("nan"),
        "spearman": _spearman(truth, predicted),
        "infeasible_predicted_feasible": float(np.mean(predicted[infeasible] > 0)) if infeasible.any() else 0.0,
    }
    if sources is not None:
        result["coverage"] = float(np.mean(np.asarray(sources) != "default")) if len(truth) else 0.0
    return result


def _spearman(truth, predicted):
    if len(truth) < 2 or np.all(truth == truth[0]) or np.all(predicted == predicted[0]):
        return float("nan")
    return float(spearmanr(truth, predicted).correlation)


def evaluate(model, observations):
    return score(*predict_observations(model, observations))
