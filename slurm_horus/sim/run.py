"""Putting a simulation together: cluster spec, truth, predictors, policies, one run per policy."""

import copy
import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InputError
from ..textfiles import read_text
from ..placement import ClassIndex, NodeGroup, PolicyModels, build_cluster, make_policy
from .engine import SimOptions, SimResult, Simulator, assign_classes
from .traces import TraceJob
from .truth import Truth


def parse_cluster(spec: str, gpu_memory: Optional[Dict[str, float]] = None) -> List[NodeGroup]:
    """``16x4:v100`` or ``8x4:v100@train,8x4:v100@infer`` (several groups; ``@`` names partitions,
    ``+`` separates several) or a JSON file ``{"groups": [{"nodes": 16, "gpus_per_node": 4,
    "gpu_type": "v100", "partitions": ["default"], "gpu_memory_mb": 16384}]}``."""
    from ..interference import gpu_memory_mb

    path = Path(spec)
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
                  predictor_factory: Optional[Callable] = None) -> PolicyModels:
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
                built[kind] = build_model(kind, profiles, observations)
            except ValueError:
                built[kind] = build_model(predictor, profiles, observations)
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
        try:
            policy = make_policy(spec, models)
        except ValueError as exc:
            raise InputError(f"--policy: {exc}") from None
        state = build_cluster(groups, max_jobs_per_gpu=max_jobs_per_gpu, classes=classes)
        callback = (lambda done, total, _n=spec: progress(_n, done, total)) if progress else None
        sim = Simulator(state, truth, policy, [copy.copy(j) for j in jobs], options, callback)
        result = sim.run()
        result.policy = spec
        results.append(result)
    return results


def ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else float("nan")
