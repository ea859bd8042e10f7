"""``utilization``: interference from solo utilization alone (Horus).

Paper: Yeung, Borowiec, Yang, Friday, Harper, Garraghan, "Horus: Interference-Aware and
Prediction-Based Scheduling in Deep Learning Systems", IEEE TPDS 33(1):88-100, 2022. Horus uses a
job's GPU utilization as the proxy that decides good co-location, so a job never seen co-located
can be placed from its (measured or predicted) solo utilization.

Rule used here: with solo GPU utilizations u_t, u_c and memory-controller utilizations m_t, m_c
(fractions), the time-slicing baseline is ``1 / max(1, u_t + u_c)`` (the GPU cannot give more than
its whole duty cycle). A ridge regression on that baseline plus the utilizations, their products,
the memory-bandwidth overlap ``max(0, m_t + m_c - 1)`` and the memory pressure
``(gmem_t + gmem_c) / GPU memory`` is fitted on the feasible observations (a few parameters shared
by all GPU types, so a new GPU type or job class is predicted from its profile). Without enough
observations carrying utilization, the baseline alone answers.
"""

import numpy as np

from .table import TablePredictor, pair_observation_arrays

MIN_ROWS = 20


def design(ut, uc, mt, mc, pressure):
    """Feature matrix of the regression (rows = pairs); all inputs are fractions."""
    baseline = 1.0 / np.maximum(1.0, ut + uc)
    return np.column_stack([
        np.ones_like(ut), baseline, ut, uc, ut * uc, mt, mc, mt * mc,
        np.maximum(0.0, mt + mc - 1.0), pressure,
    ])


class UtilizationPredictor(TablePredictor):
    name = "utilization"
    options = {"ridge": 1e-3}

    def _inputs(self, gpu_type):
        """Per-class (u, m, gmem fraction) for ``gpu_type``; unknown m -> u, unknown gmem -> 0."""
        f = self.profile_table.features(gpu_type)
        u = f["gpu_util"] / 100.0
        m = np.where(np.isnan(f["mem_util"]), u, f["mem_util"] / 100.0)
        g = np.nan_to_num(f["gmem_mb"] / self.memory.capacity_mb(gpu_type), nan=0.0)
        return u, m, g

    def _fit(self):
        self.coef = None
        gpus, targets, corunners, values = pair_observation_arrays(self.index, self.observations, self.gpu_types)
        blocks, answers = [], []
        for position, gpu in enumerate(self.gpu_types):
            mine = (gpus == position) & (values > 0)
            u, m, g = self._inputs(gpu)
            t, c = targets[mine], corunners[mine]
            known = ~np.isnan(u[t]) & ~np.isnan(u[c])
            t, c = t[known], c[known]
            blocks.append(design(u[t], u[c], m[t], m[c], g[t] + g[c]))
            answers.append(values[mine][known])
        x = np.vstack(blocks) if blocks else np.zeros((0, 10))
        if len(x) >= MIN_ROWS:
            y = np.concatenate(answers)
            penalty = self.settings["ridge"] * len(x) * np.eye(x.shape[1])
            penalty[0, 0] = penalty[1, 1] = 0.0  # intercept and baseline weight are not shrunk
            self.coef = np.linalg.solve(x.T @ x + penalty, x.T @ y)

    def _pair_matrix(self, gpu_type):
        u, m, g = self._inputs(gpu_type)
        count = len(self.index)
        t, c = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
        t, c = t.ravel(), c.ravel()
        x = design(u[t], u[c], m[t], m[c], g[t] + g[c])
        values = x @ self.coef if self.coef is not None else x[:, 1]
        return values.reshape(count, count)  # NaN wherever a utilization is unknown
