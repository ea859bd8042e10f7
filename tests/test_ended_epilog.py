"""horus_epilog.lua, slurm.conf's EpilogSlurmctld: horusd hears of every job's end at once, so a job it
keeps starts on what that job freed without waiting for horusd's next periodic squeue read.

One 1-node x 2-GPU cluster whose horusd reads the queue only every 120 s and runs its cycle as
rarely (``refresh_s``, ``cycle_s``), with a lease of 300 s: only the epilog's word can make horusd
look again soon after a job ends. The time from an end to the next start, with and without the
epilog, is measured by bench/bench_live_queue.py (phase E), not here.
"""

import os
import re
import subprocess
import shutil
import socket
import time

import pytest

import conftest
from slurm_horus.localcluster import poll as wait_until
from slurm_horus.resources import resource_path
from slurm_horus.service import protocol
from slurm_horus.tokens import parse_horus_tokens

pytestmark = pytest.mark.slurm

SLOW_S = 120  # horusd's own refresh and cycle period here
STAMP = "#!/bin/sh\necho START=$(date +%s.%N)\nsleep {seconds}\necho END=$(date +%s.%N)\n"


@pytest.fixture(scope="module")
def cluster():
    yield from conftest.local_cluster(nodes=1, gpus=2, horus=True, horus_settings={
        "refresh_s": SLOW_S, "cycle_s": SLOW_S, "lease_s": 300})


def ping(cluster):
    reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=5)
    assert reply is not None, "horusd did not answer ping"
    return reply


def stamps(cluster, job_id):
    try:
        text = cluster.job_output(job_id)
    except FileNotFoundError:  # not started yet
        return {}
    return {k: float(v) for k, v in re.findall(r"^(START|END)=([0-9.]+)$", text, re.M)}


def test_a_kept_job_starts_soon_after_the_end_that_frees_its_gpu(cluster):
    before = ping(cluster)["ended_notices"]
    # two jobs hold both GPUs; the first ends after 4 s
    short = cluster.sbatch(["--gres=gpu:1", "-t", "2"], STAMP.format(seconds=4))
    long = cluster.sbatch(["--gres=gpu:1", "-t", "5"], STAMP.format(seconds=600))
    cluster.wait_jobs([short, long], timeout=60, states=("RUNNING",))
    kept = cluster.sbatch(["--gres=gpu:1", "-t", "2"], STAMP.format(seconds=1))
    queue = {j.job_id: j for j in cluster.queue()}
    assert parse_horus_tokens(queue[kept].admin_comment)[1].get("mode") == "kept", \
        "no GPU was free: horusd should have kept the job"
    cluster.wait_jobs([short], timeout=60)
    ended = stamps(cluster, short)["END"]
    # without the epilog horusd would look again only at its next read (up to 120 s) or when the
    # 300 s lease runs out
    assert wait_until(lambda: "START" in stamps(cluster, kept), 30), \
        "the kept job did not start within 30 s of the end that freed a GPU"
    waited = stamps(cluster, kept)["START"] - ended
    assert waited < 30
    assert ping(cluster)["ended_notices"] > before
    cluster.cancel_all_jobs()


def test_the_epilog_is_configured_and_never_fails(cluster, tmp_path):
    conf = cluster.slurm_conf.read_text()
    epilog = re.search(r"^EpilogSlurmctld=(\S+)$", conf, re.M)
    assert epilog and os.access(epilog.group(1), os.X_OK)
    # no horusd at that socket, a job id that is not one, no job id: exit 0, and quickly
    copy = tmp_path / "horus_epilog.lua"
    shutil.copyfile(resource_path("job_submit_lua", "horus_epilog.lua"), copy)
    shutil.copyfile(resource_path("job_submit_lua", "job_submit.lua"), tmp_path / "job_submit.lua")
    (tmp_path / "horus.conf").write_text(f"socket = {tmp_path / 'none.sock'}\ntimeout_ms = 100\n")
    def run(job_id):
        env = {k: v for k, v in os.environ.items() if k not in ("HORUS_CONFIG", "SLURM_JOB_ID")}
        if job_id is not None:
            env["SLURM_JOB_ID"] = job_id
        began = time.monotonic()
        done = subprocess.run(["lua5.1", str(copy)], env=env, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return time.monotonic() - began

    for job_id in ("42", "x", None):
        assert run(job_id) < 10
    # a horusd that accepts and never answers (hung): the script gives up at its deadline (100 ms)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hung:
        hung.bind(str(tmp_path / "none.sock"))
        hung.listen(8)
        assert run("42") < 5
