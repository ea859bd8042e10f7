"""Simulator speed under load: Pollux's 82k-job philly.csv on 512 × 4 GPUs at ``--load 6``, one policy
at a time, one core.

At load 1 the 2,048 GPUs never queue the trace (every policy gives the same JCT, and the cycle has
nothing to decide); arrivals six times faster (offered load ≈ 1.1) make a queue form, which is the
case where the scheduling cycle, the queue and the duration estimates cost. Reads /work/shared/data
(not shipped): ``$HORUS_SHARED_DATA`` or ``../shared/data`` relative to the repository root. Each
(policy, size) runs in a fresh child process so that its peak memory (max RSS) is its own. Goal:
≤ 30 s per policy for the full trace, peak memory ≤ 2 GB; the growth from 10k to 82k jobs is
reported (CPU seconds per 1,000 jobs at each size, and the ratio of the largest to the smallest).
``simulate_cpu_s`` (``time.process_time``) is the figure: the machine is shared, wall time
(``simulate_s``) moves with its load (``load_avg``, the 1-minute load average at the end). Prints
one JSON document. ``--duration-levels fixed`` runs the duration estimator with its fixed level order
(with the default measured order, each end of a user's job re-estimates all of that user's waiting
jobs, which a long queue pays for).
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


def one(policy: str, n_jobs: int, cluster: str, load: float, levels: str = "measured") -> dict:
    from slurm_horus.placement.duration import DurationSettings
    from slurm_horus.sim.engine import SimOptions
    from slurm_horus.sim.metrics import summarize
    from slurm_horus.sim.run import parse_cluster, run_policies
    from slurm_horus.sim.traces import read_trace
    from slurm_horus.sim.truth import load_truth

    t0 = time.perf_counter()
    jobs = read_trace(str(shared_data() / "pollux_adaptdl" / "traces" / "philly.csv"), "philly")
    jobs = sorted(jobs, key=lambda j: j.submit_time)[:n_jobs]
    truth = load_truth("gavel:v100")
    t1, c1 = time.perf_counter(), time.process_time()
    options = SimOptions(duration_settings=DurationSettings(adaptive=levels == "measured"))
    result = run_policies(jobs, parse_cluster(cluster), truth, [policy], load=load, options=options)[0]
    t2, c2 = time.perf_counter(), time.process_time()
    s = summarize(result)
    return {"policy": policy, "jobs": len(jobs), "duration_levels": levels, "read_s": round(t1 - t0, 2), "simulate_s": round(t2 - t1, 2),
            "simulate_cpu_s": round(c2 - c1, 2), "load_avg": round(os.getloadavg()[0], 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "unfinished": s["unfinished"], "mean_jct_s": round(s["mean_jct"], 1),
            "mean_wait_s": round(s["mean_queueing_delay"], 1), "makespan_s": round(s["makespan"], 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="slurm-default,sjf,sjf-ffs,sjf-bsbf,horus-util,iasp-iapp,oracle,horus")
    parser.add_argument("--sizes", default="10000,20000,40000,82247")
    parser.add_argument("--cluster", default="512x4:v100")
    parser.add_argument("--load", type=float, default=6.0, help="arrival-rate multiplier (6: a queue forms)")
    parser.add_argument("--duration-levels", choices=["fixed", "measured"], default="measured",
                        help="the duration estimator's level order (fixed: what the measured order costs a long queue)")
    parser.add_argument("--child", nargs=5, metavar=("POLICY", "JOBS", "CLUSTER", "LOAD", "LEVELS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child[0], int(args.child[1]), args.child[2], float(args.child[3]), args.child[4])))
        return
    rows = []
    for policy in args.policies.split(","):
        for size in args.sizes.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", policy, size, args.cluster, str(args.load),
                                  args.duration_levels],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"cluster": args.cluster, "load": args.load, "duration_levels": args.duration_levels, "runs": rows, "growth": growth(rows)}, indent=2))


def growth(rows) -> dict:
    """Per policy: simulate CPU seconds per 1,000 jobs at each size, and largest / smallest of those."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["jobs"])
        per_k = {r["jobs"]: round(1000 * r["simulate_cpu_s"] / max(r["jobs"], 1), 3) for r in mine}
        first, last = per_k[mine[0]["jobs"]], per_k[mine[-1]["jobs"]]
        out[policy] = {"s_per_1k_jobs": per_k, "growth_of_s_per_job": round(last / first, 2) if first else None}
    return out


if __name__ == "__main__":
    main()
