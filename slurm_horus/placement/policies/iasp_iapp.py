"""iasp-iapp: interference-aware parallelization at two levels, cluster then node.

Source: Xu et al., "Interference-aware parallelization for deep learning workload in GPU cluster",
Cluster Computing 23, 2020. Rule, per job in FIFO order:

1. **cluster level** (CLWP, with IASP — interference-aware similarity prediction by collaborative
   filtering): among the nodes that can take the job, the job goes to the node(s) whose running
   jobs are least similar to it — similarity being the predicted throughput loss of the job next to
   each of the node's residents, averaged over them (a node running nothing is not similar at all);
2. **node level** (NLWP, with IAPP — interference-aware performance prediction by a neural
   network): on the chosen node, the job's GPUs are those of the best predicted performance (a free
   GPU performs 1, a shared one the predicted normalized throughput; below ``min_tput`` a GPU is not
   used), minus a communication cost of ``comm_penalty`` for every extra NVLink/PCIe group the job's
   GPUs span (the tasks of a multi-GPU job exchange gradients).

Predictors (``similarity``, ``performance``): ``cf`` (low-rank factorization) or ``ncf`` (neural
collaborative filtering, the paper's "deep collaborative filtering"); ``mlp`` (one hidden layer of
16) or ``mlp-deep`` (three hidden layers, the paper's "deep neural network"). The defaults are the
better pair on bench/bench_sim.py and bench/bench_interference.py (docs/placement.md). Our reading:
the paper's similarity is learned from job features and co-location history; here it is the
predicted interference itself; a multi-node job takes the ``nodes`` least similar nodes; a GPU runs
at most two jobs; the node's spread over servers is fixed by the request's shape (``-N``), so the
communication cost between nodes is the same for every node choice and only the in-node groups are
scored (the simulator charges the cross-node cost Gavel measured, see sim/truth.py).
"""

import numpy as np

from ..framework import NEG_INF, NO_QUALIFYING_GPU, Feasible, Policy, kept_after_release, nodes_holding
from ..request import Decision


class IaspIapp(Policy):
    name = "iasp-iapp"
    share = True
    max_jobs_per_gpu = 2
    min_tput = 0.5  # IAPP does not place where the predicted performance falls below this
    comm_penalty = 0.05
    similarity = "cf"
    performance = "mlp"

    def __init__(self, pairs=None, similarity_pairs=None, **options):
        super().__init__(pairs, **options)
        self.similarity_pairs = similarity_pairs if similarity_pairs is not None else pairs

    def pair_tables(self):
        return [t for t in (self.pairs, self.similarity_pairs) if t is not None]

    def node_similarity(self, state, class_id) -> np.ndarray:
        """IASP: mean predicted interference (1 − predicted throughput) of the job next to each node's residents."""
        occupied = np.flatnonzero(state.gpu_class0 >= 0)
        n_nodes = len(state.nodes)
        if len(occupied) == 0 or self.similarity_pairs is None:
            return np.zeros(n_nodes)
        if len(state.gpu_types) == 1:  # one GPU type: one row of one matrix
            sim = 1.0 - self.similarity_pairs.matrix(state.gpu_types[0])[class_id][state.gpu_class0[occupied]]
        else:
            sim = self._similarity_by_type(state, class_id, occupied)
        nodes = state.gpu_node[occupied]
        total = np.bincount(nodes, weights=sim, minlength=n_nodes)
        count = np.bincount(nodes, minlength=n_nodes)
        return total / np.maximum(count, 1)

    def _similarity_by_type(self, state, class_id, occupied) -> np.ndarray:
        types = state.gpu_type_id[occupied]
        sim = np.empty(len(occupied))
        for t in np.unique(types):
            mat = self.similarity_pairs.matrix(state.gpu_types[t])
            sel = types == t
            sim[sel] = 1.0 - mat[class_id, state.gpu_class0[occupied[sel]]]
        return sim

    def decide_quickly(self, cycle):
        """The pipeline's answer without scoring every feasible GPU: its wait, where
        :meth:`_too_few_nodes` shows it; for a 1-GPU job, the GPU :meth:`select` takes
        (:meth:`_one_gpu`). Held equal to the pipeline by tests/test_placement.py."""
        feasible = cycle.feasible
        if feasible is None or feasible.idx is not cycle.idx:
            feasible = Feasible(cycle.state, np.array(cycle.idx))
        if self._too_few_nodes(cycle.state, feasible, cycle.class_id, cycle.req):
            return Decision(cycle.req.job_id, False, self.name, reason=NO_QUALIFYING_GPU, n_feasible=len(cycle.idx))
        return self._one_gpu(cycle, feasible)

    def _one_gpu(self, cycle, feasible):
        """The pipeline's placement of a 1-GPU job (one GPU type), scoring only the chosen node's GPUs:
        a GPU scores its predicted performance (1 when free; the pair value next to its resident, which
        must be positive and at least ``min_tput``); the candidate nodes hold a GPU that scores, the
        least similar of them is chosen (:meth:`node_similarity`), and on it the first GPU of the
        highest score (:meth:`node_gpus`). None: ask the pipeline."""
        state, req = cycle.state, cycle.req
        if req.n_gpus != 1 or req.gpu_units > 0 or self.pairs is None or len(state.gpu_types) != 1 \
                or type(self).score_gpus is not IaspIapp.score_gpus \
                or type(self).select is not IaspIapp.select or type(self).node_gpus is not IaspIapp.node_gpus \
                or type(self).node_similarity is not IaspIapp.node_similarity \
                or type(self)._fill_predictions is not Policy._fill_predictions:
            return None
        c, idx = cycle.class_id, feasible.idx
        mat = self.pairs.matrix(state.gpu_types[0])
        scores = self._class_scores(mat, c)
        usable = self._usable(state, feasible, c, mat)
        candidates = np.flatnonzero(usable >= 1)
        if len(candidates) == 0:
            return None  # (the pipeline's wait and its reason)
        similarity = self.node_similarity(state, c)[candidates]
        if np.isnan(similarity).any():
            return None
        node = int(candidates[int(np.argmin(similarity))])
        gpus = state.node_gpu_table[node]
        gpus = gpus[gpus >= 0]
        pos = np.searchsorted(idx, gpus)  # idx is sorted (flatnonzero)
        inside = pos < len(idx)
        pos = np.sort(pos[inside][idx[pos[inside]] == gpus[inside]])
        gpu_scores = scores[feasible.resident[pos]]
        return self._decision_at(cycle, [int(pos[int(np.argmax(gpu_scores))])])

    def _class_scores(self, mat, c):
        """Per resident class (trailing entry: a free GPU, resident -1), the score the pipeline gives
        a job of class ``c`` on a GPU running one job of it (:meth:`score_gpus`, a predicted 0 masked
        as :meth:`decide` masks it): the predicted performance, 1 when free; NEG_INF under
        ``min_tput``. Kept per matrix and measurement count (read it, never write to it)."""
        kept = self.__dict__.get("_scores_kept")
        if kept is None or kept[0] is not mat or kept[1] != len(mat) or kept[2] != self.pairs.n_observations:
            kept = self._scores_kept = (mat, len(mat), self.pairs.n_observations, {})
        scores = kept[3].get(c)
        if scores is None:
            perf = np.append(mat[c], 1.0)
            scores = kept[3][c] = np.where((perf > 0) & (perf >= self.min_tput), perf, NEG_INF)
        return scores

    def _usable(self, state, feasible, c, mat):
        """Per node, the feasible GPUs a job of class ``c`` may use (:meth:`_class_scores` above
        NEG_INF), kept per class for this cluster version."""
        key = ("iasp-usable", c, len(mat), self.pairs.n_observations)
        usable = feasible.memo.get(key)
        if usable is None:
            ok = self._class_scores(mat, c) > NEG_INF
            usable = feasible.memo[key] = np.bincount(state.gpu_node[feasible.idx[ok[feasible.resident]]],
                                                      minlength=len(state.nodes))
        return usable

    def wait_reason(self, state, req, ctx):
        """The wait :meth:`decide_quickly` would answer, from this cycle's feasible GPUs for the
        request's shape on this cluster version (``Feasible``, :meth:`cycle_feasible`)."""
        feasible = self.cycle_feasible(state, req, ctx) if req.n_gpus else None
        if feasible is None or not self._too_few_nodes(state, feasible, state.classes.ids[req.job_class], req):
            return None
        return NO_QUALIFYING_GPU

    def wait_epoch(self, state, ctx):
        """:meth:`wait_reason` reads, besides the cluster, only the pair table (its classes; the
        measurements of the job's class, :meth:`wait_stamp`); not the clock, nor the job's duration.
        A placement only takes GPUs the job could use (a free one busy, a shared one full): a wait
        holds after it."""
        if type(self).wait_reason is not IaspIapp.wait_reason or type(self)._too_few_nodes is not IaspIapp._too_few_nodes \
                or self.pairs is None:
            return None
        return ("iasp-iapp", len(state.classes.names), id(self.pairs.classes))

    def waits_after_release(self, state, ctx, waits, nodes):
        """Every wait :meth:`_too_few_nodes` gives says that fewer than ``nodes`` nodes hold
        ``gpus_per_node`` GPUs the job may use (free, or a resident it is predicted to keep
        ``min_tput`` next to): a release changes that only on its nodes
        (:func:`~..framework.kept_after_release`; no duration: limits inf or 0)."""
        mat = self.pairs.matrix(state.gpu_types[0])

        def limits(req, c, residents, e_b):
            row = mat[c][residents]
            return np.where((row > 0) & (row >= self.min_tput), np.inf, 0.0)

        return kept_after_release(state, waits, nodes, self.max_jobs_per_gpu, ctx.now, limits)

    def wait_stamp(self, req):
        """A job's wait reads the pair table's row of its class only: the measurements of its pairs."""
        return self.pairs.measured.get(req.job_class, 0)

    def _too_few_nodes(self, state, feasible, c, req) -> bool:
        """Whether fewer nodes than the job asks have ``gpus_per_node`` GPUs it may use
        (:meth:`_usable`: free, or running one job next to which its predicted performance is at least
        ``min_tput``): then :meth:`select` finds no candidate and the job waits. One GPU type, whole
        GPUs; the count per node is kept per class for this cluster version (``Feasible.memo``)."""
        if self.pairs is None or req.gpu_units > 0 or len(state.gpu_types) != 1 or type(self).score_gpus \
                is not IaspIapp.score_gpus or type(self)._fill_predictions is not Policy._fill_predictions:
            return False
        if req.n_gpus == 1 and feasible.first_free >= 0:
            return False  # a free feasible GPU: one node with one usable GPU (no count needed)
        usable = self._usable(state, feasible, c, self.pairs.matrix(state.gpu_types[0]))
        return int(np.count_nonzero(usable >= req.gpus_per_node)) < req.nodes

    def score_gpus(self, cycle):
        """IAPP's predicted performance of the job on each feasible GPU."""
        perf = np.where(cycle.free, 1.0, cycle.job_tput)
        return np.where(perf >= self.min_tput, perf, NEG_INF)

    def select(self, cycle):
        """Stage 1 picks the node(s) by similarity; stage 2 the GPUs on each (:meth:`node_gpus`)."""
        state, req = cycle.state, cycle.req
        candidates = nodes_holding(state, cycle.idx[cycle.score > NEG_INF], req.gpus_per_node)
        if len(candidates) < req.nodes:
            return None
        similarity = self.node_similarity(state, cycle.class_id)[candidates]
        if req.nodes == 1 and not np.isnan(similarity).any():
            chosen = candidates[[int(np.argmin(similarity))]]  # the stable sort's first: the first of the least
        else:
            chosen = candidates[np.argsort(similarity, kind="stable")[:req.nodes]]  # ties: node order
        picks = [self.node_gpus(cycle, node) for node in sorted(chosen)]
        return np.concatenate(picks)

    def node_gpus(self, cycle, node) -> np.ndarray:
        """Positions (in ``cycle.idx``) of the job's GPUs on ``node``: the set of ``gpus_per_node``
        usable GPUs maximizing summed predicted performance − ``comm_penalty`` × (groups spanned − 1),
        found over the subsets of the node's NVLink/PCIe groups (a node has a handful)."""
        state, k = cycle.state, cycle.req.gpus_per_node
        pos = np.flatnonzero((state.gpu_node[cycle.idx] == node) & (cycle.score > NEG_INF))
        if k == 1:  # one GPU spans one group: the best one (ties: the first)
            return pos[[int(np.argmax(cycle.score[pos]))]]
        groups = state.gpu_group[cycle.idx[pos]]
        names = np.unique(groups)
        best, best_value = None, -np.inf
        for mask in range(1, 1 << len(names)):
            members = names[[bool(mask >> i & 1) for i in range(len(names))]]
            inside = pos[np.isin(groups, members)]
            if len(inside) < k:
                continue
            top = inside[np.argsort(-cycle.score[inside], kind="stable")[:k]]
            spanned = len(np.unique(state.gpu_group[cycle.idx[top]]))
            value = cycle.score[top].sum() - self.comm_penalty * (spanned - 1)
            if value > best_value + 1e-12:
                best, best_value = np.sort(top), value
        return best
