"""``measured``: the observed normalized throughput when the pair has been seen often enough."""

import numpy as np

from .table import TablePredictor, pair_observation_arrays


class MeasuredPredictor(TablePredictor):
    """Mean of the observations of (GPU type, target, co-runner); covers only pairs seen at least
    ``min_count`` times on that GPU type. Observed 0s are handled by the memory guard."""

    name = "measured"
    options = {"min_count": 1}

    def _fit(self):
        self._means = {}
        count = len(self.index)
        gpus, targets, corunners, values = pair_observation_arrays(self.index, self.observations, self.gpu_types)
        for position, gpu in enumerate(self.gpu_types):
            mine = gpus == position
            cells = targets[mine] * count + corunners[mine]
            sums = np.bincount(cells, values[mine], minlength=count * count).reshape(count, count)
            seen = np.bincount(cells, minlength=count * count).reshape(count, count)
            with np.errstate(invalid="ignore", divide="ignore"):
                means = sums / seen
            means[seen < self.settings["min_count"]] = np.nan
            self._means[gpu] = means

    def _pair_matrix(self, gpu_type):
        means = self._means.get(gpu_type)
        if means is None:
            return np.full((len(self.index),) * 2, np.nan)
        return means
