"""GPU fragmentation as FGD defines it, and its change when a request is placed (pure numpy).

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23 (§4), and its public simulator (hkust-adsl/kubernetes-scheduler-simulator).

Rule. For a node *n* and a request shape *m* (GPU units per GPU, GPUs, CPUs, accepted GPU types), the
fragment F_n(m) is the free GPU capacity of *n* that *m* cannot use: all of it when *m* cannot run on
*n* at all (too few CPUs, a GPU type it does not accept, fewer than its GPU count of GPUs with enough
room), else the free capacity of the GPUs whose free part is smaller than what *m* asks of one GPU
(a whole GPU asks all of it). A node's fragmentation is the expectation over the workload's *typical
shapes* (the most frequent shapes that together make up ``coverage`` = 95 % of requests, weights
renormalized): F_n = Σ_m p_m F_n(m), in milli-GPU. FGD places a request where it *increases* F the
least (the "gradient"); the cluster's fragmentation is Σ_n F_n.

Our reading:

* units: a GPU has ``gpu_cap`` units (1000 milli-GPU in the simulator, its shard count on a live
  cluster); a shape asks ``units`` of one GPU (Slurm's ``shard:N``: N units of whichever GPU) or,
  with ``units == 0``, whole GPUs. Amounts are reported in milli-GPU (units × 1000 / cap).
* CPU-only shapes: left out of the typical set by default; with ``include_cpu`` they join it as in
  FGD's runs (its ``isInvolvedCpuPods``, on by default there) and, as FGD's code counts them, every free
  milli-GPU of a node is a fragment for a CPU-only shape (it can use none of it). That adds the same
  amount to every candidate's increase, so it changes nothing under exact scores; it matters only
  through the renormalized weights of the GPU shapes and FGD's integer scores. Host memory is checked
  by the filter but is not a fragmentation dimension (FGD's is CPU only).
* typical set: ties in count are ordered as FGD orders them (the larger request first: CPUs, then
  milli-GPU per GPU, then GPU count, then GPU types).
* ties between equal increases go to the lowest GPU id (first fit); FGD's Kubernetes plugin rounds a
  sigmoid of the increase to an integer score 0–100 and its scheduler takes, among equal nodes, the
  first of a node order drawn per seed (``policies/fgd.py``'s ``quantize``, ``tie_break=order``).
* a GPU running an interference-shared whole-GPU job (the older sharing model) has no units left.

Speed: per node the model caches, for every typical shape, the count of GPUs with room and the free
capacity of those without; a placement changes one node (``ClusterState.node_version``), whose row
alone is recomputed, and the increase for every candidate GPU is one (candidates × shapes) numpy
expression.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .request import JobRequest
from .state import ClusterState

COVERAGE = 0.95  # FGD's typical-pod popularity threshold


@dataclass(frozen=True)
class Shape:
    """What a request asks, as fragmentation sees it."""

    units: int  # of one GPU; 0 = whole GPUs
    n_gpus: int  # 0 = CPU only
    cpu_milli: float = 0.0
    gpu_types: Tuple[str, ...] = ()  # () = any


def shape_of(req: JobRequest) -> Shape:
    types = (req.gpu_type,) if req.gpu_type else tuple(req.gpu_types)
    return Shape(int(req.gpu_units), int(req.n_gpus), float(req.cpu_milli), types)


def _fgd_order(shape: Shape):
    """FGD's order of request shapes (its ``PodResource.Less``): CPUs, milli-GPU per GPU, GPUs, types."""
    milli = shape.units if shape.units > 0 else (1000 if shape.n_gpus else 0)
    return (shape.cpu_milli, milli, shape.n_gpus, "|".join(shape.gpu_types))


def typical_shapes(counts: Dict[Shape, float], coverage: float = COVERAGE,
                   include_cpu: bool = False) -> List[Tuple[Shape, float]]:
    """The most frequent shapes making up ``coverage`` of the requests (the GPU requests only unless
    ``include_cpu``), with renormalized weights; ties in count in FGD's order (the larger first)."""
    gpu = [(s, c) for s, c in counts.items() if (s.n_gpus > 0 or include_cpu) and c > 0]
    total = sum(c for _, c in gpu)
    if not total:
        return []
    gpu.sort(key=lambda sc: (sc[1], _fgd_order(sc[0])), reverse=True)
    out, cum = [], 0.0
    for s, c in gpu:
        out.append((s, c))
        cum += c
        if cum >= coverage * total:
            break
    return [(s, c / cum) for s, c in out]


class FragmentationModel:
    """FGD's expected fragmentation of a :class:`ClusterState` under a workload of request shapes.

    ``observe(req)`` counts a request's shape (the workload a site has seen); ``prior`` gives counts
    known beforehand (a trace, a site's history). The typical set is recomputed when the counts
    have grown by half since it was last taken (it is stable once a workload has been seen).
    """

    def __init__(self, prior: Optional[Dict[Shape, float]] = None, coverage: float = COVERAGE,
                 include_cpu: bool = False):
        self.counts: Counter = Counter(prior or {})
        self.coverage = coverage
        self._include_cpu = bool(include_cpu)
        self._typical: Optional[List[Tuple[Shape, float]]] = None
        self._typical_at = 0.0
        self._state_key = None

    # ---- the workload ---------------------------------------------------------------------------
    def observe(self, req: JobRequest):
        self.counts[shape_of(req)] += 1
        total = sum(self.counts.values())
        if self._typical is not None and (not self._typical or total >= 1.5 * max(self._typical_at, 1.0)):
            self._typical = None

    def carry_over(self, old: "FragmentationModel"):
        """The shapes ``old`` counted (its prior included) replace this one's counts."""
        self.counts = Counter(old.counts)
        self._typical = None

    @property
    def include_cpu(self) -> bool:
        """CPU-only shapes in the typical set (FGD's ``isInvolvedCpuPods``)."""
        return self._include_cpu

    @include_cpu.setter
    def include_cpu(self, value: bool):
        if bool(value) != self._include_cpu:
            self._include_cpu = bool(value)
            self._typical = None

    @property
    def typical(self) -> List[Tuple[Shape, float]]:
        if self._typical is None:
            self._typical = typical_shapes(self.counts, self.coverage, self._include_cpu)
            self._typical_at = float(sum(self.counts.values()))
            self._state_key = None  # the per-node cache depends on the shapes
        return self._typical

    # ---- per-node cache -------------------------------------------------------------------------
    def _bind(self, state: ClusterState):
        shapes = self.typical
        key = (id(state), len(state.nodes), len(shapes))
        if key != self._state_key:
            self._state_key = key
            table = state.node_gpu_table
            self._valid = table >= 0
            self._gpus = np.where(self._valid, table, 0)
            n_nodes, n_shapes = len(state.nodes), len(shapes)
            self._p = np.array([p for _, p in shapes]) if shapes else np.zeros(0)
            self._s_units = np.array([s.units for s, _ in shapes], dtype=np.int64)
            self._s_n = np.array([s.n_gpus for s, _ in shapes], dtype=np.int64)
            self._s_gpu = self._s_n > 0  # a CPU-only shape can use no GPU: all free capacity is fragment
            self._s_cpu = np.array([s.cpu_milli for s, _ in shapes])
            node_type = np.array([state.gpu_type_id[node.first_gpu] if node.n_gpus else -1
                                  for node in state.nodes])
            self._type_ok = np.ones((n_nodes, n_shapes), dtype=bool)
            for k, (s, _) in enumerate(shapes):
                if s.gpu_types:
                    ids = [state.gpu_types.index(t) for t in s.gpu_types if t in state.gpu_types]
                    self._type_ok[:, k] = np.isin(node_type, ids)
            self._count = np.zeros((n_nodes, n_shapes), dtype=np.int64)
            self._lt = np.zeros((n_nodes, n_shapes))
            self._total = np.zeros(n_nodes)
            self._node_frag = np.zeros(n_nodes)  # F_n as last refreshed
            self._seen = np.full(n_nodes, -1, dtype=np.int64)
        stale = np.flatnonzero(self._seen != state.node_version)
        if len(stale):
            self._refresh(state, stale)
        return self

    def _refresh(self, state: ClusterState, nodes: np.ndarray):
        left, cap, milli = self._gpu_arrays(state, nodes)
        need = self._need(cap)  # (nodes, width, shapes)
        ge = (left[:, :, None] >= need) & self._valid[nodes][:, :, None]
        self._count[nodes] = ge.sum(axis=1)
        self._lt[nodes] = ((left * milli)[:, :, None] * ~ge).sum(axis=1)
        self._total[nodes] = (left * milli).sum(axis=1)
        if len(self._p):
            self._node_frag[nodes] = self._frag(nodes, self._count[nodes], self._lt[nodes], self._total[nodes],
                                                self._cpu_left(state, nodes))
        self._seen[nodes] = state.node_version[nodes]

    def _gpu_arrays(self, state, nodes):
        gpus, valid = self._gpus[nodes], self._valid[nodes]
        left_all = state.gpu_left()
        left = np.where(valid, left_all[gpus], 0)
        cap = np.where(valid, state.gpu_cap[gpus], 1)
        milli = np.where(valid, 1000.0 / cap, 0.0)
        return left, cap, milli

    def _need(self, cap):
        """Units a shape needs of a GPU of capacity ``cap`` (broadcast over a trailing shape axis)."""
        units = self._s_units
        return np.where(units > 0, units, cap[..., None])

    def _frag(self, nodes, count, lt, total, cpu_left):
        fits = self._type_ok[nodes] & (count >= self._s_n) & (cpu_left[:, None] >= self._s_cpu) & self._s_gpu
        return (np.where(fits, lt, total[:, None]) * self._p).sum(axis=1)

    def _cpu_left(self, state: ClusterState, nodes):
        total = state.node_cpu_total[nodes]
        return np.where(total > 0, total - state.node_cpu_used[nodes], np.inf)

    # ---- queries --------------------------------------------------------------------------------
    def node_fragmentation(self, state: ClusterState) -> np.ndarray:
        """F_n per node, milli-GPU."""
        self._bind(state)
        nodes = np.arange(len(state.nodes))
        if not len(self._p):
            return np.zeros(len(nodes))
        return self._node_frag.copy()

    def total(self, state: ClusterState) -> float:
        return float(self.node_fragmentation(state).sum())

    def delta_gpus(self, state: ClusterState, req: JobRequest, gpus: np.ndarray) -> np.ndarray:
        """The increase of F when ``req`` (a fraction of one GPU) takes each of ``gpus``."""
        self._bind(state)
        if not len(self._p) or not len(gpus):
            return np.zeros(len(gpus))
        nodes = state.gpu_node[gpus]
        left = state.gpu_left()[gpus][:, None]
        cap = state.gpu_cap[gpus]
        milli = (1000.0 / cap)[:, None]
        need = self._need(cap)
        u = int(req.gpu_units)
        after = left - u
        ge0, ge1 = left >= need, after >= need
        count = self._count[nodes] - ge0 + ge1
        lt = self._lt[nodes] - np.where(ge0, 0.0, left * milli) + np.where(ge1, 0.0, after * milli)
        total = self._total[nodes] - u * milli[:, 0]
        cpu_left = self._cpu_left(state, nodes)
        return self._frag(nodes, count, lt, total, cpu_left - req.cpu_milli) - self._node_frag[nodes]

    def delta_nodes(self, state: ClusterState, req: JobRequest, nodes: np.ndarray) -> np.ndarray:
        """The increase of F when ``req`` (whole GPUs, or CPU only) takes ``gpus_per_node`` free GPUs
        of each of ``nodes``."""
        self._bind(state)
        if not len(self._p) or not len(nodes):
            return np.zeros(len(nodes))
        k = int(req.gpus_per_node) if req.n_gpus else 0
        cpu_left = self._cpu_left(state, nodes)
        before = self._node_frag[nodes]
        # a free GPU had room for every shape (units <= cap) and has none once taken
        count = self._count[nodes] - k * (self._s_units[None, :] >= 0)
        total = self._total[nodes] - 1000.0 * k
        return self._frag(nodes, count, self._lt[nodes], total, cpu_left - req.cpu_milli) - before

    def delta_for(self, state: ClusterState, req: JobRequest, gpus: np.ndarray) -> np.ndarray:
        """Per candidate GPU: the increase of F if ``req`` is placed there (for a whole-GPU job, on
        that GPU's node)."""
        if req.gpu_units > 0:
            keys = state.gpu_node[gpus].astype(np.int64) * (int(state.gpu_cap.max()) + 1) + state.gpu_left()[gpus]
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            return self.delta_gpus(state, req, gpus[first])[inverse]
        node_of = state.gpu_node[gpus]
        if len(node_of) and (np.diff(node_of) >= 0).all():  # GPU ids come node by node: no sort needed
            starts = np.flatnonzero(np.r_[True, node_of[1:] != node_of[:-1]])
            inverse = np.cumsum(np.r_[False, node_of[1:] != node_of[:-1]])
            return self.delta_nodes(state, req, node_of[starts])[inverse]
        uniq, inverse = np.unique(node_of, return_inverse=True)
        return self.delta_nodes(state, req, uniq)[inverse]


def workload_counts(requests: Iterable[JobRequest]) -> Dict[Shape, float]:
    """Shape counts of a list of requests (the prior of a FragmentationModel)."""
    return dict(Counter(shape_of(r) for r in requests))


def fragmentation_pct(state: ClusterState, model: FragmentationModel) -> float:
    """The cluster's fragmentation as a share of its GPU capacity (percent)."""
    n = state.n_gpus
    return 100.0 * model.total(state) / (1000.0 * n) if n else 0.0


def shapes_summary(model: FragmentationModel) -> List[dict]:
    return [{"units": s.units, "gpus": s.n_gpus, "cpu_milli": s.cpu_milli, "gpu_types": list(s.gpu_types),
             "weight": round(p, 4)} for s, p in model.typical]


__all__ = ["COVERAGE", "FragmentationModel", "Shape", "fragmentation_pct", "shape_of", "shapes_summary",
           "typical_shapes", "workload_counts"]
