"""DeepBoot: elastic training across the training and inference partitions vs no lending, on
DeepBoot's ``small`` workload.

Reads /work/shared/data (DeepBoot's data is for evaluation only and is never copied into the
repository): ``$HORUS_SHARED_DATA`` or ``../shared/data`` relative to the repository root. Cluster as
in DeepBoot's experiments: 16 nodes × 4 GPUs, the first 8 nodes training, the last 8 inference.
Training durations follow the Pollux/Sia/DeepBoot duration rule (docs/simulator.md) from the
application traces shipped next to the workload, and the elastic jobs' goodput comes from the same
traces; inference rows keep their ``duration``.

Policies: ``deepboot`` (ATS rounds every 60 s, reclaim by shrinking, AFE, inference pods' lifecycle)
against ``deepboot-nolend`` (rigid jobs at their requested size in the training partition, the
baseline). Costs default to the ones DeepBoot's simulator charges (``applications.py``: start
``APPLICATIONS_DELAY``, AFE rescale ``NEXT_DELAY``, inference start-up); ``--restart-cost X`` charges
X seconds for every change of a started job's placement instead (no AFE). Every training job pays
its application's start cost at its first start under both policies. ``--variants`` adds
``deepboot-nolend/elastic=true`` (elastic, no lending: DeepBoot's own baseline) and
``deepboot/elastic=false`` (rigid lending) to show where the gain comes from; ``--sweep`` repeats
``deepboot`` at restart costs 30 s and 103 s. Prints one JSON document with the mean training JCT
of the runs and ``training_jct_ratio_lend_vs_nolend`` (the paper reports −32 % on its testbed).
"""

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_horus.sim.elastic import DeepBootOptions  # noqa: E402
from slurm_horus.sim.engine import SimOptions  # noqa: E402
from slurm_horus.sim.metrics import jct_by_kind, summarize  # noqa: E402
from slurm_horus.sim.run import parse_cluster, run_policies  # noqa: E402
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402

# The costs DeepBoot's simulator charges (seconds; its applications.py, commit cc85a24): a training
# job's start, its change of replica count under AFE, and an inference pod's start-up.
PUBLISHED = DeepBootOptions(
    start_costs={"bert": 103, "cifar10": 24, "ncf": 25, "deepspeech2": 18, "yolov3": 26, "imagenet": 35},
    rescale_costs={"bert": 5, "cifar10": 3, "ncf": 2, "deepspeech2": 1, "yolov3": 3, "imagenet": 3},
    inference_costs={"infer-cifar10": 6, "infer-imagenet": 6, "infer-yolov3": 6, "infer-bert": 8,
                     "infer-deepspeech2": 4, "infer-ncf": 4})


def shared_data() -> Path:
    return Path(os.environ.get("HORUS_SHARED_DATA", ROOT.parent / "shared" / "data"))


def run(jobs, policies, costs, load):
    groups = parse_cluster("8x4:v100@train,8x4:v100@infer")
    started = time.perf_counter()
    results = run_policies(jobs, groups, load_truth("gavel:v100"), policies, load=load,
                           options=SimOptions(deepboot=costs))
    elapsed = time.perf_counter() - started
    out = {}
    for r in results:
        s = summarize(r)
        out[r.policy] = {"mean_training_jct": round(jct_by_kind(r, "train"), 1),
                         "mean_inference_jct": round(jct_by_kind(r, "infer"), 2),
                         "makespan": round(s["makespan"], 1), "preemptions": s["preemptions"],
                         "unfinished": s["unfinished"], **(r.runtime or {})}
    return out, elapsed


def ratio(runs, lend, nolend):
    return round(runs[lend]["mean_training_jct"] / runs[nolend]["mean_training_jct"], 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="small")
    parser.add_argument("--restart-cost", type=float, default=None,
                        help="seconds every change of a started job's placement costs (default: DeepBoot's AFE costs)")
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--variants", action="store_true", help="also elastic without lending, rigid lending")
    parser.add_argument("--sweep", action="store_true", help="also deepboot at restart costs 30 s and 103 s")
    args = parser.parse_args()
    data = shared_data() / "deepboot"
    jobs = read_trace(str(data / "workload" / f"{args.workload}.csv"), "pollux", traces_dir=str(data / "traces"))
    costs = replace(PUBLISHED, restart=args.restart_cost)
    policies = ["deepboot", "deepboot-nolend"]
    if args.variants:
        policies += ["deepboot-nolend/elastic=true", "deepboot/elastic=false"]
    runs, elapsed = run(jobs, policies, costs, args.load)
    out = {"workload": args.workload, "jobs": len(jobs),
           "training_jobs": sum(1 for j in jobs if j.kind == "train"),
           "inference_jobs": sum(1 for j in jobs if j.kind == "infer"),
           "restart_cost": "published (AFE)" if args.restart_cost is None else args.restart_cost,
           "policies": runs}
    out["training_jct_ratio_lend_vs_nolend"] = ratio(runs, "deepboot", "deepboot-nolend")
    if args.variants:
        out["training_jct_ratio_vs_elastic_nolend"] = ratio(runs, "deepboot", "deepboot-nolend/elastic=true")
        out["training_jct_ratio_rigid_lend_vs_nolend"] = ratio(runs, "deepboot/elastic=false", "deepboot-nolend")
    if args.sweep:
        out["sweep"] = {}
        for cost in (30.0, 103.0):
            swept, more = run(jobs, ["deepboot"], replace(PUBLISHED, restart=cost), args.load)
            elapsed += more
            out["sweep"][f"restart_cost_{cost:g}"] = {
                **swept["deepboot"],
                "training_jct_ratio_lend_vs_nolend": round(
                    swept["deepboot"]["mean_training_jct"] / runs["deepboot-nolend"]["mean_training_jct"], 4)}
    out["wall_s"] = round(elapsed, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
