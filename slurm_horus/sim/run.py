"""Putting a simulation together: cluster spec, truth, predictors, policies, one run per policy."""

import copy
import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InputError
from ..textfiles import read_text
from ..placement import ClassIndex, NodeGroup, PolicyModels, build_cluster, make_policy
from .engine import HistoryRun, SimOptions, SimResult, Simulator, assign_classes
from .traces import TraceJob
from .truth import Truth


def parse_cluster(spec: str, gpu_memory: Optional[Dict[str, float]] = None) -> List[NodeGroup]:
    """``16x4:v100`` or ``8x4:v100@train,8x4:v100@infer`` (several groups; ``@`` names partitions,
    ``+`` separates several) or a JSON file ``{"groups": [{"nodes": 16, "gpus_per_node": 4,
    "gpu_type": "v100", "partitions": ["default"], "gpu_memory_mb": 16384}]}``."""
    from ..interference import gpu_memory_mb

    path = Path(spec)
    if path.suffix == ".csv":
        return node_list_csv(path, gpu_memory)
    if path.suffix in (".json", ".yaml", ".yml") or path.exists():
        return _cluster_file(path, gpu_memory)
    groups = []
    for k, part in enumerate(p.strip() for p in spec.split(",")):
        if not part:
            continue
        shape, _, parts = part.partition("@")
        try:
            counts, gpu_type = shape.split(":", 1)
            nodes, per_node = (int(x) for x in counts.lower().split("x", 1))
        except ValueError:
            raise InputError(f"--cluster {part!r}: expected NODESxGPUS:TYPE[@PARTITION], e.g. 16x4:v100") from None
        if nodes <= 0 or per_node <= 0:
            raise InputError(f"--cluster {part!r}: counts must be positive")
        gpu_type = gpu_type.strip().lower()
        mem = (gpu_memory or {}).get(gpu_type) or gpu_memory_mb(gpu_type)
        partitions = tuple(p for p in parts.split("+") if p) or ("default",)
        groups.append(NodeGroup(nodes, per_node, gpu_type, mem, partitions, prefix=f"n{k}-{gpu_type}-"))
    if not groups:
        raise InputError("--cluster: empty cluster spec")
    return groups


def node_list_csv(path: Path, gpu_memory=None) -> List[NodeGroup]:
    """A node list (FGD's ``openb_node_list_*.csv``): columns ``sn,cpu_milli,memory_mib,gpu,model``,
    one node a row (a node without GPUs keeps its CPUs for CPU-only requests)."""
    from ..interference import gpu_memory_mb
    from .traces import _csv_rows, _number, _text

    if not path.exists():
        raise InputError(f"--cluster {path}: no such file")
    groups, seen = [], set()
    for line, row in _csv_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        name = _text(row, "sn")
        if not name or name in seen:
            raise InputError(f"{path}:{line}: {'duplicate' if name else 'empty'} node name {name!r}")
        seen.add(name)
        gpus = _number(path, line, row, "gpu", int, minimum=0)
        model = _text(row, "model").lower()
        if gpus and (not model or model == "nan"):
            raise InputError(f"{path}:{line}: node {name} has {gpus} GPUs but no model")
        model = model if gpus else "none"
        mem = 0.0
        if gpus:
            try:
                mem = gpu_memory_mb(model, gpu_memory)
            except InputError as exc:
                raise InputError(f"{path}:{line}: {exc}") from None
        groups.append(NodeGroup(1, gpus, model, mem, names=(name,),
                                cpu_milli=_number(path, line, row, "cpu_milli", minimum=0.0),
                                memory_mib=_number(path, line, row, "memory_mib", minimum=0.0)))
    if not groups:
        raise InputError(f"{path}: no nodes")
    return groups


def _cluster_file(path: Path, gpu_memory) -> List[NodeGroup]:
    from ..interference import gpu_memory_mb

    if not path.exists():
        raise InputError(f"--cluster {path}: no such file")
    text = read_text(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else _simple_yaml(text, path)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups") or [], list):
        raise InputError(f"{path}: expected {{\"groups\": [...]}}")
    groups = []
    for k, g in enumerate(data.get("groups") or []):
        if not isinstance(g, dict):
            raise InputError(f"{path}: group {k + 1} is not a mapping")
        try:
            gpu_type = str(g["gpu_type"]).lower()
            groups.append(NodeGroup(int(g["nodes"]), int(g["gpus_per_node"]), gpu_type,
                                    float(g.get("gpu_memory_mb") or (gpu_memory or {}).get(gpu_type)
                                          or gpu_memory_mb(gpu_type)),
                                    tuple(g.get("partitions") or ("default",)), prefix=f"n{k}-{gpu_type}-",
                                    gpus_per_switch=int(g.get("gpus_per_switch", 2))))
        except KeyError as exc:
            raise InputError(f"{path}: group {k + 1} lacks key {exc.args[0]!r}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{path}: group {k + 1}: {exc}") from None
        group = groups[-1]
        if group.nodes <= 0 or group.gpus_per_node <= 0 or not math.isfinite(group.gpu_memory_mb) \
                or group.gpu_memory_mb <= 0:
            raise InputError(f"{path}: group {k + 1}: counts and memory must be positive")
    if not groups:
        raise InputError(f"{path}: no groups")
    return groups


def _simple_yaml(text: str, path) -> dict:
    """The YAML subset a cluster file needs: ``groups:`` then ``- key: value`` items (lists as [a, b])."""
    groups, current = [], None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip() or line.strip() == "groups:":
            continue
        stripped = line.strip()
        if stripped.startswith("- "):
            current = {}
            groups.append(current)
            stripped = stripped[2:]
        if current is None or ":" not in stripped:
            raise ValueError(f"line {number}: expected 'groups:' then '- key: value' items")
        key, value = (s.strip() for s in stripped.split(":", 1))
        if value.startswith("[") and value.endswith("]"):
            current[key] = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        else:
            current[key] = value
    return {"groups": groups}


def policy_models(truth: Truth, classes: ClassIndex, holdout: bool = True,
                  profiles_path: Optional[str] = None, predictor: str = "chain",
                  predictor_factory: Optional[Callable] = None,
                  gpu_memory: Optional[Dict[str, float]] = None) -> PolicyModels:
    """Predictors for the policies: built-in priors (+ ``profiles_path``), without the measured pairs
    of the truth's GPU types when ``holdout`` (so the policies must predict and learn what the
    simulator knows exactly)."""
    from ..interference import build_model, builtin_priors, load_profiles_csv

    profiles, observations = builtin_priors()
    profiles = list(profiles)
    if profiles_path:
        profiles += list(load_profiles_csv(profiles_path))
    if holdout:
        observations = [o for o in observations if o.gpu_type not in truth.gpu_types]
    built: Dict[str, object] = {}

    def factory(kind: str):
        if predictor_factory is not None:
            return predictor_factory(kind)
        if kind not in built:
            try:
                built[kind] = build_model(kind, profiles, observations, gpu_memory_mb=gpu_memory)
            except ValueError:
                built[kind] = build_model(predictor, profiles, observations, gpu_memory_mb=gpu_memory)
        return built[kind]

    return PolicyModels(classes, factory, truth=truth.as_predictor(), default_kind=predictor, profiles=profiles)


def prepare_trace(trace: Sequence[TraceJob], truth: Truth, seed: int, load: float,
                  cluster_gpus: int) -> List[TraceJob]:
    """Copy, scale arrivals by ``load``, assign missing classes, drop jobs larger than the cluster."""
    if load <= 0:
        raise InputError("--load must be positive")
    jobs = [copy.copy(j) for j in trace if j.num_gpus <= cluster_gpus]
    for j in jobs:
        j.submit_time = j.submit_time / load
        if j.job_class is not None and j.kind == "train" and truth.constant is None \
                and not truth.has_class(j.job_class):
            raise InputError(f"{j.source}: unknown class {j.job_class!r} (not in the truth table {truth.name})")
    jobs.sort(key=lambda j: j.submit_time)
    assign_classes(jobs, truth.classes, seed)
    return jobs


def history_from_trace(others: Sequence[TraceJob], truth: Truth, seed: int, load: float) -> List[HistoryRun]:
    """The site's history (``SimOptions.history``) made from a trace's *other* jobs, those not
    simulated, in the same time frame as the simulated trace handed to :func:`run_policies` with the
    same ``load``: each arrived as :func:`prepare_trace` makes the simulated jobs arrive (its submit time
    scaled by ``load``) and ran its run time at once, elsewhere on the site (the same compressed site,
    other GPUs: it waits for none of the simulated ones). A job without a class gets one drawn as the
    simulated jobs' are, from a draw of its own (the simulated jobs' draws are unchanged)."""
    if load <= 0:
        raise InputError("--load must be positive")
    jobs = [copy.copy(j) for j in others]
    assign_classes(jobs, truth.classes, seed + 104_729)
    return [HistoryRun(j.submit_time / load + j.duration, j.user, j.job_class or "", j.duration)
            for j in jobs if j.duration > 0]


def _policy(spec: str, models: PolicyModels):
    try:
        return make_policy(spec, models)
    except ValueError as exc:
        raise InputError(f"--policy: {exc}") from None


def run_policies(trace: Sequence[TraceJob], groups: Sequence[NodeGroup], truth: Truth, policies: Sequence[str],
                 seed: int = 0, load: float = 1.0, holdout: bool = True, options: Optional[SimOptions] = None,
                 profiles_path: Optional[str] = None, predictor: str = "chain",
                 predictor_factory: Optional[Callable] = None, max_jobs_per_gpu: int = 3,
                 progress: Optional[Callable[[str, int, int], None]] = None) -> List[SimResult]:
    """Simulate every policy on the same trace and cluster; results in the order given.

    ``max_jobs_per_gpu`` is the cluster's sharing limit (3: Horus's); each policy applies its own
    limit under it (2 for all but ``horus-util``)."""
    n_gpus = sum(g.nodes * g.gpus_per_node for g in groups)
    jobs = prepare_trace(trace, truth, seed, load, n_gpus)
    classes = ClassIndex(truth.classes)
    models = policy_models(truth, classes, holdout, profiles_path, predictor, predictor_factory)
    results = []
    for spec in policies:
        policy = _policy(spec, models)
        state = build_cluster(groups, max_jobs_per_gpu=max_jobs_per_gpu, classes=classes)
        callback = (lambda done, total, _n=spec: progress(_n, done, total)) if progress else None
        sim = Simulator(state, truth, policy, [copy.copy(j) for j in jobs], options, callback)
        result = sim.run()
        result.policy = spec
        results.append(result)
    return results


def ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else float("nan")


def run_arrival_policies(trace: Sequence[TraceJob], groups: Sequence[NodeGroup], truth: Truth,
                         policies: Sequence[str], inflate: float = 0.0, shuffle_seed: Optional[int] = None,
                         holdout: bool = True, profiles_path: Optional[str] = None,
                         progress: Optional[Callable[[str, int, int], None]] = None, keep_trace: bool = False):
    """FGD's protocol (``sim/arrivals.py``) for every policy on the same requests: ``inflate`` > 0
    draws requests with replacement until they ask ``inflate`` × the cluster's GPUs, seeded by
    ``shuffle_seed`` (``keep_trace``: FGD's way, every trace request once then draws, see
    ``inflate_trace``); without it the trace's requests, shuffled when a seed is given. Returns
    (results, the requests offered, the fragmentation model of that workload)."""
    import random
    import time

    from ..placement.fragmentation import FragmentationModel, workload_counts
    from .arrivals import inflate_trace, run_arrivals
    from .engine import trace_request

    n_gpus = sum(g.nodes * g.gpus_per_node for g in groups)
    jobs = [copy.copy(j) for j in trace]
    assign_classes(jobs, truth.classes, shuffle_seed or 0)
    seed = shuffle_seed if shuffle_seed is not None else 0
    if inflate:
        try:
            jobs = inflate_trace(jobs, n_gpus, inflate, seed, keep_trace)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    elif shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(jobs)
    width = max(g.gpus_per_node for g in groups)
    workload = workload_counts(trace_request(j, width) for j in trace)
    classes = ClassIndex(truth.classes)
    memory = {g.gpu_type: g.gpu_memory_mb for g in groups if g.gpus_per_node}
    models = policy_models(truth, classes, holdout, profiles_path, gpu_memory=memory)
    models.workload = workload
    results = []
    for spec in policies:
        policy = _policy(spec, models)
        state = build_cluster(groups, max_jobs_per_gpu=2, classes=classes)
        began = time.perf_counter()
        result = run_arrivals(state, policy, jobs, FragmentationModel(dict(workload)))
        result.seconds = time.perf_counter() - began
        result.policy = spec
        if progress:
            progress(spec, 1, 1)
        results.append(result)
    return results, jobs, FragmentationModel(dict(workload))
