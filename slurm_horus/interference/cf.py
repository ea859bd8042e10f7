"""``cf``: collaborative filtering over (target class, co-runner class, GPU type) with side information.

The IASP family of predictors named in the project's issue: interference prediction as
collaborative filtering (a recommendation problem), where the measured pairs are a few entries of
a class x class matrix per GPU type and a low-rank model with side information fills in the rest.

Model (fitted by L-BFGS on the feasible observations, squared error + L2):

    x_g(t, c) = mu_g + b_t + b'_c + d_{g,t} + d'_{g,c} + s_g * <p_t + dp_{g,t}, q_c + dq_{g,c}>
                + w . phi_g(t, c) + a_g . f_g(t) + a'_g . f_g(c)

``b, b', p, q`` are shared by all GPU types, so a GPU type with few observations borrows them and
learns its offset ``mu_g``, scale ``s_g`` and regularized per-class corrections ``d, dp, dq``; a
well-observed GPU type uses those corrections to keep its own structure. ``f`` is per-class side
information (see :func:`class_side`); ``phi`` is pair side information from the solo profiles
(time-slicing baseline from GPU utilization, memory-bandwidth overlap, memory pressure; zero where
unknown). A pair is covered
when both classes were observed co-located on some GPU type.
"""

import numpy as np
from scipy.optimize import minimize

from .table import TablePredictor, pair_observation_arrays


def side_features(profile_features, capacity_mb):
    """Per-class inputs of phi: (u, m, gmem fraction), zeros where unknown, plus a known flag."""
    u = profile_features["gpu_util"] / 100.0
    m = np.where(np.isnan(profile_features["mem_util"]), u, profile_features["mem_util"] / 100.0)
    g = np.nan_to_num(profile_features["gmem_mb"] / capacity_mb, nan=0.0)
    known = ~np.isnan(u)
    return np.nan_to_num(u), np.nan_to_num(m), g, known


def phi(side, t, c):
    u, m, g, known = side
    both = (known[t] & known[c]).astype(float)
    return np.column_stack([
        both / np.maximum(1.0, u[t] + u[c]),
        both * u[t], both * u[c],
        both * np.maximum(0.0, m[t] + m[c] - 1.0),
        g[t] + g[c],
        both,
    ])


N_SIDE = 6
N_CLASS_SIDE = 3


def _standardized(values):
    known = ~np.isnan(values)
    if known.sum() >= 2:
        values = (values - np.nanmean(values)) / (np.nanstd(values) or 1.0)
    return np.nan_to_num(values), known


def class_side(profile_table, gpu_type):
    """Per-class side information on one GPU type, zeros where unknown: standardized log solo
    throughput (short-step jobs are the aggressive co-runners in Gavel's P100 data), standardized
    log speed-up of this GPU type over the class's other GPU types, and a known flag."""
    log_tput = np.log(profile_table.own("solo_tput", gpu_type))
    elsewhere = [np.log(profile_table.own("solo_tput", other)) for other in profile_table.gpu_types if other != gpu_type]
    if elsewhere:
        stacked = np.vstack(elsewhere)
        count = (~np.isnan(stacked)).sum(axis=0)
        mean = np.where(count > 0, np.nansum(stacked, axis=0) / np.maximum(count, 1), np.nan)
    else:
        mean = np.full_like(log_tput, np.nan)
    tput, known = _standardized(log_tput)
    speedup, _ = _standardized(log_tput - mean)
    return np.column_stack([tput, speedup, known.astype(float)])


def feasible_pair_arrays(predictor):
    """The pairs that ran (normalized throughput > 0) as arrays (gpu position, target, co-runner,
    value); sets ``predictor._seen``, the classes observed co-located (what a CF model covers)."""
    g, t, c, y = pair_observation_arrays(predictor.index, predictor.observations, predictor.gpu_types)
    feasible = y > 0
    g, t, c, y = g[feasible], t[feasible], c[feasible], y[feasible]
    predictor._seen = np.zeros(len(predictor.index), bool)
    predictor._seen[t] = True
    predictor._seen[c] = True
    return g, t, c, y


class CFPredictor(TablePredictor):
    name = "cf"
    options = {"rank": 6, "reg": 1e-3, "reg_gpu": 3e-4, "reg_factor": 1e-3, "seed": 0, "max_iter": 500}

    def _layout(self, gpus, count):
        rank = self.settings["rank"]
        shapes = [("mu", (gpus,)), ("scale", (gpus,)), ("bt", (count,)), ("bc", (count,)),
                  ("dt", (gpus, count)), ("dc", (gpus, count)), ("p", (count, rank)), ("q", (count, rank)),
                  ("dp", (gpus, count, rank)), ("dq", (gpus, count, rank)),
                  ("w", (N_SIDE,)), ("at", (gpus, N_CLASS_SIDE)), ("ac", (gpus, N_CLASS_SIDE))]
        layout, start = [], 0
        for name, shape in shapes:
            size = int(np.prod(shape))
            layout.append((name, shape, start, start + size))
            start += size
        return layout, start

    def _unpack(self, vector):
        return {name: vector[a:b].reshape(shape) for name, shape, a, b in self._layout_cache[0]}

    def _fit(self):
        count, gpus = len(self.index), len(self.gpu_types)
        g, t, c, y = feasible_pair_arrays(self)
        self._sides = {gpu: side_features(self.profile_table.features(gpu), self.memory.capacity_mb(gpu))
                       for gpu in self.gpu_types}
        features = np.zeros((len(y), N_SIDE))
        for position, gpu in enumerate(self.gpu_types):
            mine = g == position
            features[mine] = phi(self._sides[gpu], t[mine], c[mine])
        self._layout_cache = self._layout(gpus, count)
        self._gpu_position = {gpu: i for i, gpu in enumerate(self.gpu_types)}
        if not len(y):  # nothing observed co-located: cf covers no pair
            self.params = self._unpack(np.zeros(self._layout_cache[1]))
            return
        rng = np.random.default_rng(self.settings["seed"])
        start = np.zeros(self._layout_cache[1])
        init = self._unpack(start)
        init["mu"][:] = y.mean() if len(y) else 0.5
        init["scale"][:] = 1.0
        init["p"][:] = rng.normal(0, 0.1, init["p"].shape)
        init["q"][:] = rng.normal(0, 0.1, init["q"].shape)
        reg, reg_gpu, reg_factor = self.settings["reg"], self.settings["reg_gpu"], self.settings["reg_factor"]
        classes = np.stack([class_side(self.profile_table, gpu) for gpu in self.gpu_types])
        penalties = [(reg, ("bt", "bc", "p", "q", "at", "ac")), (reg_gpu, ("dt", "dc")), (reg_factor, ("dp", "dq"))]
        n = max(len(y), 1)

        def loss(vector):
            v = self._unpack(vector)
            pt = v["p"][t] + v["dp"][g, t]  # shared factors plus this GPU type's deviation
            qc = v["q"][c] + v["dq"][g, c]
            inner = np.einsum("ij,ij->i", pt, qc)
            pred = (v["mu"][g] + v["bt"][t] + v["bc"][c] + v["dt"][g, t] + v["dc"][g, c]
                    + v["scale"][g] * inner + features @ v["w"]
                    + np.einsum("ij,ij->i", classes[g, t], v["at"][g]) + np.einsum("ij,ij->i", classes[g, c], v["ac"][g]))
            r = (pred - y) / n
            grad = np.zeros_like(vector)
            d = self._unpack(grad)
            d["mu"][:] = np.bincount(g, r, gpus)
            d["scale"][:] = np.bincount(g, r * inner, gpus) + reg * (v["scale"] - 1.0)
            d["bt"][:] = np.bincount(t, r, count)
            d["bc"][:] = np.bincount(c, r, count)
            d["dt"][:] = np.bincount(g * count + t, r, gpus * count).reshape(gpus, count)
            d["dc"][:] = np.bincount(g * count + c, r, gpus * count).reshape(gpus, count)
            weighted = r * v["scale"][g]
            for k in range(v["p"].shape[1]):
                d["p"][:, k] = np.bincount(t, weighted * qc[:, k], count)
                d["q"][:, k] = np.bincount(c, weighted * pt[:, k], count)
                d["dp"][:, :, k] = np.bincount(g * count + t, weighted * qc[:, k], gpus * count).reshape(gpus, count)
                d["dq"][:, :, k] = np.bincount(g * count + c, weighted * pt[:, k], gpus * count).reshape(gpus, count)
            d["w"][:] = features.T @ r
            for k in range(N_CLASS_SIDE):
                d["at"][:, k] = np.bincount(g, r * classes[g, t, k], gpus)
                d["ac"][:, k] = np.bincount(g, r * classes[g, c, k], gpus)
            value = 0.5 * n * np.sum(r * r) + 0.5 * reg * np.sum((v["scale"] - 1.0) ** 2)
            for weight, names in penalties:
                for name in names:
                    d[name] += weight * v[name]
                    value += 0.5 * weight * np.sum(v[name] ** 2)
            return value, grad

        result = minimize(loss, start, jac=True, method="L-BFGS-B",
                          options={"maxiter": self.settings["max_iter"]})
        self.params = self._unpack(result.x.copy())

    def _pair_matrix(self, gpu_type):
        v, count = self.params, len(self.index)
        if not self._seen.any():
            return np.full((count, count), np.nan)
        position = self._gpu_position.get(gpu_type)
        if position is None:  # a GPU type never observed: shared terms, mean offset and scale
            mu, scale = v["mu"].mean(), v["scale"].mean()
            dt = dc = np.zeros(count)
            p, q = v["p"], v["q"]
        else:
            mu, scale = v["mu"][position], v["scale"][position]
            dt, dc = v["dt"][position], v["dc"][position]
            p, q = v["p"] + v["dp"][position], v["q"] + v["dq"][position]
        side = self._sides.get(gpu_type) or side_features(
            self.profile_table.features(gpu_type), self.memory.capacity_mb(gpu_type))
        t, c = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
        extra = (phi(side, t.ravel(), c.ravel()) @ v["w"]).reshape(count, count)
        values = (mu + (v["bt"] + dt)[:, None] + (v["bc"] + dc)[None, :]
                  + scale * (p @ q.T) + extra)
        side_of_class = class_side(self.profile_table, gpu_type)
        at = v["at"][position] if position is not None else v["at"].mean(axis=0)
        ac = v["ac"][position] if position is not None else v["ac"].mean(axis=0)
        values = values + (side_of_class @ at)[:, None] + (side_of_class @ ac)[None, :]
        values[~self._seen, :] = np.nan
        values[:, ~self._seen] = np.nan
        return values
