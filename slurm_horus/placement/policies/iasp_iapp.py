"""iasp-iapp: interference-aware scheduling at two levels.

Source: the two-level IASP/IAPP scheme (interference-aware scheduling and placement for DL jobs):
the cluster level (IASP) picks the node whose running jobs are least similar to the new job, with
similarity predicted by collaborative filtering (``cf`` predictor: the predicted throughput loss of
the new job next to each resident); the node level (IAPP) picks the GPUs of that node by predicted
performance (``mlp`` predictor) plus a communication cost for multi-GPU jobs. FIFO order; a GPU runs
at most two jobs.
"""

import numpy as np

from ..framework import NEG_INF, Policy


class IaspIapp(Policy):
    name = "iasp-iapp"
    share = True
    max_jobs_per_gpu = 2
    min_tput = 0.5  # IAPP does not place where the predicted performance falls below this

    def __init__(self, pairs=None, similarity_pairs=None, **options):
        super().__init__(pairs, **options)
        self.similarity_pairs = similarity_pairs if similarity_pairs is not None else pairs

    def pair_tables(self):
        return [t for t in (self.pairs, self.similarity_pairs) if t is not None]

    def _node_similarity(self, cycle) -> np.ndarray:
        """Mean predicted interference (1 − cf throughput) between the job and each node's residents."""
        state = cycle.state
        occupied = np.flatnonzero(state.gpu_class0 >= 0)
        n_nodes = len(state.nodes)
        if len(occupied) == 0 or self.similarity_pairs is None:
            return np.zeros(n_nodes)
        types = state.gpu_type_id[occupied]
        sim = np.empty(len(occupied))
        for t in np.unique(types):
            mat = self.similarity_pairs.matrix(state.gpu_types[t])
            sel = types == t
            sim[sel] = 1.0 - mat[cycle.class_id, state.gpu_class0[occupied[sel]]]
        nodes = state.gpu_node[occupied]
        total = np.bincount(nodes, weights=sim, minlength=n_nodes)
        count = np.bincount(nodes, minlength=n_nodes)
        return total / np.maximum(count, 1)

    def score_gpus(self, cycle):
        similarity = self._node_similarity(cycle)[cycle.state.gpu_node[cycle.idx]]
        perf = np.where(cycle.free, 1.0, cycle.job_tput)
        score = -10.0 * similarity + perf
        return np.where(perf >= self.min_tput, score, NEG_INF)
