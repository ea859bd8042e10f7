"""The demo's job and accounting steps on the shared accounting cluster."""

import re

from slurm_horus.demo import STEPS, run_demo


def test_demo_steps_show_each_jobs_gpus_from_sacct(slurm_cluster_dbd):
    lines = []
    ctx = run_demo(echo=lines.append, cluster=slurm_cluster_dbd)
    text = "\n".join(lines)
    assert len(STEPS) >= 3 and "start a local" not in text  # the running cluster was reused
    two_gpu_job, _ = ctx.jobs["two-gpus"]
    shard_job, _ = ctx.jobs["shard"]
    row = re.search(rf"^\s+{two_gpu_job}\s+--gres=gpu:2\s+(n\d)\s+COMPLETED\s+(\S+)\s+(\d),(\d)$", text, re.M)
    assert row, text
    assert f"gpu:g{row.group(3)}=1" in row.group(2) and f"gpu:g{row.group(4)}=1" in row.group(2)
    assert re.search(rf"^\s+{shard_job}\s+--gres=shard:1\s+n\d\s+COMPLETED\s+shard=1\s+\d \(job env\)$", text, re.M), text
    assert slurm_cluster_dbd.status()["running"]
