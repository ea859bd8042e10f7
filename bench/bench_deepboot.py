"""DeepBoot: lending idle inference GPUs to training vs not, on DeepBoot's ``small`` workload.

Reads /work/shared/data (DeepBoot's data is for evaluation only and is never copied into the
repository): ``$HORUS_SHARED_DATA`` or ``../shared/data`` relative to the repository root. Cluster as
in DeepBoot's experiments: 16 nodes × 4 GPUs, the first 8 nodes training, the last 8 inference.
Training durations follow the Pollux/Sia/DeepBoot duration rule (docs/simulator.md) from the
application traces shipped next to the workload; inference rows keep their ``duration``. Prints one
JSON document with the mean training JCT of both runs and their ratio (the paper reports −32…38 %).
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_horus.sim.engine import SimOptions  # noqa: E402
from slurm_horus.sim.metrics import jct_by_kind, summarize  # noqa: E402
from slurm_horus.sim.run import parse_cluster, run_policies  # noqa: E402
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="small")
    parser.add_argument("--restart-cost", type=float, default=30.0)
    parser.add_argument("--load", type=float, default=1.0)
    args = parser.parse_args()
    data = Path(os.environ.get("HORUS_SHARED_DATA", ROOT.parent / "shared" / "data")) / "deepboot"
    jobs = read_trace(str(data / "workload" / f"{args.workload}.csv"), "pollux", traces_dir=str(data / "traces"))
    groups = parse_cluster("8x4:v100@train,8x4:v100@infer")
    results = run_policies(jobs, groups, load_truth("gavel:v100"), ["deepboot", "deepboot-nolend"], load=args.load,
                           options=SimOptions(restart_cost=args.restart_cost))
    out = {"workload": args.workload, "jobs": len(jobs),
           "training_jobs": sum(1 for j in jobs if j.kind == "train"),
           "inference_jobs": sum(1 for j in jobs if j.kind == "infer"), "policies": {}}
    for r in results:
        s = summarize(r)
        out["policies"][r.policy] = {"mean_training_jct": round(jct_by_kind(r, "train"), 1),
                                     "mean_inference_jct": round(jct_by_kind(r, "infer"), 2),
                                     "makespan": round(s["makespan"], 1), "preemptions": s["preemptions"],
                                     "unfinished": s["unfinished"]}
    lend, nolend = out["policies"]["deepboot"], out["policies"]["deepboot-nolend"]
    out["training_jct_ratio_lend_vs_nolend"] = round(lend["mean_training_jct"] / nolend["mean_training_jct"], 4)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
