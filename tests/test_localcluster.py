"""The real local cluster: pinned GPUs, shared shards, job_submit.lua, teardown, prerequisites."""

import json
import os
import shutil
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from slurm_horus.errors import InputError
from slurm_horus.localcluster import LocalCluster, prerequisite_problems
from slurm_horus.localcluster import procs
from slurm_horus.localcluster.chroot import slurm_install
from slurm_horus.resources import resource_path
from slurm_horus.localcluster.prereq import CORE_REQUIREMENTS, PrerequisiteError, check_prerequisites
from slurm_horus.slurm import GresItem, SlurmCommandError, run_slurm

HORUS = [sys.executable, "-m", "slurm_horus.cli"]

SHOW_GPUS = """#!/bin/sh
echo "node=$SLURMD_NODENAME job_gpus=$SLURM_JOB_GPUS cvd=$CUDA_VISIBLE_DEVICES gdo=$GPU_DEVICE_ORDINAL"
"""

# Two jobs meet: each leaves a file and waits for the other's; "met" proves they ran at once.
RENDEZVOUS = """#!/bin/sh
touch {dir}/$SLURM_JOB_NAME
for i in $(seq 1 300); do
  if [ -e {dir}/{other} ]; then echo "met gdo=$GPU_DEVICE_ORDINAL"; sleep 1; exit 0; fi
  sleep 0.1
done
echo "alone gdo=$GPU_DEVICE_ORDINAL"; exit 1
"""


def test_job_pinned_to_gpu_g2_on_n3_sees_gpu_2(slurm_cluster):
    job = slurm_cluster.sbatch(["-w", "n3", "--gres=gpu:g2:1"], SHOW_GPUS)
    assert slurm_cluster.wait_jobs([job])[job] == "COMPLETED"
    assert slurm_cluster.job_output(job).split() == ["node=n3", "job_gpus=2", "cvd=2", "gdo=2"]


def run_shard_pair_on_gpu_1(cluster, meeting_dir):
    """Two ``shard:g1`` jobs on n2 that can only finish by meeting each other; return their ids."""
    os.chmod(meeting_dir, 0o777)
    tag = uuid.uuid4().hex[:6]
    a, b = f"shA{tag}", f"shB{tag}"
    jobs = [
        cluster.sbatch(["-w", "n2", "--gres=shard:g1:1", f"--job-name={a}"],
                       RENDEZVOUS.format(dir=meeting_dir, other=b)),
        cluster.sbatch(["-w", "n2", "--gres=shard:g1:1", f"--job-name={b}"],
                       RENDEZVOUS.format(dir=meeting_dir, other=a)),
    ]
    running = cluster.wait_jobs(jobs, states={"RUNNING", "COMPLETED"}, timeout=30)
    assert set(running.values()) <= {"RUNNING", "COMPLETED"}
    queued = {j.job_id: j for j in cluster.queue() if j.job_id in jobs}
    for job in jobs:
        if job in queued and queued[job].state == "RUNNING":
            assert queued[job].shard_gpu_indices() == (1,)
            assert queued[job].gres_requested == [GresItem("shard", "g1", 1)]
    assert set(cluster.wait_jobs(jobs).values()) == {"COMPLETED"}
    for job in jobs:
        assert cluster.job_output(job).split() == ["met", "gdo=1"]
    return jobs


def test_two_shard_jobs_share_gpu_1_at_the_same_time(slurm_cluster, tmp_path):
    run_shard_pair_on_gpu_1(slurm_cluster, tmp_path)


def test_live_sinfo_json_parses_into_typed_gpus_and_shards(slurm_cluster):
    nodes = slurm_cluster.nodes_info()
    assert sorted(n.name for n in nodes) == ["n1", "n2", "n3", "n4"]
    for node in nodes:
        assert [g for g in node.gres if g.name == "gpu"] == [GresItem("gpu", f"g{k}", 1) for k in range(4)]
        assert [g for g in node.gres if g.name == "shard"] == [GresItem("shard", f"g{k}", 2) for k in range(4)]
        assert node.cpus == 8 and node.real_memory == 4000


def test_live_squeue_json_shows_allocated_gpu_indices(slurm_cluster):
    job = slurm_cluster.sbatch(["-w", "n4", "--gres=gpu:g1:1,gpu:g3:1"], "#!/bin/sh\nsleep 30\n")
    try:
        slurm_cluster.wait_jobs([job], states={"RUNNING"}, timeout=30)
        (queued,) = [j for j in slurm_cluster.queue() if j.job_id == job]
        assert queued.nodes == "n4" and queued.gpu_indices() == (1, 3)
        (n4,) = [n for n in slurm_cluster.nodes_info() if n.name == "n4"]
        assert {1, 3} <= set(n4.gpu_indices_in_use())
    finally:
        slurm_cluster.run(["scancel", str(job)])


def test_logging_job_submit_lua_is_loaded_and_logs_each_submission(slurm_cluster):
    name = f"lua{uuid.uuid4().hex[:8]}"
    job = slurm_cluster.sbatch([f"--job-name={name}", "--gres=gpu:1"])
    slurm_cluster.wait_jobs([job])
    log = (slurm_cluster.root / "log" / "slurmctld.log").read_text()
    assert "horus: job_submit.lua loaded" in log
    prefix = slurm_cluster.slurm_version().gres_prefix  # gres: up to 22.05, gres/ later
    assert re.search(rf"horus: submit name={name} uid=0 .*tres_per_node={prefix}gpu:1", log)


def test_replaced_job_submit_lua_is_picked_up_even_twice_in_one_second(slurm_cluster, tmp_path):
    original = (slurm_cluster.root / "etc" / "job_submit.lua").read_text()
    log = slurm_cluster.root / "log" / "slurmctld.log"
    held = []
    try:
        for round_ in range(2):  # the second copy lands within a second of the first one's load
            word = uuid.uuid4().hex[:8]
            lua = tmp_path / f"job_submit_{round_}.lua"
            lua.write_text(original.replace('"horus: submit ', f'"horus: {word} submit '))
            slurm_cluster.install_job_submit(lua)
            held.append(slurm_cluster.sbatch([f"--job-name=reload{round_}", "--hold"]))
            assert f"horus: {word} submit name=reload{round_}" in log.read_text()
    finally:
        slurm_cluster.run(["scancel", *map(str, held)])
        slurm_cluster.install_job_submit(resource_path("job_submit_lua", "job_submit_logging.lua"))


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_dir_below_a_private_directory_is_refused_with_the_reason(tmp_path):
    os.chmod(tmp_path, 0o700)
    with pytest.raises(InputError, match="not searchable by others"):
        LocalCluster(directory=tmp_path / "c", nodes=1, gpus=1).up()


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_broken_job_submit_lua_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "job_submit.lua"
    bad.write_text("function slurm_job_submit(\n  this is not lua\n")
    cluster = LocalCluster(directory=tmp_path / "c", job_submit_lua=bad, nodes=1, gpus=1)
    with pytest.raises(InputError, match=r"job_submit.lua:2:"):
        cluster.up()
    assert cluster.daemons == []


def accounted(cluster, job_ids):
    """sacct's records of ``job_ids`` once all are there (slurmctld hands them over a moment later)."""
    deadline = time.monotonic() + 60
    while True:
        jobs = {j.job_id: j for j in cluster.accounting(job_ids)}
        if len(jobs) == len(job_ids) and all(j.state == "COMPLETED" and j.end_time for j in jobs.values()):
            return jobs
        assert time.monotonic() < deadline, f"sacct did not record the jobs: {jobs}"
        time.sleep(0.5)


def test_sacct_json_shows_pinned_and_multi_gpu_jobs_with_their_gpus(slurm_cluster_dbd):
    c = slurm_cluster_dbd
    pinned = c.sbatch(["-w", "n3", "--gres=gpu:g2:1"], SHOW_GPUS)
    pair = c.sbatch(["--gres=gpu:2"], SHOW_GPUS)
    assert set(c.wait_jobs([pinned, pair]).values()) == {"COMPLETED"}
    jobs = accounted(c, [pinned, pair])
    assert jobs[pinned].nodes == "n3" and jobs[pinned].gpu_indices() == (2,)
    assert jobs[pinned].gres_counts() == {"gpu": 1, "gpu:g2": 1}
    pair_gpus = jobs[pair].gpu_indices()
    assert len(pair_gpus) == 2 and jobs[pair].gres_counts()["gpu"] == 2
    assert c.job_output(pair).split()[1] == "job_gpus=" + ",".join(map(str, pair_gpus))


def test_sacct_json_shows_the_shard_pair_sharing_one_node_at_once(slurm_cluster_dbd, tmp_path):
    first, second = run_shard_pair_on_gpu_1(slurm_cluster_dbd, tmp_path)
    jobs = accounted(slurm_cluster_dbd, [first, second])
    for job in (first, second):
        assert jobs[job].gres_counts() == {"shard": 1} and jobs[job].nodes == "n2"
    # Accounting agrees they overlapped in time.
    assert jobs[first].start_time <= jobs[second].end_time and jobs[second].start_time <= jobs[first].end_time


@pytest.fixture
def cluster_dir():
    """A fresh directory under /tmp (munged needs every directory above its socket searchable,
    which pytest's tmp_path is not). A cluster a failed test left running there is stopped (by
    the PIDs in its state file) before the directory goes."""
    directory = Path(tempfile.mkdtemp(prefix="horus-test-"))
    os.chmod(directory, 0o755)
    yield directory / "cluster"
    if (directory / "cluster" / "cluster.json").exists():
        subprocess.run(HORUS + ["local-cluster", "down", "--dir", str(directory / "cluster")],
                       capture_output=True, timeout=120)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_cli_up_status_down_leaves_no_process_even_with_running_jobs(cluster_dir):
    directory = cluster_dir
    up = subprocess.run(HORUS + ["local-cluster", "up", "--dir", str(directory), "--nodes", "2", "--gpus", "2"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    conf = directory / "etc" / "slurm.conf"
    assert f"export SLURM_CONF={conf}" in up.stdout
    env_line = subprocess.run(HORUS + ["local-cluster", "env", "--dir", str(directory)],
                              capture_output=True, text=True, check=True).stdout.strip()
    state = json.loads((directory / "cluster.json").read_text())
    # horusd runs there: horus doctor, horus-sbatch and horus report need its site file too, horus
    # collect the receiver's URL; and a chroot's Slurm has its commands first on PATH
    bin_dir = slurm_install().bin_dir
    assert env_line == (f"export SLURM_CONF={conf} HORUS_CONFIG={directory / 'etc' / 'horus.conf'} "
                        f"HORUS_SHIP_TO=http://127.0.0.1:{state['ports']['receiver']}") + (
        f' PATH={bin_dir}:"$PATH"' if bin_dir else "")
    status = json.loads(subprocess.run(HORUS + ["local-cluster", "status", "--dir", str(directory), "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert status["running"] and [d["name"] for d in status["daemons"]] == [
        "munged", "slurmctld", "slurmd-n1", "slurmd-n2", "horusd",  # horusd by default (--no-horus: none)
        "munged-n1", "munged-n2", "receiver"]  # and the sample receiver, with one munged per node
    again = subprocess.run(HORUS + ["local-cluster", "up", "--dir", str(directory)], capture_output=True, text=True)
    assert again.returncode == 2 and "already running" in again.stderr
    cluster = LocalCluster.attach(directory)
    jobs = [cluster.sbatch(["-w", node, "--gres=gpu:1"], "#!/bin/sh\nsleep 300\n") for node in ("n1", "n2")]
    cluster.wait_jobs(jobs, states={"RUNNING"}, timeout=30)
    job_pids = procs.marked_processes(cluster.marker)
    daemon_pids = [d["pid"] for d in status["daemons"]]
    assert set(daemon_pids) < set(job_pids)  # slurmstepd and the jobs' sleep are there too
    down = subprocess.run(HORUS + ["local-cluster", "down", "--dir", str(directory)],
                          capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert [pid for pid in job_pids if procs.pid_alive(pid)] == []
    assert procs.marked_processes(cluster.marker) == []
    stopped = subprocess.run(HORUS + ["local-cluster", "status", "--dir", str(directory)],
                             capture_output=True, text=True)
    assert stopped.returncode == 1 and "not running" in stopped.stdout


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_port_clash_picks_another_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = LocalCluster(nodes=1, gpus=1, base_port=port)
        try:
            cluster.up()
            assert port not in [cluster.ports["slurmctld"], *cluster.ports["slurmd"]]
            assert cluster.run(["sinfo", "-h", "-o", "%T"]).stdout.split() == ["idle"]
        finally:
            assert cluster.down() == []


def started_with_a_stolen_port(monkeypatch, which, **options):
    """Start a 1 x 1 cluster whose first port draw hands the daemon at ``which`` (an index into the
    drawn ports) a port someone else holds; returns (cluster, draws), the cluster up and running."""
    real_pick = procs.pick_free_ports
    calls = []
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()

    def pick_with_a_stolen_port(count, start=None, avoid=()):
        ports = real_pick(count, start, avoid)
        if not calls:
            ports[which] = taken.getsockname()[1]
        calls.append(ports)
        return ports

    monkeypatch.setattr(procs, "pick_free_ports", pick_with_a_stolen_port)
    cluster = LocalCluster(nodes=1, gpus=1, **options)
    try:
        cluster.up()
    except BaseException:
        cluster.down()
        raise
    finally:
        taken.close()
    return cluster, calls


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_daemon_losing_a_port_race_restarts_the_cluster_on_fresh_ports(monkeypatch):
    cluster, calls = started_with_a_stolen_port(monkeypatch, 0)  # slurmctld's port
    try:
        assert len(calls) == 2 and cluster.ports["slurmctld"] == calls[1][0] != calls[0][0]
        assert cluster.run(["sinfo", "-h", "-o", "%T"]).stdout.split() == ["idle"]
    finally:
        assert cluster.down() == []


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_a_sample_receiver_losing_its_port_restarts_the_cluster_on_fresh_ports(monkeypatch):
    """Seen once in CI (24.11): ``horus receive`` could not listen on the port picked for it a moment
    earlier, and the cluster failed instead of starting again, as it does for a Slurm daemon."""
    cluster, calls = started_with_a_stolen_port(monkeypatch, -1, horus=True)  # the receiver's: the last
    try:
        assert len(calls) == 2 and cluster.ports["receiver"] == calls[1][-1] != calls[0][-1]
        assert cluster.ship_to.endswith(f":{calls[1][-1]}")
        assert cluster.run(["sinfo", "-h", "-o", "%T"]).stdout.split() == ["idle"]
    finally:
        assert cluster.down() == []


def test_ports_are_drawn_below_the_kernels_ephemeral_range(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert procs.port_range(ranges) == (20000, 32768)
    ranges.write_text("1024 65535\n")  # no room below it: the whole range, clashes survived by retries
    assert procs.port_range(ranges) == procs.PORT_RANGE
    assert procs.port_range(tmp_path / "missing") == procs.PORT_RANGE


def test_free_port_picker_skips_ports_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        chosen = procs.pick_free_ports(3, start=port)
    assert port not in chosen and len(set(chosen)) == 3 and all(p > port for p in chosen)


def test_missing_programs_are_named_with_their_packages(tmp_path):
    problems = prerequisite_problems(with_dbd=True, path=str(tmp_path), euid=0)
    assert len(problems) == 1
    text = problems[0]
    for item, package in [("munged", "munge"), ("slurmd", "slurmd"), ("sinfo", "slurm-client"),
                          ("slurmdbd", "slurmdbd"), ("mariadbd", "mariadb-server"), ("luac5.1", "lua5.1")]:
        assert f"{item} (package {package})" in text
    assert "apt-get install -y --no-install-recommends" in text


def test_missing_file_and_non_root_are_reported():
    problems = prerequisite_problems(requirements=CORE_REQUIREMENTS + [("/nonexistent/lib.so", "libfoo")],
                                     euid=1000)
    assert any("/nonexistent/lib.so (package libfoo)" in p for p in problems)
    assert any("run it as root" in p for p in problems)
    with pytest.raises(PrerequisiteError):
        check_prerequisites(euid=1000)


def test_cli_up_without_the_programs_says_what_is_missing(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))
    result = subprocess.run(HORUS + ["local-cluster", "up", "--dir", str(tmp_path / "c")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode != 0
    assert "munged (package munge)" in result.stderr and "apt-get install" in result.stderr
    assert not (tmp_path / "c").exists()


def test_run_slurm_failure_carries_the_commands_message(slurm_cluster):
    with pytest.raises(SlurmCommandError) as info:
        slurm_cluster.run(["scontrol", "show", "job", "999999"])
    assert info.value.returncode == 1
    assert str(info.value).startswith("scontrol failed (exit 1): ") and "Invalid job id" in str(info.value)


@pytest.mark.slurm  # starts its own daemons or needs the Slurm programs
def test_run_slurm_timeout_and_missing_program_are_clear_errors(tmp_path):
    # Without a readable slurm.conf a Slurm CLI retries for 60 s: the timeout must cut it short.
    with pytest.raises(SlurmCommandError, match="sinfo timed out after 1 s"):
        run_slurm(["sinfo"], slurm_conf=tmp_path / "missing.conf", timeout=1)
    with pytest.raises(SlurmCommandError, match="not found on PATH"):
        run_slurm(["no-such-slurm-command"])


@pytest.mark.slurm  # starts its own daemons
def test_horusd_runs_this_installation_whatever_the_current_directory_holds(tmp_path, monkeypatch):
    # `python -m slurm_horus` looks in the current directory first: a checkout of another version
    # there must not become the cluster's horusd
    other = tmp_path / "other-checkout" / "slurm_horus"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text("raise SystemExit('the copy in the current directory ran')\n")
    monkeypatch.chdir(other.parent)
    with LocalCluster(nodes=1, gpus=1, horus=True) as cluster:
        assert any(d["name"] == "horusd" for d in cluster.status()["daemons"])
