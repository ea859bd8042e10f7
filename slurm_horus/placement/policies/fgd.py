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
"""

import numpy as np

from ..fragmentation import FragmentationModel
from ..framework import Policy


class FragmentationAware(Policy):
    """Base of the fragmentation-aware policies: FIFO, capacity-bound, one model of the workload.

    ``tie_break``: ``first`` (default, the placement core's rule) — the lowest GPU id (first fit);
    ``random`` — among the nodes whose best GPU has the best score, one at random (``seed``), then its
    first GPU of that score: what the Kubernetes scheduler under FGD's simulator does. ``quantize``:
    scores rounded to the integers 0–100 the Kubernetes plugins return (more ties; fgd, bestfit)."""

    share = False
    name = "fragmentation"
    tie_break = "first"
    quantize = False
    seed = 0

    def __init__(self, pairs=None, fragmentation=None, **options):
        super().__init__(pairs, **options)
        if self.tie_break not in ("random", "first"):
            raise ValueError(f"policy {self.name}: tie_break must be random or first")
        self.fragmentation = fragmentation if fragmentation is not None else FragmentationModel()
        self.rng = np.random.default_rng(int(self.seed))

    def select(self, cycle):
        if cycle.req.n_gpus != 1 or self.tie_break == "first" or len(cycle.score) == 0:
            return super().select(cycle)
        score = cycle.score
        best = score.max()
        if best == -np.inf:
            return None
        tied = np.flatnonzero(score == best)
        nodes = np.unique(cycle.state.gpu_node[cycle.idx[tied]])
        node = nodes[int(self.rng.integers(len(nodes)))] if len(nodes) > 1 else nodes[0]
        return np.array([tied[np.argmax(cycle.state.gpu_node[cycle.idx[tied]] == node)]])

    def _cpu_pick(self, score):
        """Ties of a CPU-only request's node scores, broken like GPU ones."""
        if self.tie_break == "first" or len(score) < 2:
            return score
        best = score.max()
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
    """FGD's plugin score: sigmoid of the fragmentation decrease (per 1000 milli-GPU) × 100, an integer."""
    if not quantize:
        return -delta
    return np.floor(100.0 / (1.0 + np.exp(np.clip(delta / 1000.0, -50, 50))))


class FGD(FragmentationAware):
    name = "fgd"

    def score_gpus(self, cycle):
        return _sigmoid_score(self.fragmentation.delta_for(cycle.state, cycle.req, cycle.idx), self.quantize)

    def score_cpu_nodes(self, state, req, nodes):
        return self._cpu_pick(_sigmoid_score(self.fragmentation.delta_nodes(state, req, nodes), self.quantize))


def _node_free(state):
    """Per node: free CPU (milli, inf when unknown) and free GPU capacity in milli-GPU."""
    left = state.gpu_left() * (1000.0 / state.gpu_cap)
    gpu = np.bincount(state.gpu_node, weights=left, minlength=len(state.nodes))
    cpu = np.where(state.node_cpu_total > 0, state.node_cpu_total - state.node_cpu_used, 0.0)
    return cpu, gpu


class BestFit(FragmentationAware):
    name = "bestfit"

    def _node_score(self, state, req, nodes, gpu_milli):
        cpu, gpu = _node_free(state)
        max_cpu = max(float(state.node_cpu_total.max(initial=0.0)), 1.0)
        max_gpu = max(float(np.bincount(state.gpu_node, minlength=len(state.nodes)).max(initial=0)) * 1000.0, 1.0)
        rest = 0.5 * (cpu[nodes] - req.cpu_milli) / max_cpu + 0.5 * (gpu[nodes] - gpu_milli) / max_gpu
        return np.floor((1.0 - rest) * 100.0) if self.quantize else -rest

    def score_gpus(self, cycle):
        state, req = cycle.state, cycle.req
        milli = req.gpu_units * 1000.0 / state.gpu_cap[cycle.idx] if req.gpu_units else 1000.0 * req.gpus_per_node
        return self._node_score(state, req, state.gpu_node[cycle.idx], milli) + self._tightest(cycle)

    def score_cpu_nodes(self, state, req, nodes):
        return self._cpu_pick(self._node_score(state, req, nodes, 0.0))


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
