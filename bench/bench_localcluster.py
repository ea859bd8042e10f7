"""Local cluster timings, printed as JSON: up (with and without slurmdbd), first job done, down.

Goal (docs/local-cluster.md): up without accounting well under 1 s, with accounting from the
golden DB about 2 s, a fresh accounting DB about 10 s. Needs root and the Debian packages.
Usage: python bench/bench_localcluster.py [--runs N] [--fresh-db]
"""

import argparse
import json
import statistics
import time

from slurm_horus.localcluster import LocalCluster


def one_run(with_dbd, use_golden_db=True):
    started = time.monotonic()
    cluster = LocalCluster(with_dbd=with_dbd, use_golden_db=use_golden_db).up()
    up_s = time.monotonic() - started
    try:
        job = cluster.sbatch(["--gres=gpu:1"])
        cluster.wait_jobs([job])
        first_job_s = time.monotonic() - started
    finally:
        down_started = time.monotonic()
        survivors = cluster.down()
        down_s = time.monotonic() - down_started
    assert not survivors, survivors
    return {"up_s": up_s, "start_to_first_job_done_s": first_job_s, "down_s": down_s}


def summarize(runs):
    return {key: {"median": round(statistics.median(r[key] for r in runs), 3),
                  "max": round(max(r[key] for r in runs), 3)} for key in runs[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fresh-db", action="store_true", help="also time a start with a fresh accounting DB")
    args = parser.parse_args()
    figures = {
        "runs": args.runs,
        "no_dbd": summarize([one_run(False) for _ in range(args.runs)]),
        "dbd_golden": summarize([one_run(True) for _ in range(args.runs)]),
    }
    if args.fresh_db:
        figures["dbd_fresh"] = summarize([one_run(True, use_golden_db=False)])
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
