"""A job's solo GPU utilization predicted from its model, without profiling it (Horus).

Papers: Yeung, Borowiec, Friday, Harper, Garraghan, "Towards GPU Utilization Prediction for Cloud
Deep Learning", HotCloud 2020 (features of the model's computation graph — FLOPs, parameters, layers,
batch size — predict the GPU utilization NVML reports; RMSLE 0.154 on their measurements), and
"Horus: Interference-Aware and Prediction-Based Scheduling in Deep Learning Systems", IEEE TPDS
33(1), 2022 (the scheduler placing jobs by that prediction, no profiling run, no reserved GPUs).

Here:

* **Features** (``slurm_horus/data/model_features.csv``, one row per model, each with its source):
  forward multiply-accumulates per sample, parameters, weighted layers, the batch a class without
  ``-bs<N>`` runs, CPU time per sample the GPU waits for (environment steps of RL jobs) and a kind.
  A class name ``<model>[-<dataset>]-bs<batch>[-amp]`` (classes.py) is read into model, batch and
  mixed precision; the GPU type gives its peak throughput (gpus.py).
* **Prior** (no training, roofline-style, constants set a priori): per training step the GPU works
  ``T_gpu = 6·MACs·batch / (eff·peak) + kernels·4 µs`` and the host needs
  ``T_host = kernels·20 µs + batch·host time``, with 5 kernels per layer, ``eff`` 0.4 in FP32 and
  0.25 of the tensor-core peak with AMP; utilization = ``r / sqrt(1 + r²)`` with ``r = T_gpu/T_host``
  (the GPU is busy the whole step when it is the bottleneck, ``T_gpu/T_host`` of it when the host is).
* **Regression** (:meth:`UtilizationModel.fit`), on whatever utilizations were measured (a site's
  own NVML history; Lucid's in ``bench/bench_utilization.py``), over the log features (the prior's
  log-ratio, MACs per step, parameters, layers, batch, AMP) to the logit of the utilization:
  ``method="gbr"`` (default) gradient-boosted regression trees in numpy with scikit-learn's default
  settings (100 trees of depth 3, learning rate 0.1, squared error), or ``method="ridge"`` (ridge on
  the residual to the prior's logit). With nothing measured the prior answers.
  ``bench/bench_utilization.py`` compares them, and scikit-learn's own GradientBoostingRegressor,
  leaving one model out on Lucid: see docs/placement.md.

Classes whose model is not in the table get no prediction (None).
"""

import csv
import math
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

from .gpus import GPU_PEAK_TFLOPS

DATA = Path(__file__).resolve().parent.parent / "data" / "model_features.csv"
EFF_FP32, EFF_AMP = 0.4, 0.25  # achieved share of the peak in training
KERNELS_PER_LAYER = 5  # forward, two backward, normalization/activation, optimizer
LAUNCH_US, MIN_KERNEL_US = 20.0, 4.0  # host time to launch a kernel (eager PyTorch); GPU time of a tiny one
FEATURE_NAMES = ("log_ratio", "log_macs_step", "log_params", "log_layers", "log_batch", "amp")


def load_model_features(path=DATA) -> Dict[str, dict]:
    """model name -> its row of model_features.csv (numbers as floats)."""
    out = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            for key in ("macs_per_sample", "params", "layers", "default_batch", "host_us_per_sample"):
                row[key] = float(row[key])
            out[row["model"]] = row
    return out


def parse_class(name: str) -> Optional[Tuple[str, Optional[int], bool]]:
    """``resnet50-imagenet-bs64-amp`` -> (``resnet50``, 64, True); ``a3c`` -> (``a3c``, None, False)."""
    tokens = name.split("-")
    if not tokens or not tokens[0]:
        return None
    amp = tokens[-1] == "amp"
    batch = None
    for token in tokens[1:]:
        if token.startswith("bs") and token[2:].isdigit():
            batch = int(token[2:])
    return tokens[0], batch, amp


class UtilizationModel:
    """Predicted solo GPU utilization (percent) of a job class on a GPU type."""

    def __init__(self, features: Optional[Dict[str, dict]] = None, method: str = "gbr", ridge: float = 1.0):
        if method not in ("gbr", "ridge"):
            raise ValueError(f"utilization model: unknown method {method!r} (gbr or ridge)")
        self.features = features if features is not None else load_model_features()
        self.method = method
        self.ridge = ridge
        self.coef = None  # ridge coefficients; None: the prior answers
        self.booster = None  # gbr: the fitted trees
        self._center = self._spread = None

    # ---- features -------------------------------------------------------------------------------
    def raw(self, job_class: str, gpu_type: str) -> Optional[np.ndarray]:
        """Feature vector (FEATURE_NAMES) and the prior's logit, or None for an unknown model."""
        parsed = parse_class(job_class)
        if parsed is None or parsed[0] not in self.features:
            return None
        model, batch, amp = parsed
        row = self.features[model]
        batch = batch or row["default_batch"]
        fp32, tensor = GPU_PEAK_TFLOPS.get(gpu_type, GPU_PEAK_TFLOPS["v100"])
        rate = (EFF_AMP * tensor if amp else EFF_FP32 * fp32) * 1e12
        kernels = KERNELS_PER_LAYER * row["layers"]
        macs_step = row["macs_per_sample"] * batch
        t_gpu = 6.0 * macs_step / rate + kernels * MIN_KERNEL_US * 1e-6
        t_host = kernels * LAUNCH_US * 1e-6 + batch * row["host_us_per_sample"] * 1e-6
        ratio = t_gpu / t_host
        return np.array([math.log10(ratio), math.log10(macs_step), math.log10(row["params"]),
                         math.log10(row["layers"]), math.log10(batch), float(amp)])

    @staticmethod
    def prior_of(x: np.ndarray) -> float:
        """The prior's utilization (percent) from a feature vector."""
        ratio = 10.0 ** x[0]
        return 100.0 * ratio / math.sqrt(1.0 + ratio * ratio)

    def prior(self, job_class: str, gpu_type: str) -> Optional[float]:
        x = self.raw(job_class, gpu_type)
        return None if x is None else self.prior_of(x)

    # ---- fitting ---------------------------------------------------------------------------------
    def fit(self, samples: Iterable[Tuple[str, str, float]]) -> "UtilizationModel":
        """Learn from measured (job class, GPU type, utilization %) of classes whose model is known."""
        rows, targets = [], []
        for job_class, gpu_type, util in samples:
            x = self.raw(job_class, gpu_type)
            if x is not None and util is not None:
                rows.append(x)
                targets.append(_logit(util) - (_logit(self.prior_of(x)) if self.method == "ridge" else 0.0))
        self.coef = self.booster = None
        if len(rows) < 3:
            return self
        x = np.array(rows)
        if self.method == "gbr":
            self.booster = Booster().fit(x, np.array(targets))
            return self
        self._center, self._spread = x.mean(axis=0), x.std(axis=0) + 1e-9
        z = np.column_stack([np.ones(len(x)), (x - self._center) / self._spread])
        penalty = self.ridge * np.eye(z.shape[1])
        penalty[0, 0] = 0.0
        self.coef = np.linalg.solve(z.T @ z + penalty, z.T @ np.array(targets))
        return self

    # ---- predicting ------------------------------------------------------------------------------
    def predict(self, job_class: str, gpu_type: str) -> Optional[float]:
        """Utilization in percent, or None when the class's model is not in the feature table."""
        x = self.raw(job_class, gpu_type)
        if x is None:
            return None
        if self.booster is not None:
            return 100.0 / (1.0 + math.exp(-float(self.booster.predict(x[None, :])[0])))
        logit = _logit(self.prior_of(x))
        if self.coef is not None:
            logit += float(self.coef[0] + ((x - self._center) / self._spread) @ self.coef[1:])
        return 100.0 / (1.0 + math.exp(-logit))

    def predict_many(self, classes: Sequence[str], gpu_type: str) -> np.ndarray:
        """Array of utilizations (NaN for unknown models)."""
        return np.array([np.nan if (u := self.predict(c, gpu_type)) is None else u for c in classes])


def _logit(util_percent: float) -> float:
    p = min(max(util_percent / 100.0, 0.01), 0.995)
    return math.log(p / (1.0 - p))


class Booster:
    """Gradient-boosted regression trees for squared error, in numpy (scikit-learn's
    GradientBoostingRegressor defaults: 100 trees of depth 3, learning rate 0.1, leaves of ≥ 1 row).
    Small data only (the split search is exhaustive)."""

    def __init__(self, n_trees: int = 100, depth: int = 3, rate: float = 0.1):
        self.n_trees, self.depth, self.rate = n_trees, depth, rate
        self.base = 0.0
        self.trees = []

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Booster":
        self.base = float(y.mean())
        fit = np.full(len(y), self.base)
        self.trees = []
        for _ in range(self.n_trees):
            tree = _grow(x, y - fit, self.depth)
            self.trees.append(tree)
            fit += self.rate * _apply(tree, x)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.full(len(x), self.base)
        for tree in self.trees:
            out += self.rate * _apply(tree, x)
        return out


def _grow(x, r, depth):
    """A regression tree as nested tuples: (feature, threshold, left, right) or a leaf value."""
    if depth == 0 or len(r) < 2:
        return float(r.mean())
    best = None
    total, n = r.sum(), len(r)
    for f in range(x.shape[1]):
        order = np.argsort(x[:, f], kind="stable")
        xs, rs = x[order, f], r[order]
        left = np.cumsum(rs)[:-1]
        k = np.arange(1, n)
        gain = left ** 2 / k + (total - left) ** 2 / (n - k)  # SSE reduction up to a constant
        gain[xs[1:] == xs[:-1]] = -np.inf  # no split between equal values
        i = int(np.argmax(gain))
        if np.isfinite(gain[i]) and (best is None or gain[i] > best[0]):
            best = (gain[i], f, 0.5 * (xs[i] + xs[i + 1]))
    if best is None:
        return float(r.mean())
    _, f, threshold = best
    mask = x[:, f] <= threshold
    return (f, threshold, _grow(x[mask], r[mask], depth - 1), _grow(x[~mask], r[~mask], depth - 1))


def _apply(tree, x):
    if not isinstance(tree, tuple):
        return np.full(len(x), tree)
    f, threshold, left, right = tree
    mask = x[:, f] <= threshold
    out = np.empty(len(x))
    out[mask] = _apply(left, x[mask])
    out[~mask] = _apply(right, x[~mask])
    return out
