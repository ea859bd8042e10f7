"""fgd and the baselines of its paper: placing fractional, whole-GPU and CPU-only requests so a
cluster fills up.

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23, §4 (FGD) and §6.1 (baselines), and the score plugins of its public
simulator (hkust-adsl/kubernetes-scheduler-simulator). Every policy here is FIFO, places each request
at once or not at all, and never time-shares whole GPUs: a request's GPU units are its share, the
filter (``Policy.filter_gpus``) holds capacity, CPUs, host memory and GPU types.

* ``fgd`` — the node and GPU where the expected fragmentation (``placement/fragmentation.py``)
  grows least; ties to the lowest GPU id.
* ``bestfit`` — the node left with the least free resources after placement: 0.5 × free CPU / the
  largest node's CPUs + 0.5 × free GPU / the largest node's GPUs, lowest first; within the node the
  GPU with the least room that fits (our reading of the plugin's default GPU choice).
* ``packing`` — GPU packing: a GPU already partly used (fullest first), else a free GPU on a node
  already in use, else a free node (the fewest free GPUs first).
* ``clustering`` — GPU clustering (Gandiva's affinity): a node whose running requests all have the
  job's GPU shape, else one that has it among others, else an idle node, else any; within each tier
  the node with the least free GPU capacity, and the fullest GPU that fits.
* ``dotprod`` — Tetris's alignment as the FGD simulator scores it: the candidate where the dot
  product of the node's free (CPU, GPU) vector and the request's, each normalized by the node's
  capacity, is *smallest*.
* ``random`` — a feasible node and GPU drawn at random (``seed`` option).

Our reading (what the paper leaves open or Slurm changes): capacity is in units of a GPU (milli-GPU
in the simulator, shards on a live cluster); host memory is checked but not scored; node and GPU
are chosen together over all feasible GPUs (the paper scores nodes, then picks the GPU inside).

FGD's simulator (hkust-adsl/kubernetes-scheduler-simulator, read for its rules, no code taken) differs
from the defaults here in three ways, each an option (docs/placement.md has the table):

* ``quantize`` — its score plugins return integers: FGD ``int(sigmoid(decrease / 1000) * 100)``,
  BestFit ``int((1 - rest) * 100)`` then min-max normalized to 0–100 over the feasible nodes;
* ``tie_break=order`` — its fork of the Kubernetes scheduler takes, among the nodes of the best score,
  the lexicographically smallest name, and the simulator prefixes the names with a permutation drawn
  per seed: the first node of a per-seed random order (the stock scheduler draws at random:
  ``tie_break=random``); inside the node the plugin picks the GPU (FGD: the first of the best score;
  the others: the GPU with the least room that fits);
* ``cpu_shapes`` (fgd) — its typical workload includes the CPU-only requests, for which every free
  GPU milli counts as fragment (``placement/fragmentation.py``).
"""

import numpy as np

from ..fragmentation import FragmentationModel
from ..framework import NEG_INF, Policy


class FragmentationAware(Policy):
    """Base of the fragmentation-aware policies: FIFO, capacity-bound, one model of the workload.

    ``tie_break``: ``first`` (default, the placement core's rule) — the lowest GPU id (first fit);
    ``order`` — among the nodes of the best node score the first in a node order drawn once from
    ``seed``, then inside it the GPU the policy ranks first (its first of that score): what FGD's
    simulator does (its scheduler takes, among the nodes of equal score, the lexicographically smallest
    name, and the names start with a random permutation drawn per seed; the score plugin picks the
    GPU); ``random`` — a fresh draw among the nodes of the best score at each decision (the stock
    Kubernetes scheduler). ``quantize``: scores rounded to the integers 0–100 the Kubernetes plugins
    return (more ties; fgd, bestfit). ``cpu_shapes``: CPU-only request shapes join the typical workload
    (FGD's default, ``placement/fragmentation.py``). ``fgd/quantize=true/tie_break=order/cpu_shapes=true``
    is the way FGD's own simulator scores and breaks ties (``bench/bench_fgd.py`` calls it
    ``fgd-paper``)."""

    share = False
    name = "fragmentation"
    tie_break = "first"
    quantize = False
    cpu_shapes = False
    seed = 0

    def __init__(self, pairs=None, fragmentation=None, **options):
        super().__init__(pairs, **options)
        if self.tie_break not in ("random", "first", "order"):
            raise ValueError(f"policy {self.name}: tie_break must be first, order or random")
        self.fragmentation = fragmentation if fragmentation is not None else FragmentationModel()
        if self.cpu_shapes:
            self.fragmentation.include_cpu = True
        self.rng = np.random.default_rng(int(self.seed))
        self._rank = np.zeros(0)

    def _node_rank(self, state):
        """Per node: its place in the node order of ``tie_break=order`` (drawn once from ``seed``)."""
        if len(self._rank) != len(state.nodes):
            order = np.random.default_rng([int(self.seed), 7]).permutation(len(state.nodes))
            self._rank = np.empty(len(state.nodes))
            self._rank[order] = np.arange(len(state.nodes))
        return self._rank

    def _node_key(self, cycle):
        """Per candidate GPU: the score of its node as the scheduler compares nodes (ties on it are
        drawn at random); by default the GPU's own score (the best GPU speaks for its node)."""
        return cycle.score

    def select(self, cycle):
        if self.tie_break == "first" or len(cycle.score) == 0:
            return super().select(cycle)
        state = cycle.state
        if cycle.req.n_gpus != 1:
            # whole GPUs on one or more nodes: equal nodes in the tie order (a term per node far
            # below any score step, so it only reorders ties)
            if self.tie_break == "order":
                noise = 1e-8 * (1.0 - self._node_rank(state) / max(len(state.nodes), 1))
            else:
                noise = 1e-8 * self.rng.random(len(state.nodes))
            cycle.score = cycle.score + noise[state.gpu_node[cycle.idx]]
            return super().select(cycle)
        score = cycle.score
        key = self._node_key(cycle)
        usable = score > NEG_INF
        if not usable.any():
            return None
        best = key[usable].max()
        tied = np.flatnonzero(usable & (key == best))
        nodes = np.unique(state.gpu_node[cycle.idx[tied]])
        if len(nodes) == 1:
            node = nodes[0]
        elif self.tie_break == "order":
            node = nodes[int(np.argmin(self._node_rank(state)[nodes]))]
        else:
            node = nodes[int(self.rng.integers(len(nodes)))]
        mine = np.flatnonzero(usable & (state.gpu_node[cycle.idx] == node))
        return np.array([mine[int(np.argmax(score[mine]))]])

    def _cpu_pick(self, score, state=None, nodes=None):
        """Ties of a CPU-only request's node scores, broken like GPU ones."""
        if self.tie_break == "first" or len(score) < 2:
            return score
        best = score.max()
        if self.tie_break == "order" and state is not None:
            rank = self._node_rank(state)[nodes]
            return np.where(score == best, best + (1.0 - rank / max(len(state.nodes), 1)) * 1e-9, score)
        return np.where(score == best, best + self.rng.random(len(score)) * 1e-9, score)

    def running_job(self, req, decision, now):
        # the workload fragmentation is measured against: the requests that ran (a decision may be
        # asked and not applied: a dry run, an offer, a job that waits)
        self.fragmentation.observe(req)
        return super().running_job(req, decision, now)

    # helpers over the feasible GPUs of a cycle
    @staticmethod
    def _left_frac(cycle):
        state, idx = cycle.state, cycle.idx
        return state.gpu_left()[idx] / state.gpu_cap[idx]

    @staticmethod
    def _tightest(cycle):
        """A tie-breaker in (0, 1e-6]: fuller GPUs first (best fit inside a node)."""
        return -1e-6 * FragmentationAware._left_frac(cycle)


def _sigmoid_score(delta, quantize):
    """FGD's plugin score: ``int(sigmoid(decrease / 1000) * 100)`` of the fragmentation decrease
    (``-delta``), in Go's order of operations; the increase is first rounded to 1e-6 milli-GPU so that
    an unchanged fragmentation scores exactly 50 whatever the summation order."""
    if not quantize:
        return -delta
    x = -np.round(delta, 6) / 1000.0
    return np.floor((1.0 / (1.0 + np.exp(np.clip(-x, -50, 50)))) * 100.0)


class FGD(FragmentationAware):
    name = "fgd"

    def score_gpus(self, cycle):
        return _sigmoid_score(self.fragmentation.delta_for(cycle.state, cycle.req, cycle.idx), self.quantize)

    def score_cpu_nodes(self, state, req, nodes):
        return self._cpu_pick(_sigmoid_score(self.fragmentation.delta_nodes(state, req, nodes), self.quantize),
                              state, nodes)


def _node_free(state):
    """Per node: free CPU (milli, inf when unknown) and free GPU capacity in milli-GPU."""
    left = state.gpu_left() * (1000.0 / state.gpu_cap)
    gpu = np.bincount(state.gpu_node, weights=left, minlength=len(state.nodes))
    cpu = np.where(state.node_cpu_total > 0, state.node_cpu_total - state.node_cpu_used, 0.0)
    return cpu, gpu


class BestFit(FragmentationAware):
    name = "bestfit"

    def _node_score(self, state, req, nodes, gpu_milli):
        """Least free resources left, higher is better: ``-rest``, or with ``quantize`` the plugin's
        integer ``int((1 - rest) * 100)`` min-max normalized to 0–100 over the candidates (its
        NormalizeScore, integer arithmetic)."""
        cpu, gpu = _node_free(state)
        max_cpu = max(float(state.node_cpu_total.max(initial=0.0)), 1.0)
        max_gpu = max(float(np.bincount(state.gpu_node, minlength=len(state.nodes)).max(initial=0)) * 1000.0, 1.0)
        # in the plugin's order of operations (its integer scores depend on the last bit)
        rest = (cpu[nodes] - req.cpu_milli) / max_cpu * 0.5
        rest = rest + (gpu[nodes] - gpu_milli) / max_gpu * 0.5
        if not self.quantize:
            return -rest
        raw = np.floor((1.0 - rest) * 100.0)
        lo, hi = (raw.min(), raw.max()) if len(raw) else (0.0, 0.0)
        return np.floor((raw - lo) * 100.0 / (hi - lo)) if hi > lo else np.zeros(len(raw))

    def _gpu_milli(self, cycle):
        state, req = cycle.state, cycle.req
        return req.gpu_units * 1000.0 / state.gpu_cap[cycle.idx] if req.gpu_units else 1000.0 * req.gpus_per_node

    def score_gpus(self, cycle):
        state = cycle.state
        node_score = self._node_score(state, cycle.req, state.gpu_node[cycle.idx], self._gpu_milli(cycle))
        cycle.notes["node_score"] = node_score
        return node_score + self._tightest(cycle)

    def _node_key(self, cycle):
        return cycle.notes.get("node_score", cycle.score)

    def score_cpu_nodes(self, state, req, nodes):
        return self._cpu_pick(self._node_score(state, req, nodes, 0.0), state, nodes)


class Packing(FragmentationAware):
    name = "packing"

    def score_gpus(self, cycle):
        state, idx = cycle.state, cycle.idx
        used = state.gpu_used[idx] > 0
        node_busy = (state.node_free < np.bincount(state.gpu_node, minlength=len(state.nodes)))[state.gpu_node[idx]]
        node_free_gpus = state.node_free[state.gpu_node[idx]]
        fill = 1.0 - self._left_frac(cycle)
        return np.where(used, 2.0 + fill, np.where(node_busy, 1.0, -1e-3 * node_free_gpus))

    def score_cpu_nodes(self, state, req, nodes):
        return -state.node_free[nodes].astype(float) if len(state.gpu_node) else np.zeros(len(nodes))


class Clustering(FragmentationAware):
    name = "clustering"

    def _affinities(self, state):
        """Per node: the set of GPU shapes (units, GPUs) of the jobs running there."""
        cache = getattr(self, "_aff", None)
        if cache is None or cache[0] is not state:
            cache = self._aff = (state, [set() for _ in state.nodes], np.full(len(state.nodes), -1, dtype=np.int64))
        _, sets, seen = cache
        for k in np.flatnonzero(seen != state.node_version):
            node = state.nodes[k]
            shapes = set()
            for g in range(node.first_gpu, node.first_gpu + node.n_gpus):
                for job_id in state.gpu_jobs[g]:
                    job = state.jobs[job_id]
                    shapes.add((job.gpu_units, len(job.gpus)))
            sets[k] = shapes
            seen[k] = state.node_version[k]
        return sets

    def score_gpus(self, cycle):
        state, req, idx = cycle.state, cycle.req, cycle.idx
        sets = self._affinities(state)
        mine = (req.gpu_units, req.n_gpus)
        _, gpu_free = _node_free(state)
        nodes = state.gpu_node[idx]
        tier = np.array([3.0 if s == {mine} else 2.0 if mine in s else 1.0 if not s else 0.0
                         for s in (sets[k] for k in nodes)])
        max_gpu = max(float(gpu_free.max(initial=0.0)), 1.0)
        return tier + 0.5 * (1.0 - gpu_free[nodes] / (max_gpu + 1.0)) + self._tightest(cycle)


class DotProd(FragmentationAware):
    name = "dotprod"

    def score_gpus(self, cycle):
        state, req, idx = cycle.state, cycle.req, cycle.idx
        nodes = state.gpu_node[idx]
        cpu_total = state.node_cpu_total[nodes]
        cpu_free, gpu_free = _node_free(state)
        cpu_term = np.where(cpu_total > 0, (cpu_free[nodes] / np.maximum(cpu_total, 1.0))
                            * (req.cpu_milli / np.maximum(cpu_total, 1.0)), 0.0)
        if req.gpu_units:
            gpu_term = self._left_frac(cycle) * (req.gpu_units / state.gpu_cap[idx])
        else:
            n = np.bincount(state.gpu_node, minlength=len(state.nodes))[nodes]
            gpu_term = (gpu_free[nodes] / (1000.0 * n)) * (req.gpus_per_node / n)
        return -(cpu_term + gpu_term)

    def score_cpu_nodes(self, state, req, nodes):
        cpu_total = state.node_cpu_total[nodes]
        cpu_free, _ = _node_free(state)
        return -np.where(cpu_total > 0, cpu_free[nodes] / np.maximum(cpu_total, 1.0), 0.0)


class RandomFit(FragmentationAware):
    name = "random"

    def score_gpus(self, cycle):
        state = cycle.state
        per_node = self.rng.random(len(state.nodes))
        return per_node[state.gpu_node[cycle.idx]] + 1e-6 * self.rng.random(len(cycle.idx))

    def score_cpu_nodes(self, state, req, nodes):
        return self.rng.random(len(nodes))


FRAGMENTATION_POLICIES = {"fgd": FGD, "bestfit": BestFit, "packing": Packing, "clustering": Clustering,
                          "dotprod": DotProd, "random": RandomFit}
