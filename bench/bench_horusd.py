"""Decision latency inside horusd: p50/p99 of reading a request and Placer.place() on a synthetic large cluster.

1,024 nodes x 8 GPUs, 8,000 running jobs of the built-in Gavel classes (so most GPUs are busy and
half of them already shared), then 2,000 single-GPU requests of random known classes with the
configured policy, as horusd's socket handler would make them (the ledger records each one, so the
state keeps changing). Prints JSON: wall-clock and CPU time (of the deciding thread) per request; on a
loaded machine other processes preempt the benchmark, so the wall p99 measures them while the CPU p99
measures the decision. Goal: p99 <= 1 ms. Needs no Slurm and no ../shared data.
"""

import json
import random
import sys
import time

import numpy as np

from slurm_horus.interference import build_model, builtin_priors, gpu_memory_mb
from slurm_horus.placement.policies import PolicyModels, make_policy
from slurm_horus.placement.state import ClusterState, RunningJob
from slurm_horus.service.daemon import Placer
from slurm_horus.service.protocol import parse_request


def synthetic_placer(policy_name, nodes=1024, gpus_per_node=8, running=8000, seed=0):
    rng = random.Random(seed)
    profiles, _ = builtin_priors()
    classes = sorted({p.job_class for p in profiles if p.gpu_type == "v100"})
    placer = Placer(None, binding="shard", gpu_type="v100", gpu_memory_mb=gpu_memory_mb, known_classes=classes)
    model = build_model("chain")
    placer.policy = make_policy(policy_name, PolicyModels(placer.classes, lambda kind: model))
    state = ClusterState(max_jobs_per_gpu=2, classes=placer.classes)
    for n in range(nodes):
        state.add_node(f"n{n:04d}", "v100", gpus_per_node, gpu_memory_mb("v100"), ("gpu",))
    state.build()
    n_gpus = nodes * gpus_per_node
    slots = [g for g in range(n_gpus)] + [g for g in range(0, n_gpus, 2)]
    rng.shuffle(slots)
    for j, gpu in enumerate(slots[:running]):
        state.place(RunningJob(str(j), rng.choice(classes), (gpu,), 0.0, rng.uniform(600, 36000)))
    placer.state = state
    placer.snapshot_time = time.time()
    return placer, classes


def main():
    policy = sys.argv[1] if len(sys.argv) > 1 else "horus"
    placer, classes = synthetic_placer(policy)
    rng = random.Random(1)
    latencies, cpu, placed, warm = [], [], 0, 50
    for i in range(2000 + warm):
        message = {"op": "place", "gpus_per_node": 1, "num_nodes": 1, "job_class": rng.choice(classes),
                   "user": "bench", "time_limit_min": rng.choice([30, 60, 240])}
        started, cpu_started = time.perf_counter(), time.thread_time()
        reply = placer.place(parse_request(message))  # what horusd does with a line: read it, decide
        elapsed, cpu_elapsed = time.perf_counter() - started, time.thread_time() - cpu_started
        if i >= warm:
            latencies.append(elapsed * 1e3)
            cpu.append(cpu_elapsed * 1e3)
            placed += reply.placed
        if len(placer.ledger) > 200:  # jobs finish: keep the cluster busy but not full
            for decision_id in list(placer.ledger.entries)[:100]:
                entry = placer.ledger.remove(decision_id)
                placer.state.release(entry.job.job_id)
    lat = np.array(latencies)
    print(json.dumps({
        "benchmark": "horusd_decision_latency", "policy": policy, "nodes": 1024, "gpus": 8192,
        "running_jobs": 8000, "requests": len(lat), "placed": placed,
        "p50_ms": round(float(np.percentile(lat, 50)), 4), "p99_ms": round(float(np.percentile(lat, 99)), 4),
        "max_ms": round(float(lat.max()), 4), "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 4),
        "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 4), "goal_p99_ms": 1.0,
    }, indent=2))


if __name__ == "__main__":
    main()
