"""FGD's protocol on a cluster and workload of its published shape: how full does each policy get?

Builds the cluster (1,213 nodes, 6,216 GPUs) and the 8,152-request workload of
``bench/fgd_workload.py`` in a temporary directory (nothing read from /work/shared, no Alibaba row
shipped), then per seed draws requests with replacement until 130 % of the GPU capacity has arrived
(``--inflate 1.3``), tries each once (``--no-departure``) and prints JSON: allocated % at 130 % arrived
per policy (mean over seeds), the fragmentation at the end, GPUs over capacity (must be 0), the CPU
seconds of one policy's run, and FGD's published figures (ATC'23, means of 10 seeds) beside them.

    .venv/bin/python bench/bench_fgd.py [--seeds 1,2,3] [--policies fgd,bestfit,horus,...]
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import fgd_workload  # noqa: E402

from slurm_horus.sim.arrivals import allocated_at  # noqa: E402
from slurm_horus.sim.arrivals import summarize_arrivals  # noqa: E402
from slurm_horus.sim.run import parse_cluster, run_arrival_policies  # noqa: E402
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402

PUBLISHED = {"fgd": 95.4, "bestfit": 93.1, "packing": 92.0, "clustering": 91.9, "dotprod": 90.9, "random": 87.5}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--policies", default="fgd,horus,bestfit,packing,clustering,dotprod,random")
    parser.add_argument("--inflate", type=float, default=1.3)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = [p for p in args.policies.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        nodes, pods = os.path.join(tmp, "nodes.csv"), os.path.join(tmp, "pods.csv")
        n_nodes, n_gpus = fgd_workload.write_nodes(nodes)
        fgd_workload.write_pods(pods)
        groups = parse_cluster(nodes, {k.lower(): v for k, v in fgd_workload.GPU_MEMORY_MB.items()})
        jobs = read_trace(pods)
    truth = load_truth("none", None)
    per = {p: {"allocated_at_130": [], "fragmentation_pct": [], "over_capacity_gpus": 0, "cpu_s": [],
               "wall_s": []} for p in policies}
    requests = 0
    for seed in seeds:
        for policy in policies:  # one at a time: CPU seconds of one policy's run
            began, cpu = time.perf_counter(), time.process_time()
            (result,), offered, _ = run_arrival_policies(jobs, groups, truth, [policy], args.inflate, seed)
            row = per[policy]
            row["cpu_s"].append(round(time.process_time() - cpu, 2))
            row["wall_s"].append(round(time.perf_counter() - began, 2))
            summary = summarize_arrivals(result)
            row["allocated_at_130"].append(allocated_at(summary["allocation_curve"], 100.0 * args.inflate))
            row["fragmentation_pct"].append(summary["fragmentation_pct"])
            row["over_capacity_gpus"] += summary["over_capacity_gpus"]
            requests = len(offered)
    out = {"benchmark": "fgd-protocol", "cluster": {"nodes": n_nodes, "gpus": n_gpus}, "trace_requests": len(jobs),
           "inflate": args.inflate, "requests_offered_last_seed": requests, "seeds": seeds, "policies": {}}
    for policy, row in per.items():
        mean = sum(row["allocated_at_130"]) / len(row["allocated_at_130"])
        name = policy.split("/")[0]
        out["policies"][policy] = {
            "allocated_pct_at_130": round(mean, 2), "per_seed": row["allocated_at_130"],
            "fragmentation_pct": round(sum(row["fragmentation_pct"]) / len(seeds), 2),
            "over_capacity_gpus": row["over_capacity_gpus"], "cpu_s_per_run": row["cpu_s"], "wall_s_per_run": row["wall_s"],
            "published": PUBLISHED.get(name),
            "minus_published": round(mean - PUBLISHED[name], 2) if name in PUBLISHED else None}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
