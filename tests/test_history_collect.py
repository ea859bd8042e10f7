"""Collector with the stand-in NVML backend, driven by real processes carrying Slurm's GPU variables."""

import io
import os
import subprocess
import sys
import time

import pytest

NODE = "hxtest1"  # a node name no local cluster uses: their jobs on "n1" must not count here
OTHER = "hxtest2"

from slurm_horus.proc import parent_pid, read_environ
from slurm_horus.collect.nvml import ProcessReading, StandinBackend, nvml_call
from slurm_horus.collect.sampler import Spool, export_batches, import_batches, sample_once, ship
from slurm_horus.store.db import open_db


@pytest.fixture
def fake_jobs():
    """Start fake GPU job processes; yields a function start(job_id, gpus, util, node, mem, holder_only)."""
    started = []

    def start(job_id, gpus, util=None, node=NODE, mem=None, var="GPU_DEVICE_ORDINAL"):
        env = dict(os.environ, SLURM_JOB_ID=str(job_id), SLURMD_NODENAME=node)
        env[var] = gpus
        if var != "GPU_DEVICE_ORDINAL":
            env.pop("GPU_DEVICE_ORDINAL", None)
        if util is not None:
            env["HORUS_FAKE_GPU_UTIL"] = str(util)
            env["GPU_DEVICE_ORDINAL"] = gpus
        if mem is not None:
            env["HORUS_FAKE_GPU_MEM_MB"] = str(mem)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        started.append(proc)
        deadline = time.time() + 5
        while read_environ(proc.pid) is None or "SLURM_JOB_ID" not in read_environ(proc.pid):
            assert time.time() < deadline
            time.sleep(0.01)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _use(batch, job, gpu):
    rows = [u for u in batch["jobs"] if u["job_id"] == job and u["gpu_index"] == gpu]
    assert len(rows) <= 1
    return rows[0] if rows else None


def test_exclusive_and_shared_gpus_land_on_the_right_jobs(fake_jobs):
    fake_jobs(101, "0", util=70, mem=3000)          # exclusive on GPU 0
    fake_jobs(102, "2", util=30, mem=1000)          # GPU 2 shared by 102 and 103
    fake_jobs(103, "2", util=45, mem=2000)
    fake_jobs(104, "1", var="SLURM_JOB_GPUS")       # holds GPU 1, runs nothing on it
    fake_jobs(105, "3", util=90, node=OTHER)         # another node's job: not ours
    batch = sample_once(StandinBackend(gpus=4, node=NODE), NODE)

    gpus = {g["gpu_index"]: g for g in batch["gpus"]}
    assert gpus[0]["job_ids"] == "101" and gpus[0]["gpu_util"] == 70
    assert gpus[2]["job_ids"] == "102,103" and gpus[2]["gpu_util"] == 75
    assert gpus[1]["job_ids"] == "104" and gpus[1]["gpu_util"] == 0
    assert gpus[3]["job_ids"] is None

    assert _use(batch, 101, 0)["sm_util"] == 70 and _use(batch, 101, 0)["shared"] == 0
    assert _use(batch, 101, 0)["mem_used_mb"] == 3000
    assert _use(batch, 102, 2)["sm_util"] == 30 and _use(batch, 102, 2)["shared"] == 1
    assert _use(batch, 103, 2)["sm_util"] == 45 and _use(batch, 103, 2)["mem_used_mb"] == 2000
    assert _use(batch, 104, 1)["sm_util"] == 0 and _use(batch, 104, 1)["n_procs"] == 0
    assert _use(batch, 105, 3) is None
    assert {u["job_id"] for u in batch["jobs"]} == {101, 102, 103, 104}


def test_child_processes_of_a_job_are_not_counted_twice(fake_jobs):
    env = dict(os.environ, SLURM_JOB_ID="201", SLURMD_NODENAME=NODE, GPU_DEVICE_ORDINAL="1",
               HORUS_FAKE_GPU_UTIL="40")
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
         "print(c.pid, flush=True); time.sleep(60)"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert parent_pid(child) == parent.pid
        batch = sample_once(StandinBackend(gpus=2, node=NODE), NODE)
        assert _use(batch, 201, 1)["sm_util"] == 40 and _use(batch, 201, 1)["n_procs"] == 1
    finally:
        os.kill(child, 9)
        parent.kill()
        parent.wait()


def test_vanished_process_and_lost_gpu_do_not_crash(fake_jobs):
    proc = fake_jobs(301, "0", util=50)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer exists, as if it exited between NVML and /proc
    backend = StandinBackend(gpus=3, node=NODE, lost={1},
                             extra_processes={2: [ProcessReading(pid=gone.pid, used_mem_mb=10, sm_util=5)]})
    batch = sample_once(backend, NODE)
    assert sorted(g["gpu_index"] for g in batch["gpus"]) == [0, 2]
    assert _use(batch, 301, 0)["sm_util"] == 50
    proc.kill()
    proc.wait()
    batch = sample_once(backend, NODE)  # the job process is gone now too
    assert batch["jobs"] == [] and len(batch["gpus"]) == 2


class _Broken:
    """A pynvml-like module whose queries fail the way a real driver does."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def nvmlDeviceGetProcessUtilization(self, handle, since):
        raise self.NVMLError_NotSupported()

    def nvmlDeviceGetUtilizationRates(self, handle):
        raise self.NVMLError("GPU is lost")


def test_nvml_call_turns_not_supported_and_missing_into_none():
    broken = _Broken()
    assert nvml_call(broken, "nvmlDeviceGetProcessUtilization", object(), 0) is None
    assert nvml_call(broken, "nvmlDeviceGetUtilizationRates", object(), default=-1) == -1
    assert nvml_call(broken, "nvmlDeviceGetNoSuchQuery", object()) is None


def test_spool_ships_once_and_export_import_round_trip(tmp_path, fake_jobs):
    fake_jobs(401, "0", util=60)
    backend = StandinBackend(gpus=1, node=NODE)
    spool = Spool(tmp_path / "spool.db")
    for ts in (100.0, 105.0, 110.0):
        spool.append(sample_once(backend, NODE, ts))
    db = open_db(tmp_path / "horus.db")
    assert ship(spool, db) == 3
    assert ship(spool, db) == 0
    # a batch shipped twice (kill between store and mark) is stored once
    batches = [b for _, b in Spool(tmp_path / "spool.db").conn.execute("SELECT id, payload FROM batches")]
    import json
    from slurm_horus.collect.sampler import store_batches
    store_batches(db, [json.loads(b) for b in batches])
    assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 3
    assert db.execute("SELECT count(*) FROM job_gpu_use WHERE job_id = 401").fetchone()[0] == 3

    spool.append(sample_once(backend, NODE, 120.0))
    out = io.StringIO()
    assert export_batches(spool, out) == 1
    other = open_db(tmp_path / "head.db")
    assert import_batches(other, out.getvalue().splitlines()) == 1
    assert other.execute("SELECT ts FROM gpu_samples").fetchall() == [(120.0,)]


def test_jobs_of_another_cluster_on_the_same_host_are_left_out(fake_jobs, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/lab/a/slurm.conf")
    fake_jobs(501, "0", util=20)
    monkeypatch.setenv("SLURM_CONF", "/lab/b/slurm.conf")
    fake_jobs(502, "0", util=30)
    backend = StandinBackend(gpus=1, node=NODE, slurm_conf="/lab/a/slurm.conf")
    batch = sample_once(backend, NODE, slurm_conf="/lab/a/slurm.conf")
    assert [u["job_id"] for u in batch["jobs"]] == [501] and batch["gpus"][0]["gpu_util"] == 20
