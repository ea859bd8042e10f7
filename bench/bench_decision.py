"""Decision latency of the placement core: 1,024 nodes × 8 GPUs with 8,000 running jobs.

No shared data needed (classes are Gavel's built-in priors). 6,000 GPUs run one job, 1,000 GPUs run
two (8,000 jobs), 1,192 are free; then ``--decisions`` requests (1-GPU, and 4-GPU on one node)
are decided one at a time against that state (each decision is undone so the state stays the
same). Goal: p99 ≤ 1 ms. Prints one JSON document with p50/p99/max wall-clock milliseconds per
policy, and the same percentiles of the deciding thread's CPU time (immune to other processes on a
busy machine).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm_horus.interference import build_model, builtin_priors  # noqa: E402
from slurm_horus.placement import (JobRequest, NodeGroup, PolicyModels, RunningJob,  # noqa: E402
                                   SchedulingContext, build_cluster, make_policy)


def busy_cluster(seed: int = 0):
    profiles, _ = builtin_priors()
    classes = sorted({p.job_class for p in profiles})
    state = build_cluster([NodeGroup(1024, 8, "v100", 16384.0)])
    rng = np.random.default_rng(seed)
    gpus = rng.permutation(state.n_gpus)
    k = 0
    for g in gpus[:6000]:
        state.place(RunningJob(f"r{k}", classes[rng.integers(len(classes))], (int(g),), 0.0, 3600.0))
        k += 1
    for g in gpus[6000:7000]:
        for _ in range(2):
            state.place(RunningJob(f"r{k}", classes[rng.integers(len(classes))], (int(g),), 0.0, 3600.0))
            k += 1
    return state, classes


def measure(policy_name: str, n: int, gpus_per_node: int, seed: int = 1) -> dict:
    state, classes = busy_cluster()
    model = build_model("chain")
    policy = make_policy(policy_name, PolicyModels(state.classes, lambda kind: model, truth=model))
    rng = np.random.default_rng(seed)
    ctx = SchedulingContext(0.0, 500, 2000, 2000 * 3600.0)
    ctx.extra["window"] = [state.classes.id(c) for c in classes]
    # warm up: fills the pair tables once, as a long-running service would have
    for c in classes:
        policy.decide(state, JobRequest("warm", c), ctx)
    times, cpu = [], []
    placed = 0
    for i in range(n):
        req = JobRequest(f"q{i}", classes[rng.integers(len(classes))], gpus_per_node=gpus_per_node,
                         predicted_duration=float(rng.uniform(60, 36000)))
        t0, c0 = time.perf_counter(), time.thread_time()
        decision = policy.decide(state, req, ctx)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if decision.placed:
            placed += 1
            state.place(policy.running_job(req, decision, 0.0))
            state.release(req.job_id)
    ms = np.array(times) * 1000.0
    cpu_ms = np.array(cpu) * 1000.0
    return {"policy": policy_name, "gpus_per_job": gpus_per_node, "decisions": n, "placed": placed,
            "p50_ms": round(float(np.percentile(ms, 50)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "max_ms": round(float(ms.max()), 4),
            # CPU time of the deciding thread: what the decision costs without other processes' noise
            "cpu_p50_ms": round(float(np.percentile(cpu_ms, 50)), 4),
            "cpu_p99_ms": round(float(np.percentile(cpu_ms, 99)), 4),
            "running_jobs": len(state.jobs), "gpus": state.n_gpus}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="slurm-default,sjf-bsbf,horus-util,iasp-iapp,horus")
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    for name in args.policies.split(","):
        for gpn in (1, 4):
            row = measure(name, args.decisions, gpn)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"runs": rows}, indent=2))


if __name__ == "__main__":
    main()
