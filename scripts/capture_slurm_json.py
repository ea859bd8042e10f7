"""Capture the --json output the parser tests read (tests/data/*-<release>.json) from a real cluster.

    python scripts/capture_slurm_json.py --slurm 24.11 tests/data

On a 4-node x 4-GPU local cluster with accounting: a job pinned with ``-w n3 --gres=gpu:g2:1``, two
``--gres=shard:g1:1`` jobs and one ``--gres=gpu:2`` job, all on n3; ``sinfo``, ``scontrol show nodes``
and ``squeue`` while they run, ``sacct`` (and ``sacct -P``) after they completed. The 22.05 files were
made the same way on the system's Slurm.
"""

import argparse
import sys
import time
from pathlib import Path

from slurm_horus.slurm.acct import PARSABLE_DELIMITER, PARSABLE_FIELDS
from slurm_horus.localcluster import LocalCluster


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", default="system")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    with LocalCluster(nodes=4, gpus=4, with_dbd=True, slurm=args.slurm) as cluster:
        release = args.slurm if args.slurm != "system" else cluster.run(["scontrol", "version"]).stdout.split()[-1][:5]
        script = "#!/bin/sh\nsleep 6\n"
        jobs = [cluster.sbatch(["-w", "n3", "--gres=gpu:g2:1", "--time=5"], script)]
        jobs += [cluster.sbatch(["-w", "n3", "--gres=shard:g1:1", "--comment=class=lm-bs20"], script) for _ in range(2)]
        jobs.append(cluster.sbatch(["-w", "n3", "--gres=gpu:2"], script))
        cluster.wait_jobs(jobs, states={"RUNNING"})
        time.sleep(1)
        outputs = {"sinfo": ["sinfo", "--json"], "squeue": ["squeue", "--json"]}
        if args.slurm != "system":
            outputs["scontrol-nodes"] = ["scontrol", "--json", "show", "nodes"]
        for name, argv in outputs.items():
            (args.out / f"{name}-{release}.json").write_text(cluster.run(argv).stdout)
        cluster.wait_jobs(jobs)
        time.sleep(2)  # slurmdbd stores the end records a moment later
        ids = ",".join(map(str, jobs))
        (args.out / f"sacct-{release}.json").write_text(cluster.run(["sacct", "--json", "-a", "-j", ids]).stdout)
        (args.out / f"sacct-{release}.txt").write_text(cluster.run(
            ["sacct", "-P", "-n", "-a", "-j", ids, f"--delimiter={PARSABLE_DELIMITER}",
             "-o", ",".join(PARSABLE_FIELDS)]).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
