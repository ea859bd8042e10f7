"""``cf``: collaborative filtering over (target class, co-runner class, GPU type) with side information.

After IASP's formulation of interference prediction as a sparse recommendation problem: the known
pairs are a few entries of a class x class matrix per GPU type, filled in by a low-rank model.

Model (fitted by L-BFGS on the feasible observations, squared error + L2):

    x_g(t, c) = mu_g + b_t + b'_c + d_{g,t} + d'_{g,c} + s_g * <p_t, q_c> + w . phi_g(t, c)

``b, b', p, q`` are shared by all GPU types, so a GPU type with few observations borrows them and
only learns its offset ``mu_g``, scale ``s_g`` and small per-class corrections ``d, d'`` (more strongly
regularized). ``phi`` is the side information from the solo profiles (time-slicing baseline from
GPU utilization, memory-bandwidth overlap, memory pressure; zero where unknown). A pair is covered
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


class CFPredictor(TablePredictor):
    name = "cf"
    options = {"rank": 2, "reg": 1e-3, "reg_gpu": 3e-4, "seed": 0, "max_iter": 500}

    def _layout(self, gpus, count):
        rank = self.settings["rank"]
        shapes = [("mu", (gpus,)), ("scale", (gpus,)), ("bt", (count,)), ("bc", (count,)),
                  ("dt", (gpus, count)), ("dc", (gpus, count)), ("p", (count, rank)), ("q", (count, rank)),
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
        g, t, c, y = pair_observation_arrays(self.index, self.observations, self.gpu_types)
        feasible = y > 0
        g, t, c, y = g[feasible], t[feasible], c[feasible], y[feasible]
        self._seen = np.zeros(count, bool)
        self._seen[t] = True
        self._seen[c] = True
        self._sides = {gpu: side_features(self.profile_table.features(gpu), self.memory.capacity_mb(gpu))
                       for gpu in self.gpu_types}
        features = np.zeros((len(y), N_SIDE))
        for position, gpu in enumerate(self.gpu_types):
            mine = g == position
            features[mine] = phi(self._sides[gpu], t[mine], c[mine])
        self._layout_cache = self._layout(gpus, count)
        rng = np.random.default_rng(self.settings["seed"])
        start = np.zeros(self._layout_cache[1])
        init = self._unpack(start)
        init["mu"][:] = y.mean() if len(y) else 0.5
        init["scale"][:] = 1.0
        init["p"][:] = rng.normal(0, 0.1, init["p"].shape)
        init["q"][:] = rng.normal(0, 0.1, init["q"].shape)
        reg, reg_gpu = self.settings["reg"], self.settings["reg_gpu"]
        classes = np.stack([class_side(self.profile_table, gpu) for gpu in self.gpu_types])
        n = max(len(y), 1)

        def loss(vector):
            v = self._unpack(vector)
            inner = np.einsum("ij,ij->i", v["p"][t], v["q"][c])
            pred = (v["mu"][g] + v["bt"][t] + v["bc"][c] + v["dt"][g, t] + v["dc"][g, c]
                    + v["scale"][g] * inner + features @ v["w"]
                    + np.einsum("ij,ij->i", classes[g, t], v["at"][g]) + np.einsum("ij,ij->i", classes[g, c], v["ac"][g]))
            r = (pred - y) / n
            grad = np.zeros_like(vector)
            d = self._unpack(grad)
            d["mu"][:] = np.bincount(g, r, gpus)
            d["scale"][:] = np.bincount(g, r * inner, gpus) + reg * (v["scale"] - 1.0)
            d["bt"][:] = np.bincount(t, r, count) + reg * v["bt"]
            d["bc"][:] = np.bincount(c, r, count) + reg * v["bc"]
            d["dt"][:] = np.bincount(g * count + t, r, gpus * count).reshape(gpus, count) + reg_gpu * v["dt"]
            d["dc"][:] = np.bincount(g * count + c, r, gpus * count).reshape(gpus, count) + reg_gpu * v["dc"]
            weighted = (r * v["scale"][g])[:, None]
            for k in range(v["p"].shape[1]):
                d["p"][:, k] = np.bincount(t, weighted[:, 0] * v["q"][c, k], count)
                d["q"][:, k] = np.bincount(c, weighted[:, 0] * v["p"][t, k], count)
            d["p"] += reg * v["p"]
            d["q"] += reg * v["q"]
            d["w"][:] = features.T @ r
            for k in range(N_CLASS_SIDE):
                d["at"][:, k] = np.bincount(g, r * classes[g, t, k], gpus)
                d["ac"][:, k] = np.bincount(g, r * classes[g, c, k], gpus)
            d["at"] += reg * v["at"]
            d["ac"] += reg * v["ac"]
            value = 0.5 * n * np.sum(r * r) + 0.5 * reg * (
                np.sum(v["bt"] ** 2) + np.sum(v["bc"] ** 2) + np.sum(v["p"] ** 2) + np.sum(v["q"] ** 2)
                + np.sum((v["scale"] - 1.0) ** 2)) + 0.5 * reg_gpu * (np.sum(v["dt"] ** 2) + np.sum(v["dc"] ** 2)) \
                + 0.5 * reg * (np.sum(v["at"] ** 2) + np.sum(v["ac"] ** 2))
            return value, grad

        result = minimize(loss, start, jac=True, method="L-BFGS-B",
                          options={"maxiter": self.settings["max_iter"]})
        self.params = self._unpack(result.x.copy())
        self._gpu_position = {gpu: i for i, gpu in enumerate(self.gpu_types)}

    def _pair_matrix(self, gpu_type):
        v, count = self.params, len(self.index)
        position = self._gpu_position.get(gpu_type)
        if position is None:  # a GPU type never observed: shared terms, mean offset and scale
            mu, scale = v["mu"].mean(), v["scale"].mean()
            dt = dc = np.zeros(count)
        else:
            mu, scale = v["mu"][position], v["scale"][position]
            dt, dc = v["dt"][position], v["dc"][position]
        side = self._sides.get(gpu_type) or side_features(
            self.profile_table.features(gpu_type), self.memory.capacity_mb(gpu_type))
        t, c = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
        extra = (phi(side, t.ravel(), c.ravel()) @ v["w"]).reshape(count, count)
        values = (mu + (v["bt"] + dt)[:, None] + (v["bc"] + dc)[None, :]
                  + scale * (v["p"] @ v["q"].T) + extra)
        side_of_class = class_side(self.profile_table, gpu_type)
        at = v["at"][position] if position is not None else v["at"].mean(axis=0)
        ac = v["ac"][position] if position is not None else v["ac"].mean(axis=0)
        values = values + (side_of_class @ at)[:, None] + (side_of_class @ ac)[None, :]
        values[~self._seen, :] = np.nan
        values[:, ~self._seen] = np.nan
        return values
