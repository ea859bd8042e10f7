"""slurm-horus end to end on each supported Slurm (22.05, 24.11, 26.05), printed as JSON.

Per version: ``horus local-cluster up`` (4 nodes x 4 GPUs, horusd, slurmdbd), eight GPU jobs of known
classes submitted with plain ``sbatch --gres=gpu:1 --time=..``; each must get a horus decision (a
``horus:`` token with ``gpus=`` in its admin comment, read back by squeue) and complete; then
``horus ingest`` (into horusd's history database, where the decisions are) must store all eight with
their time limits, the batch steps' start and end (no NULL where Slurm 22.05 gives a value), their
verified ``horus:`` decision and the GPU it names. Also: the submit-path cost job_submit.lua logs per job, how
long a horusd refresh takes (median of 20 reads of squeue + nodes through slurm.queries.SlurmSource,
which is what horusd runs), and the cost of one Slurm command run through a chroot wrapper.

Needs root and the Debian packages (a chroot Slurm is built on first use, about a minute each).
Usage: python bench/bench_newer_slurm.py [--slurm system,24.11,26.05]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

from slurm_horus.localcluster import LocalCluster
from slurm_horus.slurm.queries import SlurmSource
from slurm_horus.store.db import open_db
from slurm_horus.tokens import parse_horus_tokens

CLASSES = ["resnet50-bs64", "lm-bs20", "transformer-bs64", "cyclegan", "recommendation-bs2048",
           "resnet18-bs32", "a3c", "lm-bs40"]
SCRIPT = "#!/bin/sh\necho gpu=$GPU_DEVICE_ORDINAL\nsleep 4\n"


def median_ms(samples):
    return round(statistics.median(samples) * 1000, 1)


def timed(function, runs):
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def one_version(slurm):
    out = {"slurm": slurm}
    started = time.monotonic()
    cluster = LocalCluster(nodes=4, gpus=4, with_dbd=True, horus=True, slurm=slurm).up()
    out["up_s"] = round(time.monotonic() - started, 2)
    try:
        out["version"] = str(cluster.slurm_version())
        jobs = [cluster.sbatch(["--gres=gpu:1", f"--time={5 + i}", f"--comment=class={job_class}"], SCRIPT)
                for i, job_class in enumerate(CLASSES)]
        queue = {job.job_id: job for job in cluster.queue()}
        tokens = {job: parse_horus_tokens(queue[job].admin_comment)[1] for job in jobs if job in queue}
        out["jobs_with_horus_decision"] = sum(1 for t in tokens.values() if t.get("gpus"))
        out["tokens"] = {job: f"class={t.get('class')} mode={t.get('mode')} gpus={t.get('gpus')}"
                         for job, t in tokens.items()}
        states = cluster.wait_jobs(jobs, timeout=120)
        out["jobs_completed"] = sum(state == "COMPLETED" for state in states.values())
        log = (cluster.root / "log" / "slurmctld.log").read_text()
        costs = [float(ms) for ms in re.findall(r"lua: horus: job .* placed .*\(([0-9.]+) ms\)", log)]
        out["lua_ms_median"] = round(statistics.median(costs), 2) if costs else None
        source = SlurmSource(cluster.slurm_conf, env=cluster.env)
        source.nodes()
        out["refresh_ms_median"] = median_ms(timed(lambda: (source.jobs(), source.nodes()), 20))
        out["nodes_from"] = " ".join(source.nodes_argv)
        out["squeue_json_ms_median"] = median_ms(timed(lambda: cluster.run(["squeue", "--json"]), 20))
        # accounting: wait until slurmdbd has every end record, then ingest into horusd's own history
        # database: a horus: token is believed only where its decision is recorded there
        deadline = time.monotonic() + 60
        while not all(j.end_time for j in cluster.accounting(jobs)) and time.monotonic() < deadline:
            time.sleep(1)
        env = dict(cluster.env, HORUS_CONFIG=str(cluster.horus_config))
        result = subprocess.run([sys.executable, "-m", "slurm_horus", "ingest", "--json", "--since", "2000-01-01"],
                                env=env, capture_output=True, text=True, timeout=300)
        out["ingest"] = json.loads(result.stdout) if result.returncode == 0 else result.stderr.strip()
        db = open_db(cluster.root / "horus.db")
        marks = ",".join("?" * len(jobs))
        rows = list(db.execute(f"SELECT job_id, time_limit_min, start_time, end_time, gpu_indices, horus_id "
                               f"FROM jobs WHERE job_id IN ({marks})", jobs))
        steps = list(db.execute(f"SELECT job_id, step_id, start_time, end_time FROM steps "
                                f"WHERE job_id IN ({marks})", jobs))
        out["ingested_jobs"] = len(rows)
        out["ingested_time_limits"] = sorted(r[1] for r in rows if r[1] is not None)
        out["ingested_jobs_with_null_times"] = sum(1 for r in rows if None in r[1:4])
        out["ingested_jobs_with_horus_id"] = sum(1 for r in rows if r[5])
        out["ingested_jobs_with_gpu_indices"] = sum(1 for r in rows if r[4])
        out["ingested_steps"] = len(steps)
        out["ingested_steps_with_null_times"] = sum(1 for s in steps if None in s[2:])
    finally:
        survivors = cluster.down()
        out["left_behind"] = survivors
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", default="system,24.11,26.05")
    args = parser.parse_args()
    print(json.dumps([one_version(slurm) for slurm in args.slurm.split(",")], indent=2))


if __name__ == "__main__":
    main()
