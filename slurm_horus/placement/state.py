"""ClusterState: nodes, GPUs and the jobs running on each GPU, kept as flat numpy arrays.

Every GPU of the cluster has one flat id ``g`` (0..n_gpus-1). Per-GPU facts live in parallel numpy
arrays so that a placement decision is a handful of vector operations over the whole cluster instead
of a Python loop over nodes: that is what keeps decisions well under a millisecond on 8,192 GPUs.
Per-node facts are kept in a padded ``node × max_gpus`` table of GPU ids (``-1`` pads short nodes).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .elastic import ElasticSpec

GPU_MILLI = 1000  # capacity units of a GPU unless told (milli-GPU, FGD's unit)


class ClassIndex:
    """Job class names <-> small integer ids (ids grow as new classes are seen)."""

    def __init__(self, names: Sequence[str] = ()):
        self.names: List[str] = []
        self.ids: Dict[str, int] = {}
        for name in names:
            self.id(name)

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = len(self.names)
            self.ids[name] = found
            self.names.append(name)
        return found

    def __len__(self):
        return len(self.names)


@dataclass
class RunningJob:
    """A job holding GPUs: what the scheduler knows about it (never its true speed)."""

    job_id: str
    job_class: str
    gpus: Tuple[int, ...]  # flat GPU ids
    start: float
    expected_end: float
    exclusive: bool = False  # asked for whole GPUs: nobody may join it
    mem_mb: float = 0.0  # per GPU
    user: str = ""
    partition: str = ""
    class_id: int = -1
    application: str = ""
    elastic: Optional[ElasticSpec] = None  # resizable training job (the policy may shrink or grow it)
    # an idle inference pod kept warm on its GPU for ``pod_app`` (DeepBoot's lifecycle): protected from
    # other jobs until ``protect_until``, then asleep (anyone may take the GPU)
    pod_app: str = ""
    protect_until: float = 0.0
    # fractional GPUs (issue 21): units of each GPU's capacity this job holds (a GPU has ``gpu_cap``
    # units: 1000 milli-GPU in the simulator, its shard count on a live shard cluster); 0 = none
    # counted (an exclusive job fills its GPUs, an interference-shared job is a "time-shared" resident)
    gpu_units: int = 0
    cpu_milli: float = 0.0  # per node
    memory_mib: float = 0.0  # host memory, per node
    node: int = -1  # a CPU-only job's node (GPU jobs: the nodes of their GPUs)


@dataclass
class NodeInfo:
    name: str
    gpu_type: str
    first_gpu: int
    n_gpus: int
    partitions: Tuple[str, ...]
    cpu_milli: float = 0.0  # 0: unknown (not checked)
    memory_mib: float = 0.0


class ClusterState:
    """The cluster as the placement core sees it: hardware plus who runs where.

    ``max_jobs_per_gpu`` bounds sharing (1 = exclusive cluster). GPU groups say which GPUs of a node
    share an NVLink island or PCIe switch: a multi-GPU job inside one group communicates cheaply.
    """

    def __init__(self, max_jobs_per_gpu: int = 2, classes: Optional[ClassIndex] = None):
        self.max_jobs_per_gpu = max_jobs_per_gpu
        self.classes = classes if classes is not None else ClassIndex()
        self.nodes: List[NodeInfo] = []
        self.node_ids: Dict[str, int] = {}
        self.gpu_types: List[str] = []
        self.partition_names: List[str] = []
        self.jobs: Dict[str, RunningJob] = {}
        self.pod_ids: set = set()  # jobs that are idle inference pods (``RunningJob.pod_app``)
        self._gpu_lists = {k: [] for k in ("node", "index", "type", "mem", "group")}
        self._gpu_lists = {k: [] for k in ("node", "index", "type", "mem", "group", "cap")}
        self._node_partitions: List[Tuple[str, ...]] = []
        self._built = False
        self._n_groups = 0

    # ---- building -------------------------------------------------------------------------------
    def add_node(self, name: str, gpu_type: str, n_gpus: int, gpu_memory_mb: float,
                 partitions: Sequence[str] = ("default",), groups: Optional[Sequence[int]] = None,
                 gpu_cap: int = GPU_MILLI, cpu_milli: float = 0.0, memory_mib: float = 0.0):
        """Add one node; ``groups[i]`` is the NVLink/PCIe group of GPU ``i`` (default: 2 GPUs per switch).
        ``gpu_cap``: units of capacity per GPU (1000 milli-GPU, or the shards of each GPU in
        gres.conf); ``cpu_milli``/``memory_mib``: the node's CPUs and host memory (0: not checked)."""
        if self._built:
            raise RuntimeError("add nodes before the first placement")
        if name in self.node_ids:
            raise ValueError(f"duplicate node {name!r}")
        gpu_type = gpu_type.lower()
        if gpu_type not in self.gpu_types:
            self.gpu_types.append(gpu_type)
        if groups is None:
            groups = [i // 2 for i in range(n_gpus)]
        if len(groups) != n_gpus:
            raise ValueError(f"node {name}: {len(groups)} groups for {n_gpus} GPUs")
        node_id = len(self.nodes)
        first = len(self._gpu_lists["node"])
        if gpu_cap < 1:
            raise ValueError(f"node {name}: GPU capacity must be at least 1 unit")
        self.nodes.append(NodeInfo(name, gpu_type, first, n_gpus, tuple(partitions), float(cpu_milli),
                                   float(memory_mib)))
        self.node_ids[name] = node_id
        for p in partitions:
            if p not in self.partition_names:
                self.partition_names.append(p)
        type_id = self.gpu_types.index(gpu_type)
        base_group = self._n_groups
        self._n_groups += len(set(groups))
        local = {g: k for k, g in enumerate(dict.fromkeys(groups))}
        for i in range(n_gpus):
            self._gpu_lists["node"].append(node_id)
            self._gpu_lists["index"].append(i)
            self._gpu_lists["type"].append(type_id)
            self._gpu_lists["mem"].append(float(gpu_memory_mb))
            # groups are global, consecutive ids: equal only within one node's switch
            self._gpu_lists["group"].append(base_group + local[groups[i]])
            self._gpu_lists["cap"].append(int(gpu_cap))

    def build(self):
        """Freeze the hardware into arrays (called automatically before the first decision)."""
        if self._built:
            return
        lists = self._gpu_lists
        n = len(lists["node"])
        self.gpu_node = np.array(lists["node"], dtype=np.int32)
        self.gpu_index = np.array(lists["index"], dtype=np.int32)
        self.gpu_type_id = np.array(lists["type"], dtype=np.int32)
        self.gpu_mem_total = np.array(lists["mem"], dtype=np.float64)
        self.gpu_group = np.array(lists["group"], dtype=np.int64)
        self.n_groups = self._n_groups
        self.gpu_mem_used = np.zeros(n)
        self.gpu_njobs = np.zeros(n, dtype=np.int32)
        self.gpu_exclusive = np.zeros(n, dtype=bool)
        # class id of the first resident (-1 when empty); with at most 2 jobs per GPU a new job's
        # only co-runner is this one, so pair predictions are one fancy-indexing lookup.
        self.gpu_class0 = np.full(n, -1, dtype=np.intp)  # intp: gathers indexed by it are ~2x faster
        self.gpu_end0 = np.zeros(n)  # expected end of the first resident
        # capacity (issue 21): units per GPU, units held, and residents that hold no units
        # (interference-shared whole-GPU jobs: no fractional job may join them, nor they it)
        self.gpu_cap = np.array(lists["cap"], dtype=np.int64)
        self.gpu_used = np.zeros(n, dtype=np.int64)
        self.gpu_nplain = np.zeros(n, dtype=np.int32)
        self.node_cpu_total = np.array([node.cpu_milli for node in self.nodes])
        self.node_mem_total = np.array([node.memory_mib for node in self.nodes])
        self.node_cpu_used = np.zeros(len(self.nodes))
        self.node_mem_used = np.zeros(len(self.nodes))
        self.node_version = np.zeros(len(self.nodes), dtype=np.int64)  # bumped by place/release
        self.version = 0  # bumped by every place/release (caches of derived arrays key on it)
        # every place (+1) and release (-1), in order, for policies that keep their own per-GPU sums
        # (read from ``changes_base + position``; trimmed now and then: a reader behind the base resyncs)
        self.changes: List[Tuple[int, "RunningJob"]] = []
        self.changes_base = 0
        self._left, self._left_version = None, -1
        self.gpu_jobs: List[List[str]] = [[] for _ in range(n)]
        self.partition_mask = {}
        for p in self.partition_names:
            mask = np.zeros(n, dtype=bool)
            for node in self.nodes:
                if p in node.partitions:
                    mask[node.first_gpu:node.first_gpu + node.n_gpus] = True
            self.partition_mask[p] = mask
        width = max((node.n_gpus for node in self.nodes), default=0)
        table = np.full((len(self.nodes), max(width, 1)), -1, dtype=np.int64)
        for k, node in enumerate(self.nodes):
            table[k, :node.n_gpus] = np.arange(node.first_gpu, node.first_gpu + node.n_gpus)
        self.node_gpu_table = table
        self.node_free = np.array([node.n_gpus for node in self.nodes], dtype=np.int32)
        self.n_free = n
        # what a cycle asks before anything else (has_room), kept by place/release: GPUs per number
        # of jobs on them, and GPUs a fraction of whose capacity is held with some left
        self.njobs_count: List[int] = [n]
        self.n_fraction_room = 0
        self._fractions = False  # a fraction of a GPU was ever held (else no GPU can be partly held)
        # per node, GPUs another job may join at all (running fewer than max_jobs_per_gpu, none exclusive)
        self.node_joinable = np.zeros(len(self.nodes), dtype=np.int32)
        # per node, GPUs running exactly one job, not exclusive: those a second job may join (a policy
        # sharing a GPU between two jobs at most: cycle.nodes_with_room)
        self.node_single = np.zeros(len(self.nodes), dtype=np.int32)
        self._built = True

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_node) if self._built else len(self._gpu_lists["node"])

    # ---- queries --------------------------------------------------------------------------------
    def gpu_type_of(self, gpu: int) -> str:
        return self.gpu_types[self.gpu_type_id[gpu]]

    def gpu_label(self, gpu: int) -> str:
        return f"{self.nodes[self.gpu_node[gpu]].name}:gpu{self.gpu_index[gpu]}"

    def corunners(self, gpu: int, exclude: str = "") -> List[RunningJob]:
        return [self.jobs[j] for j in self.gpu_jobs[gpu] if j != exclude]

    def busy_gpus(self) -> int:
        return self.n_gpus - self.n_free

    # ---- mutation -------------------------------------------------------------------------------
    def place(self, job: RunningJob) -> RunningJob:
        """Record that ``job`` runs on ``job.gpus``."""
        self.build()
        if job.job_id in self.jobs:
            raise ValueError(f"job {job.job_id} already placed")
        job.class_id = self.classes.id(job.job_class)
        self.jobs[job.job_id] = job
        if job.pod_app:
            self.pod_ids.add(job.job_id)
        if job.gpu_units > 0:
            self._fractions = True
        track = self._fractions
        room = self._fraction_room(job.gpus) if track else 0
        self._charge(job, +1)
        counts, most = self.njobs_count, self.max_jobs_per_gpu
        for g in job.gpus:
            n = int(self.gpu_njobs[g])
            counts[n] -= 1
            if n + 1 == len(counts):
                counts.append(0)
            counts[n + 1] += 1
            node = self.gpu_node[g]
            exclusive = bool(self.gpu_exclusive[g])
            # another job may join (busy, with room, none exclusive): before and after this one
            joinable = (0 < n + 1 < most and not (exclusive or job.exclusive)) - (0 < n < most and not exclusive)
            if joinable:
                self.node_joinable[node] += joinable
            single = (n == 0 and not job.exclusive) - (n == 1 and not exclusive)
            if single:
                self.node_single[node] += single
            if n == 0:
                self.gpu_class0[g] = job.class_id
                self.gpu_end0[g] = job.expected_end
                self.node_free[node] -= 1
                self.n_free -= 1
            self.gpu_njobs[g] += 1
            self.gpu_mem_used[g] += job.mem_mb
            if job.exclusive:
                self.gpu_exclusive[g] = True
            self.gpu_jobs[g].append(job.job_id)
        if track:
            self.n_fraction_room += self._fraction_room(job.gpus) - room
        self._log(+1, job)
        return job

    def _fraction_room(self, gpus) -> int:
        """How many of ``gpus`` have part of their capacity held and some left, no time-shared job."""
        if not gpus:
            return 0
        if len(gpus) == 1:
            g = gpus[0]
            return int(self.gpu_nplain[g] == 0 and 0 < self.gpu_used[g] < self.gpu_cap[g])
        gpus = list(gpus)
        used = self.gpu_used[gpus]
        return int(((self.gpu_nplain[gpus] == 0) & (used > 0) & (used < self.gpu_cap[gpus])).sum())

    CHANGES_KEPT = 65536

    def _log(self, sign: int, job: "RunningJob"):
        if len(self.changes) >= self.CHANGES_KEPT:
            self.changes_base += len(self.changes)
            self.changes = []
        self.changes.append((sign, job))

    def release(self, job_id: str) -> RunningJob:
        """Forget ``job_id`` (finished, failed or preempted) and free its share of its GPUs."""
        job = self.jobs.pop(job_id)
        self.pod_ids.discard(job_id)
        track = self._fractions
        room = self._fraction_room(job.gpus) if track else 0
        self._charge(job, -1)
        counts, most = self.njobs_count, self.max_jobs_per_gpu
        for g in job.gpus:
            residents = self.gpu_jobs[g]
            residents.remove(job_id)
            n = int(self.gpu_njobs[g])
            counts[n] -= 1
            counts[n - 1] += 1
            node = self.gpu_node[g]
            was_joinable = 0 < n < most and not self.gpu_exclusive[g]
            was_single = n == 1 and not self.gpu_exclusive[g]
            self.gpu_njobs[g] -= 1
            self.gpu_mem_used[g] = max(0.0, self.gpu_mem_used[g] - job.mem_mb)
            if residents:
                first = self.jobs[residents[0]]
                self.gpu_class0[g] = first.class_id
                self.gpu_end0[g] = first.expected_end
                exclusive = any(self.jobs[j].exclusive for j in residents)
                self.gpu_exclusive[g] = exclusive
            else:
                self.gpu_class0[g] = -1
                self.gpu_end0[g] = 0.0
                self.gpu_exclusive[g] = exclusive = False
                self.gpu_mem_used[g] = 0.0
                self.node_free[node] += 1
                self.n_free += 1
            joinable = (0 < n - 1 < most and not exclusive) - was_joinable
            if joinable:
                self.node_joinable[node] += joinable
            single = (n == 2 and not exclusive) - was_single
            if single:
                self.node_single[node] += single
        if track:
            self.n_fraction_room += self._fraction_room(job.gpus) - room
        self._log(-1, job)
        return job

    def units_of(self, job: RunningJob, g: int) -> int:
        """Units of GPU ``g`` that ``job`` holds: its fraction, or all of it when exclusive."""
        if job.gpu_units > 0:
            return min(int(job.gpu_units), int(self.gpu_cap[g]))
        return int(self.gpu_cap[g]) if job.exclusive else 0

    def job_nodes(self, job: RunningJob) -> List[int]:
        if job.gpus:
            return sorted({int(self.gpu_node[g]) for g in job.gpus})
        return [job.node] if job.node >= 0 else []

    def _charge(self, job: RunningJob, sign: int):
        self.version += 1
        for g in job.gpus:
            units = self.units_of(job, g)
            self.gpu_used[g] += sign * units
            if units == 0:
                self.gpu_nplain[g] += sign
        for k in self.job_nodes(job):
            self.node_cpu_used[k] = max(0.0, self.node_cpu_used[k] + sign * job.cpu_milli)
            self.node_mem_used[k] = max(0.0, self.node_mem_used[k] + sign * job.memory_mib)
            self.node_version[k] += 1

    def gpu_left(self) -> np.ndarray:
        """Units a fractional job could still take on each GPU (0 where a time-shared job runs).
        Cached until the next place/release: read it, never write to it."""
        if self._left_version != self.version:
            self._left = np.where(self.gpu_nplain > 0, 0, self.gpu_cap - self.gpu_used)
            self._left_version = self.version
        return self._left

    def node_room(self, cpu_milli: float, memory_mib: float) -> np.ndarray:
        """Per node: whether ``cpu_milli`` and ``memory_mib`` more fit (an unknown total always fits)."""
        ok = np.ones(len(self.nodes), dtype=bool)
        if cpu_milli > 0:
            ok &= (self.node_cpu_total <= 0) | (self.node_cpu_total - self.node_cpu_used >= cpu_milli)
        if memory_mib > 0:
            ok &= (self.node_mem_total <= 0) | (self.node_mem_total - self.node_mem_used >= memory_mib)
        return ok

    def allocated_units(self) -> float:
        """GPUs allocated, in whole GPUs (fractions summed; a time-shared GPU counts as one)."""
        used = np.where(self.gpu_nplain > 0, self.gpu_cap, np.minimum(self.gpu_used, self.gpu_cap))
        return float((used / self.gpu_cap).sum())


def parse_cluster_spec(spec: str) -> List[Tuple[int, int, str]]:
    """``16x4:v100,8x8:a100`` -> [(16, 4, 'v100'), (8, 8, 'a100')] (nodes × GPUs per node : type)."""
    groups = []
    for part in spec.replace("+", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            shape, gpu_type = part.split(":", 1)
            nodes, per_node = shape.lower().split("x", 1)
            nodes_i, per_node_i = int(nodes), int(per_node)
        except ValueError:
            raise ValueError(f"cluster spec {part!r}: expected NODESxGPUS:TYPE, e.g. 16x4:v100") from None
        if nodes_i <= 0 or per_node_i <= 0 or not gpu_type.strip():
            raise ValueError(f"cluster spec {part!r}: counts must be positive and the type named")
        groups.append((nodes_i, per_node_i, gpu_type.strip().lower()))
    if not groups:
        raise ValueError("empty cluster spec")
    return groups


@dataclass
class NodeGroup:
    """One homogeneous group of a cluster description."""

    nodes: int
    gpus_per_node: int
    gpu_type: str
    gpu_memory_mb: float
    partitions: Tuple[str, ...] = ("default",)
    prefix: str = ""
    gpus_per_switch: int = 2
    extra: Dict[str, str] = field(default_factory=dict)
    gpu_cap: int = GPU_MILLI  # capacity units per GPU
    cpu_milli: float = 0.0  # per node, 0: not checked
    memory_mib: float = 0.0
    names: Tuple[str, ...] = ()  # node names (a node-list CSV), else <prefix><k>


def build_cluster(groups: Sequence[NodeGroup], max_jobs_per_gpu: int = 2,
                  classes: Optional[ClassIndex] = None) -> ClusterState:
    """A ClusterState from node groups (node names ``<prefix><type>-<k>``)."""
    state = ClusterState(max_jobs_per_gpu=max_jobs_per_gpu, classes=classes)
    for gi, group in enumerate(groups):
        prefix = group.prefix or f"g{gi}-{group.gpu_type}-"
        switch = max(1, group.gpus_per_switch)
        for k in range(group.nodes):
            state.add_node(group.names[k] if group.names else f"{prefix}{k}", group.gpu_type,
                           group.gpus_per_node, group.gpu_memory_mb, partitions=group.partitions,
                           groups=[i // switch for i in range(group.gpus_per_node)], gpu_cap=group.gpu_cap,
                           cpu_milli=group.cpu_milli, memory_mib=group.memory_mib)
    state.build()
    return state
