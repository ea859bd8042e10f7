"""Horus (``horus-util``) against ``slurm-default`` on two truths, with the project's default knowledge.

Reads the shared data folder (``$HORUS_SHARED_DATA`` or ``../shared/data``; not shipped):

* ``gavel``: exactly ``bench_sim.py``'s workload (4,000 Philly single-GPU jobs of 1 min–4 h, Gavel's
  26 classes, 16×4 V100, truth ``gavel:v100``);
* ``lucid``: the same jobs with classes drawn from Lucid's models (the classes of
  ``data__colocate_info.csv``), 16×4 RTX 3090, truth = Lucid's measured pairs (a pair Lucid did not
  measure runs at 0.5 each, sets of three compose). Lucid's data is read for evaluation only.

The policies never see the truth: ``horus-util``'s utilizations are predicted from the models'
features (``interference/utilmodel.py``: its analytic prior, since nothing measured is given to it),
and its pair predictions (used only to keep pairs predicted not to fit apart) are the built-in
priors, which know nothing of Lucid's classes. ``--lucid-measured`` gives them Lucid's measured solo
profiles instead on the ``lucid`` truth (utilization and memory as NVML would read them live: a
measured utilization wins over the prediction). Prints JSON: per truth and load, makespan, mean JCT
and effective utilization of each policy and their change vs ``slurm-default``.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_sim import offered_load, philly_single_gpu  # noqa: E402
from shared_data import LUCID_GPU, load_lucid  # noqa: E402

from slurm_horus.sim.metrics import summarize  # noqa: E402
from slurm_horus.sim.run import parse_cluster, run_policies  # noqa: E402
from slurm_horus.sim.truth import Truth, load_truth  # noqa: E402


def lucid_truth():
    _, observations, _ = load_lucid()
    classes = sorted({o.job_class for o in observations} | {o.corunner_class for o in observations})
    return Truth(observations, classes=classes, name="lucid", scaling={})


def lucid_profiles_csv() -> str:
    """Lucid's solo profiles written to a temporary profiles CSV (removed at exit)."""
    import atexit
    import csv
    import os
    import tempfile

    from slurm_horus.interference.io import PROFILE_COLUMNS

    profiles, _, _ = load_lucid()
    handle, path = tempfile.mkstemp(suffix=".csv", prefix="lucid-profiles-")
    atexit.register(os.unlink, path)
    with os.fdopen(handle, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(PROFILE_COLUMNS)
        for p in profiles:
            writer.writerow(["" if getattr(p, c) is None else getattr(p, c) for c in PROFILE_COLUMNS])
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--loads", default="3.0")
    parser.add_argument("--policies", default="slurm-default,horus-util")
    parser.add_argument("--truths", default="gavel,lucid")
    parser.add_argument("--lucid-measured", action="store_true",
                        help="give the policies Lucid's measured solo profiles (utilization, memory) on the "
                             "lucid truth, as NVML readings would live (evaluation only)")
    args = parser.parse_args()
    out = {}
    measured = lucid_profiles_csv() if args.lucid_measured else None
    for name in args.truths.split(","):
        truth, cluster = (load_truth("gavel:v100"), "16x4:v100") if name == "gavel" else \
            (lucid_truth(), f"16x4:{LUCID_GPU}")
        groups = parse_cluster(cluster)
        jobs = philly_single_gpu(args.jobs, 0)
        for job in jobs:
            job.job_class = None  # drawn from the truth's classes by seed
        base = offered_load(jobs, sum(g.nodes * g.gpus_per_node for g in groups))
        for load in (float(x) for x in args.loads.split(",")):
            results = run_policies(jobs, groups, truth, args.policies.split(","), seed=0, load=load / base,
                                   profiles_path=measured if name == "lucid" else None)
            summaries = {r.policy: summarize(r) for r in results}
            default = summaries["slurm-default"]
            out[f"{name}@{load}"] = {
                policy: {"makespan": round(s["makespan"]), "mean_jct": round(s["mean_jct"]),
                         "effective_utilization": round(s["effective_utilization"], 3),
                         "makespan_vs_default": round(s["makespan"] / default["makespan"] - 1, 4),
                         "mean_jct_vs_default": round(s["mean_jct"] / default["mean_jct"] - 1, 4),
                         "bad_pair_share": round(s["bad_pair_share"], 3), "oom_events": s["oom_events"]}
                for policy, s in summaries.items()}
            print(json.dumps({f"{name}@{load}": {p: (v["makespan_vs_default"], v["mean_jct_vs_default"])
                                                  for p, v in out[f"{name}@{load}"].items()}}), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
