"""SJF-BSBF's sub-batching reaches the job on real Slurm, both ways a decision is applied.

- At submission: job_submit.lua, inside the real slurmctld, sets HORUS_MICRO_BATCH and
  HORUS_GRAD_ACCUM in the job's environment (``job_desc.environment``) from horusd's reply. The
  reply comes from a real :class:`Frontend` with a fixed decision (which pair needs sub-batching is
  the policy's business, tested in test_placement.py); the site file names its socket for the test.
- From horusd's queue: a kept job's environment cannot be changed once submitted, so the mover
  writes ``micro_batch=`` ``grad_accum=`` into its token and the job runs ``horus job-env``.
"""

import os
import subprocess
import sys
import time
from unittest import mock

import pytest

from conftest import local_cluster
from slurm_horus.service.server import Frontend
from slurm_horus.tokens import format_token

from slurm_horus.localcluster.chroot import slurm_install

# The job script runs `horus job-env` on its node. A chroot's Slurm (make test-slurm-newer) runs job
# scripts inside the chroot, where slurm-horus is not installed (a site installs it on its nodes).
pytestmark = pytest.mark.skipif(slurm_install().root is not None,
                                reason="job scripts run inside the Slurm chroot, which has no slurm-horus")

SHOW = f"""#!/bin/bash
eval "$({sys.executable} -m slurm_horus job-env)"
echo "micro=$HORUS_MICRO_BATCH accum=$HORUS_GRAD_ACCUM"
"""


@pytest.fixture(scope="module")
def cluster():
    started = local_cluster(nodes=1, gpus=2, horus=True)
    # started with a caller's stray setting, which slurmctld must not see
    with mock.patch.dict(os.environ, {"HORUS_CONFIG": "/nonexistent/another-cluster/horus.conf"}):
        cluster = next(started)
    yield cluster
    next(started, None)


def test_slurmctld_reads_this_clusters_site_file_whatever_the_callers_environment(cluster):
    ctld = next(d["pid"] for d in cluster.daemons if d["name"] == "slurmctld")
    with open(f"/proc/{ctld}/environ", "rb") as environ:
        values = dict(v.split(b"=", 1) for v in environ.read().split(b"\0") if b"=" in v)
    assert values[b"HORUS_CONFIG"].decode() == str(cluster.horus_config)


def sbatch(cluster, *args):
    result = subprocess.run(["sbatch", "--parsable", f"--output={cluster.layout.jobs}/slurm-%j.out",
                             f"--chdir={cluster.layout.jobs}", "-t", "5", *args],
                            env=cluster.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().split(";")[0])


def output(cluster, job):
    assert cluster.wait_jobs([job], timeout=60)[job] == "COMPLETED", cluster.job_output(job)
    return cluster.job_output(job).strip()


def test_a_decision_at_submission_sets_the_environment(cluster, tmp_path):
    def decide(message):
        return {"ok": True, "action": "place", "id": "h-sub1", "nodes": "n1", "tres": "gres:shard:g1:1",
                "mode": "shared", "slowdown": 1.25, "class": "resnet50-bs128", "gpulist": "n1:1",
                "micro_batch": 64, "grad_accum": 2, "age": 0.1}

    front = Frontend(decide, f"/tmp/horus-sub-{os.getpid()}.sock")
    front.start()
    site = cluster.horus_config
    original = site.read_text()
    try:
        # the last setting wins; a loaded machine may answer slower than the default 100 ms
        site.write_text(original + f"socket = {front.socket_path}\ntimeout_ms = 3000\n")
        time.sleep(1.2)  # job_submit.lua re-reads the site file at most once a second
        script = tmp_path / "show.sh"
        script.write_text(SHOW)
        job = sbatch(cluster, "--gres=gpu:1", "--comment=class=resnet50-bs128", str(script))
    finally:
        site.write_text(original)
        front.stop()
    assert output(cluster, job) == "micro=64 accum=2"
    log = (cluster.root / "log" / "slurmctld.log").read_text()
    assert "placed horus:h-sub1 mode=shared slowdown=1.250 class=resnet50-bs128 gpus=n1:1 " \
           "micro_batch=64 grad_accum=2 nodes=n1 tres=gres:shard:g1:1" in log


def test_a_job_placed_from_the_queue_reads_its_token(cluster, tmp_path):
    script = tmp_path / "show.sh"
    script.write_text(SHOW)
    job = sbatch(cluster, "-H", "--gres=gpu:1", str(script))
    token = format_token("h-kept1", "shared", "resnet50-bs128", 1.25, "n1:0", micro_batch=32, grad_accum=4)
    subprocess.run(["scontrol", "update", f"JobId={job}", f"AdminComment={token}"], env=cluster.env, check=True)
    subprocess.run(["scontrol", "release", str(job)], env=cluster.env, check=True)
    assert output(cluster, job) == "micro=32 accum=4"
    plain = sbatch(cluster, "--gres=gpu:1", str(script))  # nothing decided: nothing exported
    assert output(cluster, plain) == "micro= accum="


def test_job_env_outside_a_job_is_one_line():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    result = subprocess.run([sys.executable, "-m", "slurm_horus", "job-env"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "horus: job-env: no job id (run it inside a Slurm job, or pass --job ID)\n"
