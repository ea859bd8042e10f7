"""From a job's end to the start of the job waiting for its GPU: plain Slurm, horusd, and horusd told by
EpilogSlurmctld (``job_submit_lua/horus_epilog.lua``).

One local cluster per setting, 1 node x 2 fake GPUs, Slurm of the host (or ``--slurm``). A 600 s job
holds GPU 1 throughout. Each round: a job of ``--short`` seconds takes GPU 0; once it runs, a 1-GPU
job is submitted, which must wait (horusd keeps it; plain Slurm leaves it pending). Two figures per
round, from the first job's last line (it prints ``date +%s.%N``):

* ``to_move_s``: to horusd's move of the waiting job (slurmctld's log line ``setting begin to ... for
  JobId=N``, millisecond stamps): horusd's own reaction;
* ``to_start_s``: to the waiting job's first line: what a user waits, including Slurm starting the
  moved job (its next scheduling pass: the local cluster's ``bf_interval=1``) and launching it.

horusd runs with the site defaults (``refresh_s`` 2, ``cycle_s`` 2; the local cluster's own default
refresh is 1 s). Prints JSON: per setting the rounds' figures, medians and maxima.

    .venv/bin/python bench/bench_end_to_start.py [--rounds 10] [--short 3] [--slurm system|24.11|26.05]

Needs root + the Debian packages (as ``make test``); reads no ../shared data. About 3 minutes.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from datetime import datetime  # noqa: E402

from slurm_horus.localcluster import LocalCluster  # noqa: E402
from slurm_horus.localcluster import poll as wait_until  # noqa: E402

STAMP = "#!/bin/sh\necho START=$(date +%s.%N)\nsleep {seconds}\necho END=$(date +%s.%N)\n"
SITE = {"refresh_s": 2.0, "cycle_s": 2.0}
SETTINGS = {"slurm": dict(horus=False), "horusd": dict(horus=True, ended_epilog=False, horus_settings=SITE),
            "horusd+epilog": dict(horus=True, ended_epilog=True, horus_settings=SITE)}


def stamps(cluster, job_id):
    try:
        text = cluster.job_output(job_id)
    except FileNotFoundError:
        return {}
    return {k: float(v) for k, v in re.findall(r"^(START|END)=([0-9.]+)$", text, re.M)}


def moved_at(cluster, job_id):
    """When slurmctld took horusd's move of ``job_id`` (its log's millisecond stamp), or None."""
    text = (cluster.root / "log" / "slurmctld.log").read_text(errors="replace")
    found = re.findall(r"^\[([0-9T:.-]+)\] sched: _update_job: setting begin to \S+ for JobId=%d$" % int(job_id),
                       text, re.M)
    return datetime.strptime(found[-1], "%Y-%m-%dT%H:%M:%S.%f").timestamp() if found else None


def _summary(values):
    done = [v for v in values if v is not None]
    return {"median_s": round(statistics.median(done), 3) if done else None, "max_s": max(done) if done else None}


def one_setting(options, rounds, short, slurm):
    cluster = LocalCluster(nodes=1, gpus=2, slurm=slurm, **options).up()
    waits, moves = [], []
    try:
        holder = cluster.sbatch(["--gres=gpu:1", "-t", "20"], STAMP.format(seconds=600))
        cluster.wait_jobs([holder], timeout=60, states=("RUNNING",))
        for _ in range(rounds):
            first = cluster.sbatch(["--gres=gpu:1", "-t", "2"], STAMP.format(seconds=short))
            cluster.wait_jobs([first], timeout=60, states=("RUNNING",))
            waiting = cluster.sbatch(["--gres=gpu:1", "-t", "2"], STAMP.format(seconds=0))
            cluster.wait_jobs([first], timeout=120)
            if not wait_until(lambda: "END" in stamps(cluster, waiting), 120):
                waits.append(None)
                continue
            ended = stamps(cluster, first)["END"]
            waits.append(round(stamps(cluster, waiting)["START"] - ended, 3))
            if options.get("horus"):
                moved = moved_at(cluster, waiting)
                moves.append(None if moved is None else round(moved - ended, 3))
            time.sleep(0.5)  # the waiting job's own end is not the next round's
    finally:
        cluster.down()
    out = {"to_start_s": waits, "to_start": _summary(waits), "not_started": waits.count(None)}
    if moves:
        out.update(to_move_s=moves, to_move=_summary(moves))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--short", type=float, default=3.0)
    parser.add_argument("--slurm", default="system")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    args = parser.parse_args()
    out = {"benchmark": "end-to-start", "rounds": args.rounds, "slurm": args.slurm,
           "load_avg_start": round(os.getloadavg()[0], 2), "settings": {}}
    for name in args.settings.split(","):
        out["settings"][name] = one_setting(SETTINGS[name], args.rounds, args.short, args.slurm)
    out["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
