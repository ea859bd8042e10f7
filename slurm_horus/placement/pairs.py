"""Pair predictions as dense per-GPU-type matrices, refreshed by what is observed during the run.

``PairTable.matrix(gpu_type)[a, b]`` is the predicted normalized throughput of class ``a`` sharing a
GPU with class ``b``. Rows are filled lazily from a Predictor (one vectorized ``predict_pairs`` call
per new class), so the decision path never calls the model. ``observe()`` records a measured pair:
from then on the running mean of what was seen replaces the model's answer for that pair, which is
how a policy learns the cluster it runs on.

Every value carries its confidence: ``PairTable.sigma(gpu_type)[a, b]`` is the standard deviation of
the prediction's error, by where the value came from (``SOURCE_SIGMA``: 1.25 × the mean absolute error
each predictor showed on pairs it had not seen, ``bench/bench_interference.py`` in
docs/interference.md — cf 0.079 on a new GPU type, mlp 0.101, utilization 0.074 on a new class; the
default prior is a guess over the whole range, σ of a uniform value on [0, 1]); a pair measured on
this cluster has ``OBSERVED_SIGMA / sqrt(times measured)``.

With ``calibrate`` > 0 the measured pairs also correct the predictions of the pairs not measured yet
on their GPU type, as collaborative filtering's bias terms do: the residuals r = measured − predicted
are fitted by an offset of the GPU type (μ), one per class as the target (β) and one per class as the
co-runner (γ), each a shrunk mean (``calibrate`` is the number of pairs a mean counts as already having
seen at 0), and an unmeasured pair is predicted ``prior + μ + β_target + γ_corunner`` (clipped to [0,
1.5]; a pair the predictor is sure of, σ 0, such as one that does not fit in memory, is left alone).
A new GPU type is then learned from a few measured pairs per class instead of one pair at a time: on
the three truths of ``bench/bench_robust.py`` these offsets, fitted on every pair, take the predictors'
mean absolute error from 0.214 / 0.136 / 0.162 (V100 / P100 / RTX 3090) to 0.124 / 0.065 / 0.066.
With ``calibrate_spread`` as well, a corrected value's σ is no longer its source's but what the
corrections showed (:meth:`PairTable._calibrate_spread`).
"""

from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..interference.base import Predictor
from .state import ClassIndex

SOURCE_SIGMA = {"measured": 0.05, "cf": 0.10, "mlp": 0.13, "utilization": 0.10, "default": 0.29,
                "memory": 0.0, "solo": 0.05}
UNKNOWN_SIGMA = 0.15  # a predictor that does not say where its answer came from
LOG_KEEP = 4096  # measured pairs remembered for changes_since (a cache older than that starts over)
OBSERVED_SIGMA = 0.05  # one measurement on this cluster (what the replay's learning showed: MAE 0.02–0.04)


def _sigma_block(predictor: Predictor, targets: Sequence[str], corunners: Sequence[str],
                 gpu_type: str) -> np.ndarray:
    sources = getattr(predictor, "sources_pairs", None)
    if sources is None:
        return np.full(len(targets), UNKNOWN_SIGMA)
    try:
        names = sources(list(targets), list(corunners), gpu_type)
    except (NotImplementedError, KeyError, ValueError, IndexError):
        return np.full(len(targets), UNKNOWN_SIGMA)
    return np.array([SOURCE_SIGMA.get(str(n), UNKNOWN_SIGMA) for n in names], dtype=np.float64)


def _predict_block(predictor: Predictor, targets: Sequence[str], corunners: Sequence[str],
                   gpu_type: str) -> np.ndarray:
    try:
        out = predictor.predict_pairs(list(targets), list(corunners), gpu_type)
        return np.clip(np.asarray(out, dtype=np.float64), 0.0, 1.5)
    except NotImplementedError:
        return np.array([predictor.predict(t, [c], gpu_type) for t, c in zip(targets, corunners)],
                        dtype=np.float64)


def joinable_share(table: "PairTable", names: Sequence[str], gpu_type: str, max_slowdown: float) -> Optional[float]:
    """The share of the (job class, resident class) pairs of ``names`` where a job may join the resident
    on ``gpu_type`` under a site's slowdown limit (the cycle's ``max_slowdown`` test on the joining
    job): its normalized throughput there, measured on this cluster or else the table's model predicts
    (before calibration), is at least 1 / ``max_slowdown``. None: no class. Read only: the table and its
    class index are left as they are (horusd's ping asks it)."""
    names = list(names)
    if not names:
        return None
    n = len(names)
    targets = [a for a in names for _ in names]
    values = _predict_block(table.predictor, targets, names * n, gpu_type)
    at = {name: i for i, name in enumerate(names)}
    for (gpu, a, b), (mean, _count) in table._observed.items():  # the pairs measured here
        if gpu == gpu_type and a in at and b in at:
            values[at[a] * n + at[b]] = mean
    return float(np.mean(values >= 1.0 / max_slowdown))


class PairTable:
    """Predicted pair throughputs for the classes seen so far, per GPU type."""

    def __init__(self, predictor: Predictor, classes: ClassIndex, learn: bool = True, exact: bool = False,
                 calibrate: float = 0.0):
        self.predictor = predictor
        self.calibrate = calibrate  # shrinkage of the learned offsets (module docstring); 0: off
        self.classes = classes
        self.learn = learn
        self.exact = exact  # every value is a measurement (the simulator's truth, for the oracle)
        self._mats: Dict[str, np.ndarray] = {}
        self._known: Dict[str, np.ndarray] = {}
        self._sigma: Dict[str, np.ndarray] = {}
        self._filled: Dict[str, int] = {}
        self._prior: Dict[str, np.ndarray] = {}  # the predictor's values (what calibration corrects)
        self._prior_sigma: Dict[str, np.ndarray] = {}  # their spreads by source (calibrate_spread corrects)
        self.calibrate_spread = False  # calibrated values carry the spread the offsets showed (docstring)
        self._reset_at = 0  # n_observations when every unmeasured value last changed (calibration)
        self._observed: Dict[Tuple[str, str, str], Tuple[float, int]] = {}
        self.n_observations = 0
        self.measured: Dict[str, int] = {}  # class -> measured pairs it is part of (either side)
        # the latest pairs measured, (gpu_type, target id, corunner id): what a cache of values derived
        # from the matrices refreshes (changes_since)
        self._log: Deque[Tuple[str, int, int]] = deque(maxlen=LOG_KEEP)

    def matrix(self, gpu_type: str) -> np.ndarray:
        """The (n_classes × n_classes) matrix for ``gpu_type``; grows when new classes appear."""
        n = len(self.classes)
        filled = self._filled.get(gpu_type, 0)
        if filled < n:
            self._grow(gpu_type, filled, n)
        return self._mats[gpu_type]

    def _grow(self, gpu_type: str, old: int, n: int):
        mat, prior, prior_sigma = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
        if old:
            mat[:old, :old] = self._mats[gpu_type][:old, :old]
            prior[:old, :old] = self._prior[gpu_type][:old, :old]
            prior_sigma[:old, :old] = self._prior_sigma[gpu_type][:old, :old]
        names = self.classes.names[:n]
        # every pair touching a new class: new rows fully, new columns of old rows
        ta, tb = [], []
        for a in range(n):
            for b in range(n):
                if a >= old or b >= old:
                    ta.append(a)
                    tb.append(b)
        values = _predict_block(self.predictor, [names[a] for a in ta], [names[b] for b in tb], gpu_type)
        mat[np.array(ta), np.array(tb)] = values
        prior[np.array(ta), np.array(tb)] = values
        sigma = np.zeros((n, n))
        if old:
            sigma[:old, :old] = self._sigma[gpu_type][:old, :old]
        if not self.exact:
            sigma[np.array(ta), np.array(tb)] = _sigma_block(self.predictor, [names[a] for a in ta],
                                                             [names[b] for b in tb], gpu_type)
            prior_sigma[np.array(ta), np.array(tb)] = sigma[np.array(ta), np.array(tb)]
        known = np.full((n, n), self.exact)
        for (t, a_name, b_name), (mean, count) in self._observed.items():
            a, b = self.classes.ids.get(a_name, n), self.classes.ids.get(b_name, n)
            if t == gpu_type and a < n and b < n:
                mat[a, b] = mean
                known[a, b] = True
                sigma[a, b] = OBSERVED_SIGMA / np.sqrt(count)
        self._mats[gpu_type] = mat
        self._sigma[gpu_type] = sigma
        self._known[gpu_type] = known
        self._prior[gpu_type] = prior
        self._prior_sigma[gpu_type] = prior_sigma
        self._filled[gpu_type] = n
        if self.calibrate > 0 and self.learn and not self.exact:
            self._calibrate(gpu_type)

    def _calibrate(self, gpu_type: str):
        """Correct every unmeasured value of ``gpu_type`` by the offsets the measured pairs show
        (module docstring)."""
        mat, known, prior = self._mats[gpu_type], self._known[gpu_type], self._prior[gpu_type]
        seen = known.astype(np.float64)
        residual = np.where(known, mat - prior, 0.0)
        lam = float(self.calibrate)
        mu = residual.sum() / (seen.sum() + lam)
        left = residual - mu * seen
        beta = left.sum(axis=1) / (seen.sum(axis=1) + lam)
        left -= beta[:, None] * seen
        gamma = left.sum(axis=0) / (seen.sum(axis=0) + lam)
        fitted = mu + beta[:, None] + gamma[None, :]
        adjust = ~known & (self._prior_sigma[gpu_type] > 0)
        mat[adjust] = np.clip(prior + fitted, 0.0, 1.5)[adjust]
        if self.calibrate_spread:
            self._calibrate_spread(gpu_type, seen, residual - fitted * seen, lam, adjust)
        self._reset_at = self.n_observations

    def _calibrate_spread(self, gpu_type: str, seen: np.ndarray, left: np.ndarray, lam: float,
                          adjust: np.ndarray):
        """The spread of a calibrated value: the measured pairs' errors left after the offsets, each
        scaled up by its leverage (its weight in the three shrunk means that fitted it, so that it
        stands for a pair the offsets were not fitted on), their root mean square blended with the
        predictor's spread by source, which counts as ``calibrate`` pairs (the offsets' shrinkage)."""
        n = float(seen.sum())
        if n == 0:
            return
        leverage = 1.0 / (n + lam) + 1.0 / (seen.sum(axis=1)[:, None] + lam) + 1.0 / (seen.sum(axis=0)[None, :] + lam)
        out_of_fit = left / np.maximum(1.0 - leverage, 0.05)
        mean_square = float((out_of_fit * out_of_fit * seen).sum()) / n
        prior_sigma = self._prior_sigma[gpu_type]
        blended = np.sqrt((lam * prior_sigma * prior_sigma + n * mean_square) / (lam + n))
        self._sigma[gpu_type][adjust] = blended[adjust]

    def bind(self, classes: ClassIndex):
        """Use ``classes`` (a ClusterState's index) from now on; matrices are rebuilt lazily."""
        if classes is not self.classes:
            self.classes = classes
            self._mats.clear()
            self._known.clear()
            self._sigma.clear()
            self._filled.clear()
            self._prior.clear()
            self._prior_sigma.clear()

    def tput(self, gpu_type: str, target: str, corunner: str) -> float:
        a, b = self.classes.id(target), self.classes.id(corunner)
        return float(self.matrix(gpu_type)[a, b])

    def observe(self, gpu_type: str, target: str, corunner: str, norm_tput: float):
        """A pair was measured: ``target`` kept ``norm_tput`` of its solo speed next to ``corunner``."""
        if not self.learn:
            return
        a, b = self.classes.id(target), self.classes.id(corunner)
        key = (gpu_type, target, corunner)
        mean, count = self._observed.get(key, (0.0, 0))
        mean = (mean * count + float(norm_tput)) / (count + 1)
        self._observed[key] = (mean, count + 1)
        self.n_observations += 1
        for name in {target, corunner}:
            self.measured[name] = self.measured.get(name, 0) + 1
        mat = self.matrix(gpu_type)
        mat[a, b] = mean
        self._log.append((gpu_type, a, b))
        self._known[gpu_type][a, b] = True
        self._sigma[gpu_type][a, b] = OBSERVED_SIGMA / np.sqrt(count + 1)
        if self.calibrate > 0 and not self.exact:
            self._calibrate(gpu_type)

    def changes_since(self, seen: int) -> Optional[List[Tuple[str, int, int]]]:
        """The pairs measured since ``n_observations`` was ``seen``, oldest first, as (gpu_type,
        target id, corunner id); None when they are no longer all kept (``LOG_KEEP``), or when the
        unmeasured values changed too (``calibrate``)."""
        new = self.n_observations - seen
        if new < 0 or new > len(self._log) or seen < self._reset_at:
            return None
        return [self._log[-i] for i in range(new, 0, -1)]

    def known(self, gpu_type: str) -> np.ndarray:
        """Bool matrix: which pair values were measured (observed), not predicted."""
        self.matrix(gpu_type)
        return self._known[gpu_type]

    def sigma(self, gpu_type: str) -> np.ndarray:
        """Per pair: the standard deviation of the value's error (0 for the simulator's truth)."""
        self.matrix(gpu_type)
        return self._sigma[gpu_type]

    def observed(self, gpu_type: str, target: str, corunner: str) -> Optional[float]:
        found = self._observed.get((gpu_type, target, corunner))
        return None if found is None else found[0]
