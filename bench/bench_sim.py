"""Policy comparison on Philly-derived single-GPU jobs, 64 V100 GPUs, V100 measured pairs as truth.

Reads /work/shared/data (not shipped with slurm-horus): ``$HORUS_SHARED_DATA`` or ``../shared/data``
relative to the repository root. Workload: ``--jobs`` single-GPU jobs drawn (by seed, keeping their
arrival order and gaps) from Pollux's ``philly.csv`` among those lasting 1 minute to 4 hours (the
multi-day tail would make the makespan the length of one job, whatever the policy); classes drawn
uniformly from Gavel's 26 job classes by seed; arrivals scaled so that the offered load (work
arriving per second / GPUs) is each of ``--loads``. Policies see the built-in priors without the V100
pairs (P100 pairs + profiles) and learn V100 pairs as they run, at horusd's cadence (each pair at its
next hourly model refit, run times at its 5-minute feeds; ``SimOptions`` defaults). Each load is run with both
knowledges of durations (``--durations``): ``estimated`` (the duration estimator, learning from the
jobs finished earlier in the run; what horusd knows) and ``oracle`` (the trace's true durations);
the ``oracle`` policy knows the true durations in both. Prints one JSON document, and a side-by-side
table on stderr.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_horus.sim.engine import SimOptions  # noqa: E402
from slurm_horus.sim.metrics import summarize  # noqa: E402
from slurm_horus.sim.run import parse_cluster, run_policies  # noqa: E402
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402

POLICIES = ["slurm-default", "sjf", "sjf-ffs", "sjf-bsbf", "horus-util", "iasp-iapp", "oracle", "horus"]


def shared_data() -> Path:
    return Path(os.environ.get("HORUS_SHARED_DATA", ROOT.parent / "shared" / "data"))


def philly_single_gpu(n_jobs, seed=0, min_s=60.0, max_s=4 * 3600.0):
    import numpy as np

    jobs = read_trace(str(shared_data() / "pollux_adaptdl" / "traces" / "philly.csv"), "philly")
    jobs = sorted((j for j in jobs if j.num_gpus == 1 and min_s <= j.duration <= max_s),
                  key=lambda j: j.submit_time)
    picks = sorted(np.random.default_rng(seed).choice(len(jobs), min(n_jobs, len(jobs)), replace=False))
    jobs = [jobs[i] for i in picks]
    first = jobs[0].submit_time
    for j in jobs:
        j.submit_time -= first
    return jobs


def offered_load(jobs, n_gpus):
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    return sum(j.duration for j in jobs) / (span * n_gpus)


def one_run(jobs, groups, truth, policies, seed, load, durations):
    started = time.time()
    results = run_policies(jobs, groups, truth, policies, seed=seed, load=load,
                           options=SimOptions(durations=durations))
    summaries = {r.policy: summarize(r) for r in results}
    base = summaries.get("slurm-default")
    table = {}
    for name, s in summaries.items():
        row = {k: round(s[k], 4) for k in ("makespan", "mean_jct", "p99_jct", "mean_queueing_delay",
                                            "effective_utilization", "bad_pair_share", "oom_events")}
        if base:
            for k in ("makespan", "mean_jct", "effective_utilization"):
                row[k + "_vs_default"] = round(s[k] / base[k] - 1.0, 4)
        row["durations"] = s["durations"]
        errors = s["estimator"]
        row["estimator"] = {k: round(errors[k], 4) for k in ("mare", "rank_corr", "within_2x", "coverage_80")
                            if errors.get(k) is not None}
        table[name] = row
    return {"policies": table, "seconds": round(time.time() - started, 1),
            "default_saturated": bool(base and base["mean_queueing_delay"] >= _mean_duration(jobs))}


def _mean_duration(jobs):
    return sum(j.duration for j in jobs) / len(jobs)


def side_by_side(out) -> str:
    """Per load: change vs slurm-default (makespan / mean JCT / eff. util.), estimated | oracle durations."""
    lines = []
    for load, runs in out["loads"].items():
        lines.append(f"load {load}: makespan / mean JCT / eff.util vs slurm-default; dur.err = median abs. "
                     "relative error of the estimates the policy was given")
        lines.append(f"{'policy':<14} {'estimated durations':<28} {'dur.err':>7}   {'oracle durations':<28}")
        est, orc = runs.get("estimated", {}).get("policies", {}), runs.get("oracle", {}).get("policies", {})
        for name in est or orc:
            cells = []
            for table in (est, orc):
                row = table.get(name)
                cells.append("-" if row is None or "makespan_vs_default" not in row else
                             f"{row['makespan_vs_default']:+.1%} / {row['mean_jct_vs_default']:+.1%} / "
                             f"{row['effective_utilization_vs_default']:+.1%}")
            row = est.get(name, {})
            err = "exact" if row.get("durations") == "oracle" else f"{row.get('estimator', {}).get('mare', 0):.2f}"
            lines.append(f"{name:<14} {cells[0]:<28} {err:>7}   {cells[1]:<28}")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--loads", default="3.0,1.5,0.3", help="offered loads (work arriving / capacity)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--cluster", default="16x4:v100")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--durations", default="estimated,oracle", help="knowledges of durations to run")
    args = parser.parse_args()
    truth = load_truth("gavel:v100")
    groups = parse_cluster(args.cluster)
    n_gpus = sum(g.nodes * g.gpus_per_node for g in groups)
    jobs = philly_single_gpu(args.jobs, args.seed)
    base_load = offered_load(jobs, n_gpus)
    out = {"workload": {"jobs": len(jobs), "gpus": n_gpus, "mean_duration_s": _mean_duration(jobs),
                        "original_offered_load": base_load}, "loads": {}}
    for target in (float(x) for x in args.loads.split(",")):
        runs = out["loads"][str(target)] = {}
        for durations in args.durations.split(","):
            runs[durations] = one_run(jobs, groups, truth, args.policies.split(","), args.seed,
                                      target / base_load, durations)
            print(json.dumps({str(target): {durations: {n: (r.get("makespan_vs_default"), r.get("mean_jct_vs_default"),
                                                            r.get("effective_utilization_vs_default"))
                                                        for n, r in runs[durations]["policies"].items()}}}),
                  file=sys.stderr)
    print(side_by_side(out), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
