"""Shared machinery of all predictors: integer class ids, per-GPU feature arrays, the memory guard,
and dense per-GPU-type lookup tables so that one prediction is a couple of dict and array lookups.

Every predictor computes, for one GPU type, a (C, C) matrix of pair values (target row, co-runner
column; NaN where it has no answer of its own). :class:`TablePredictor` turns it into a
(C+1, C+1) table: the extra last row/column is the answer for a class the model does not know
(index -1), cells without an answer get the conservative default, and pairs that cannot fit in
memory get 0.
"""

import numpy as np

from .base import Prediction, Predictor, compose_norm_tputs
from .classes import batch_orderings
from .gpus import gpu_memory_mb as _gpu_memory_mb
from .gpus import memory_from_profiles

# Source names, least trusted first (a composed prediction reports its least trusted part).
SOURCES = ("default", "utilization", "mlp", "cf", "measured", "memory", "solo")
SOURCE_CODE = {name: code for code, name in enumerate(SOURCES)}
DEFAULT_NORM_TPUT = 0.5  # nothing known: assume the GPU is time-sliced evenly between two jobs
FEATURES = ("gpu_util", "mem_util", "gmem_mb", "solo_tput")


class ClassIndex:
    """Job class name <-> integer id (ids are positions in the sorted list of names)."""

    def __init__(self, names):
        self.names = sorted(set(names))
        self.ids = {name: i for i, name in enumerate(self.names)}

    def __len__(self):
        return len(self.names)

    def lookup(self, classes):
        """Array of class names (or of ids already) -> int array of ids, -1 for unknown classes."""
        array = np.asarray(classes)
        if array.dtype.kind in "iu":
            return array.astype(np.intp, copy=False)
        get = self.ids.get
        return np.fromiter((get(name, -1) for name in array.tolist()), dtype=np.intp, count=array.size)


class ProfileTable:
    """Solo-profile features as arrays over class ids, per GPU type (NaN where unknown).

    A class without a profile on a GPU type borrows the mean of its profiles on other types for
    utilization and memory (they depend mostly on the job); solo throughput is never borrowed.
    """

    def __init__(self, index, profiles):
        self.index = index
        self.gpu_types = sorted({p.gpu_type for p in profiles})
        self._own = {}
        for gpu in self.gpu_types:
            self._own[gpu] = {f: np.full(len(index), np.nan) for f in FEATURES}
        for p in profiles:
            i = index.ids[p.job_class]
            for f in FEATURES:
                value = getattr(p, f)
                if value is not None:
                    self._own[p.gpu_type][f][i] = value
        self._cache = {}

    def own(self, feature, gpu_type):
        """The class's own measurement of ``feature`` on ``gpu_type`` (NaN where not measured)."""
        own = self._own.get(gpu_type)
        return own[feature].copy() if own is not None else np.full(len(self.index), np.nan)

    def features(self, gpu_type):
        """dict feature name -> array over class ids for ``gpu_type``."""
        cached = self._cache.get(gpu_type)
        if cached is not None:
            return cached
        others = [self._own[g] for g in self.gpu_types if g != gpu_type]
        own = self._own.get(gpu_type)
        result = {}
        for f in FEATURES:
            column = own[f].copy() if own is not None else np.full(len(self.index), np.nan)
            if f != "solo_tput" and others:
                stacked = np.vstack([o[f] for o in others])
                known = ~np.isnan(stacked)
                counts = known.sum(axis=0)
                borrowed = np.where(counts > 0, np.nansum(stacked, axis=0) / np.maximum(counts, 1), np.nan)
                column = np.where(np.isnan(column), borrowed, column)
            result[f] = column
        self._cache[gpu_type] = result
        return result


def infer_latent_memory(evidence, count, orderings=(), margin=0.05):
    """Pairs that cannot share a GPU, inferred from pairs observed to fail (0) or to run.

    ``evidence`` is a list of (class a, class b, failed, weight). Fits one unknown peak memory per
    class, in units of the GPU's memory, by a soft-margin linear program: a failed pair should sum
    to at least ``1 + margin``, a pair that ran to at most ``1 - margin``; each violation costs its
    weight (the 0s are not all explained by memory). Many memories fit equally well; the midpoint
    of the smallest and the largest such fit is used (smallest alone misses a third of the hidden
    out-of-memory pairs of Gavel, largest alone turns many feasible pairs into 0s). A pair of
    classes that both appear in the evidence is infeasible when their memories sum above 1.
    ``orderings`` are (i, j) pairs with memory_i <= memory_j (same model, larger batch). Returns the
    (count, count) boolean matrix of inferred infeasible pairs.
    """
    from scipy.optimize import linprog

    inferred = np.zeros((count, count), bool)
    if not any(failed for _, _, failed, _ in evidence):
        return inferred
    n = len(evidence)
    rows = np.zeros((n + len(orderings), count + n))
    limits = np.zeros(n + len(orderings))
    for k, (a, b, failed, _) in enumerate(evidence):
        sign = -1.0 if failed else 1.0
        rows[k, a] += sign
        rows[k, b] += sign
        rows[k, count + k] = -1.0  # slack
        limits[k] = sign - margin
    for k, (small, large) in enumerate(orderings):
        rows[n + k, small], rows[n + k, large] = 1.0, -1.0
    fits = []
    for direction in (1.0, -1.0):  # the smallest, then the largest memories that fit equally well
        objective = np.concatenate([np.full(count, direction * 1e-3), [weight for _, _, _, weight in evidence]])
        result = linprog(objective, A_ub=rows, b_ub=limits, bounds=[(0.0, 2.0)] * count + [(0.0, None)] * n,
                         method="highs")
        if not result.success:
            return inferred
        fits.append(result.x[:count])
    memory = (fits[0] + fits[1]) / 2.0
    known = np.zeros(count, bool)  # a class without evidence has no fitted memory
    for a, b, _, _ in evidence:
        known[a] = known[b] = True
    return ((memory[:, None] + memory[None, :]) > 1.0) & known[:, None] & known[None, :]


class MemoryGuard:
    """Which sets of classes cannot share one GPU of a type.

    Infeasible when the summed known peak memory (``gmem_mb``) exceeds the GPU's memory, when the
    pair was observed not to run together on that GPU type (normalized throughput 0: Gavel has no
    memory figures, its 0s are the only memory evidence), or when :func:`infer_latent_memory`
    finds that the observed 0s force it (own GPU type's evidence at full weight, other types'
    evidence at weight ``BORROW_WEIGHT`` for pairs not seen on this type (failures from GPUs with
    at least as much memory, successes from GPUs with at most as much), only while this type has
    seen fewer than ``SPARSE_SHARE`` of the pairs seen on any type: with rich evidence of its own,
    borrowing from other types mostly adds false 0s).
    """

    BORROW_WEIGHT = 0.1
    SPARSE_SHARE = 0.5

    def __init__(self, index, profile_table, observations, memory_sizes):
        self.index = index
        self.profile_table = profile_table
        self.memory_sizes = dict(memory_sizes)
        count = len(index)
        self._orderings = batch_orderings(index.names)
        self._failed, self._seen = {}, {}
        for gpu in sorted({o.gpu_type for o in observations}):
            zeros = np.zeros((count, count))
            seen = np.zeros((count, count))
            for o in observations:
                if o.gpu_type == gpu:
                    t, c = index.ids[o.job_class], index.ids[o.corunner_class]
                    seen[t, c] += 1
                    zeros[t, c] += o.norm_tput <= 0.0
            failed = (seen > 0) & (zeros * 2 >= seen)  # most observations of the pair say it failed
            self._failed[gpu] = failed | failed.T  # a pair that cannot run fails for both jobs
            self._seen[gpu] = (seen + seen.T) > 0
        self._cache = {}

    def _observed_infeasible(self, gpu_type):
        count = len(self.index)
        own_failed = self._failed.get(gpu_type, np.zeros((count, count), bool))
        own_seen = self._seen.get(gpu_type, np.zeros((count, count), bool))
        upper = np.triu(np.ones((count, count), bool))
        evidence = [(a, b, bool(own_failed[a, b]), 1.0) for a, b in np.argwhere(own_seen & upper)]
        everywhere = np.any(list(self._seen.values()), axis=0)
        sparse = own_seen.sum() < self.SPARSE_SHARE * everywhere.sum()
        capacity = self.capacity_mb(gpu_type)
        for other, seen in self._seen.items():
            if sparse and other != gpu_type:
                # a failure on a GPU with at least as much memory carries over, and so does a
                # success on one with at most as much
                other_capacity = self.capacity_mb(other)
                failed = self._failed[other] & (other_capacity >= capacity)
                ran = ~self._failed[other] & (other_capacity <= capacity)
                evidence += [(a, b, bool(failed[a, b]), self.BORROW_WEIGHT)
                             for a, b in np.argwhere(seen & (failed | ran) & ~own_seen & upper)]
        inferred = infer_latent_memory(evidence, count, self._orderings)
        return own_failed | (inferred & ~own_seen)

    def capacity_mb(self, gpu_type):
        return _gpu_memory_mb(gpu_type, self.memory_sizes)

    def peak_mb(self, gpu_type):
        return self.profile_table.features(gpu_type)["gmem_mb"]

    def infeasible_matrix(self, gpu_type):
        cached = self._cache.get(gpu_type)
        if cached is not None:
            return cached
        capacity = self.capacity_mb(gpu_type)
        peak = self.peak_mb(gpu_type)
        with np.errstate(invalid="ignore"):
            bad = (peak[:, None] + peak[None, :]) > capacity  # NaN compares False: unknown is not proof
        if self._seen:
            bad = bad | self._observed_infeasible(gpu_type)
        self._cache[gpu_type] = bad
        return bad

    def set_infeasible(self, gpu_type, ids):
        """Whether the classes ``ids`` (-1 = unknown) cannot all share one GPU of ``gpu_type``."""
        peaks, capacity = self._peaks(gpu_type)
        known = [i for i in ids if i >= 0]
        if sum(peaks[i] for i in known) > capacity:
            return True
        rows = self._infeasible_rows(gpu_type)
        return any(rows[a][b] for n, a in enumerate(known) for b in known[n + 1:])

    def _peaks(self, gpu_type):
        cached = self._cache.get(("peaks", gpu_type))
        if cached is None:
            peaks = np.nan_to_num(self.peak_mb(gpu_type), nan=0.0).tolist()  # unknown counts as 0
            cached = self._cache[("peaks", gpu_type)] = (peaks, self.capacity_mb(gpu_type))
        return cached

    def _infeasible_rows(self, gpu_type):
        cached = self._cache.get(("rows", gpu_type))
        if cached is None:
            cached = self._cache[("rows", gpu_type)] = self.infeasible_matrix(gpu_type).tolist()
        return cached


class TablePredictor(Predictor):
    """Base of every predictor: fit -> per-GPU-type dense tables -> fast predict/explain/predict_pairs.

    Subclasses implement ``_fit()`` (using ``self.index``, ``self.profile_table``,
    ``self.observations``) and ``_pair_matrix(gpu_type)`` -> (C, C) values with NaN where uncovered.
    """

    name = "base"
    source = ""  # the Prediction.source of its answers when not its name (a variant of a known kind)
    options = {}

    def __init__(self, gpu_memory_mb=None, **options):
        unknown = set(options) - set(self.options)
        if unknown:
            raise TypeError(f"{self.name}: unknown option(s) {', '.join(sorted(unknown))}")
        self.settings = dict(self.options, **options)
        self.gpu_memory_overrides = dict(gpu_memory_mb or {})
        self._tables = {}
        self._fitted = False

    # -- fitting ---------------------------------------------------------------------------
    def fit(self, profiles, observations):
        self.profiles = list(profiles)
        self.observations = list(observations)
        self._prepare()
        self._fit()
        self._fitted = True
        for gpu in self.gpu_types:
            self._table(gpu)
        return self

    def _prepare(self):
        names = {p.job_class for p in self.profiles}
        names.update(o.job_class for o in self.observations)
        names.update(o.corunner_class for o in self.observations)
        self.index = ClassIndex(names)
        self.gpu_types = sorted({p.gpu_type for p in self.profiles} | {o.gpu_type for o in self.observations})
        self.profile_table = ProfileTable(self.index, self.profiles)
        memory = memory_from_profiles(self.profiles)
        memory.update(self.gpu_memory_overrides)
        self.memory = MemoryGuard(self.index, self.profile_table, self.observations, memory)
        self._tables = {}

    def _fit(self):
        raise NotImplementedError

    def _pair_matrix(self, gpu_type):
        raise NotImplementedError

    def _pair_table(self, gpu_type):
        """(values with NaN where uncovered, int8 source codes) for the C x C known classes."""
        values = np.asarray(self._pair_matrix(gpu_type), dtype=float)
        sources = np.full(values.shape, SOURCE_CODE[self.source or self.name], dtype=np.int8)
        return values, sources

    def _table(self, gpu_type):
        table = self._tables.get(gpu_type)
        if table is not None:
            return table
        if not self._fitted:
            self.fit(self.profiles, self.observations)  # restored from to_dict: fit on first new GPU type
            return self._table(gpu_type)
        count = len(self.index)
        values, sources = self._pair_table(gpu_type)
        full = np.full((count + 1, count + 1), DEFAULT_NORM_TPUT)
        codes = np.full((count + 1, count + 1), SOURCE_CODE["default"], dtype=np.int8)
        uncovered = np.isnan(values)
        full[:count, :count] = np.where(uncovered, DEFAULT_NORM_TPUT, np.clip(values, 0.0, 1.0))
        codes[:count, :count] = np.where(uncovered, SOURCE_CODE["default"], sources)
        bad = self.memory.infeasible_matrix(gpu_type)
        full[:count, :count][bad] = 0.0
        codes[:count, :count][bad] = SOURCE_CODE["memory"]
        table = (full, codes, full.tolist(), codes.tolist())
        self._tables[gpu_type] = table
        return table

    # -- predicting ------------------------------------------------------------------------
    def explain(self, target, corunners, gpu_type):
        full, codes, rows, code_rows = self._table(gpu_type)
        ids = self.index.ids
        t = ids.get(target, -1)
        if len(corunners) == 1:
            c = ids.get(corunners[0], -1)
            return Prediction(rows[t][c], SOURCES[code_rows[t][c]])
        if not corunners:
            return Prediction(1.0, "solo")
        others = [ids.get(name, -1) for name in corunners]
        if self.memory.set_infeasible(gpu_type, [t] + others):
            return Prediction(0.0, "memory")
        value = compose_norm_tputs(rows[t][c] for c in others)
        source = SOURCES[min(code_rows[t][c] for c in others)]
        return Prediction(value, "memory" if value == 0.0 else source)

    def predict_pairs(self, targets, corunners, gpu_type):
        full = self._table(gpu_type)[0]
        return full[self.index.lookup(targets), self.index.lookup(corunners)]

    def sources_pairs(self, targets, corunners, gpu_type):
        codes = self._table(gpu_type)[1]
        return np.asarray(SOURCES)[codes[self.index.lookup(targets), self.index.lookup(corunners)]]

    def covers(self, target, corunner, gpu_type):
        ids = self.index.ids
        t, c = ids.get(target), ids.get(corunner)
        if t is None or c is None:
            return False
        return self._table(gpu_type)[3][t][c] != SOURCE_CODE["default"]

    # -- storing ---------------------------------------------------------------------------
    def to_dict(self):
        """JSON-able state: inputs, options and the computed tables (no refit needed to predict)."""
        return {
            "format": 1,
            "name": self.name,
            "options": self.settings,
            "gpu_memory_mb": self.gpu_memory_overrides,
            "profiles": [_profile_dict(p) for p in self.profiles],
            "observations": [[o.gpu_type, o.job_class, o.corunner_class, o.norm_tput] for o in self.observations],
            "tables": {gpu: {"values": t[2], "sources": t[3]} for gpu, t in self._tables.items()},
        }

    def _restore(self, state):
        from .base import Observation, SoloProfile

        self.profiles = [SoloProfile(**p) for p in state["profiles"]]
        self.observations = [Observation(*row) for row in state["observations"]]
        self._prepare()
        for gpu, table in state["tables"].items():
            full = np.asarray(table["values"], dtype=float)
            codes = np.asarray(table["sources"], dtype=np.int8)
            self._tables[gpu] = (full, codes, full.tolist(), codes.tolist())
        return self


def _profile_dict(p):
    return {"job_class": p.job_class, "gpu_type": p.gpu_type, "gpu_util": p.gpu_util, "mem_util": p.mem_util,
            "gmem_mb": p.gmem_mb, "solo_tput": p.solo_tput, "extra": dict(p.extra)}


def pair_observation_arrays(index, observations, gpu_types=None):
    """Observations as arrays (gpu position in ``gpu_types``, target id, co-runner id, value)."""
    gpu_types = list(gpu_types) if gpu_types is not None else sorted({o.gpu_type for o in observations})
    position = {g: i for i, g in enumerate(gpu_types)}
    rows = [(position[o.gpu_type], index.ids[o.job_class], index.ids[o.corunner_class], o.norm_tput)
            for o in observations if o.gpu_type in position]
    if not rows:
        return (np.zeros(0, np.intp),) * 3 + (np.zeros(0),)
    g, t, c, y = zip(*rows)
    return np.asarray(g, np.intp), np.asarray(t, np.intp), np.asarray(c, np.intp), np.asarray(y, float)
