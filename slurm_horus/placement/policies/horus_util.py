"""horus-util: the placement rule of the Horus paper.

Source: Yeung et al., "Horus: Interference-Aware and Prediction-Based Scheduling in Deep Learning
Systems", IEEE TPDS 2022. Rule: a job is co-located on a GPU only where the predicted GPU
utilization of the co-located set stays under ``util_limit`` and the predicted slowdown of every job
there stays under ``slowdown_limit``; among such GPUs the one minimizing the summed predicted slowdown
wins; when nothing qualifies the job gets a free GPU exclusively (FIFO order). Utilizations come
from the solo profiles; a class without one is only judged by its predicted slowdown.
"""

from typing import Dict, Optional, Tuple

import numpy as np

from ..framework import NEG_INF, Policy


class HorusUtil(Policy):
    name = "horus-util"
    share = True
    max_jobs_per_gpu = 2
    util_limit = 100.0
    slowdown_limit = 1.5

    def __init__(self, pairs=None, utilization: Optional[Dict[Tuple[str, str], float]] = None, **options):
        super().__init__(pairs, **options)
        self.utilization = dict(utilization or {})
        self._util_arrays: Dict[str, np.ndarray] = {}

    def _util(self, state, gpu_type: str) -> np.ndarray:
        arr = self._util_arrays.get(gpu_type)
        if arr is None or len(arr) < len(state.classes):
            arr = np.array([self.utilization.get((gpu_type, name), np.nan) for name in state.classes.names])
            self._util_arrays[gpu_type] = arr
        return arr

    def score_gpus(self, cycle):
        free = cycle.free
        score = np.full(len(cycle.idx), NEG_INF)
        score[free] = -1e9  # exclusive only when no co-location qualifies
        if not free.all():
            shared = ~free
            slow_job = 1.0 / np.maximum(cycle.job_tput[shared], 1e-9)
            slow_res = 1.0 / np.maximum(cycle.res_tput[shared], 1e-9)
            ok = (slow_job <= self.slowdown_limit) & (slow_res <= self.slowdown_limit)
            state = cycle.state
            types = state.gpu_type_id[cycle.idx[shared]]
            util_sum = np.zeros(len(types))
            for t in np.unique(types):
                util = self._util(state, state.gpu_types[t])
                sel = types == t
                util_sum[sel] = util[cycle.class_id] + util[cycle.resident[shared][sel]]
            ok &= ~(util_sum > self.util_limit)  # NaN (unknown) passes
            score[shared] = np.where(ok, -(slow_job + slow_res), NEG_INF)
        return score
