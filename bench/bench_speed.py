"""Simulator speed: Pollux's 82k-job philly.csv on 2,048 GPUs, one policy at a time, one core.

Reads /work/shared/data (not shipped): ``$HORUS_SHARED_DATA`` or ``../shared/data`` relative to the
repository root. Each (policy, size) runs in a fresh child process so that its peak memory (max RSS)
is its own. Goal: ≤ 30 s per policy for the full trace, peak memory ≤ 2 GB; the growth from 10k to
82k jobs is reported. Prints one JSON document.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def shared_data() -> Path:
    return Path(os.environ.get("HORUS_SHARED_DATA", ROOT.parent / "shared" / "data"))


def one(policy: str, n_jobs: int, cluster: str) -> dict:
    from slurm_horus.sim.metrics import summarize
    from slurm_horus.sim.run import parse_cluster, run_policies
    from slurm_horus.sim.traces import read_trace
    from slurm_horus.sim.truth import load_truth

    t0 = time.perf_counter()
    jobs = read_trace(str(shared_data() / "pollux_adaptdl" / "traces" / "philly.csv"), "philly")
    jobs = sorted(jobs, key=lambda j: j.submit_time)[:n_jobs]
    truth = load_truth("gavel:v100")
    t1 = time.perf_counter()
    result = run_policies(jobs, parse_cluster(cluster), truth, [policy])[0]
    t2 = time.perf_counter()
    s = summarize(result)
    return {"policy": policy, "jobs": len(jobs), "read_s": round(t1 - t0, 2), "simulate_s": round(t2 - t1, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "unfinished": s["unfinished"], "mean_jct_s": round(s["mean_jct"], 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="slurm-default,sjf-bsbf,horus")
    parser.add_argument("--sizes", default="10000,20000,40000,82247")
    parser.add_argument("--cluster", default="512x4:v100")
    parser.add_argument("--child", nargs=3, metavar=("POLICY", "JOBS", "CLUSTER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child[0], int(args.child[1]), args.child[2])))
        return
    rows = []
    for policy in args.policies.split(","):
        for size in args.sizes.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", policy, size, args.cluster],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"cluster": args.cluster, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
