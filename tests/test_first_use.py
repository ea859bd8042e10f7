"""What a new user and a new admin hit first (issue 18), on a real local cluster with horusd.

One 2-node x 4-GPU cluster (binding ``shard``, policy ``horus``) for the module; the commands are
run as a user would run them: ``eval "$(horus local-cluster env)"``, then ``sbatch``,
``horus-sbatch`` and ``horus doctor`` from the shell.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import horusd_sees_now, local_cluster
from slurm_horus.service import protocol

pytestmark = pytest.mark.slurm

BIN = os.path.dirname(sys.executable)  # the venv's horus and horus-sbatch
FILLER = "#!/bin/sh\nsleep 300\n"


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster(nodes=2, gpus=4, horus=True)


@pytest.fixture
def clean(cluster):
    cluster.cancel_all_jobs()
    horusd_sees_now(cluster)  # horusd's state shows the empty queue
    yield cluster
    cluster.cancel_all_jobs()


def shell(cluster, command, extra_env=None, timeout=60):
    """``command`` in bash after ``eval "$(horus local-cluster env --dir D)"``, from a clean
    environment (no SLURM_CONF or HORUS_* of ours), with the venv's commands first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORUS_", "SLURM_"))}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.update(extra_env or {})
    script = f'eval "$(horus local-cluster env --dir {cluster.root})" && {command}'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(cluster.root / "jobs"))


def queue(cluster):
    return {job.job_id: job for job in cluster.queue()}


def wait_running(cluster, job_ids, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = cluster.job_states(job_ids)
        if all(states.get(j) == "RUNNING" for j in job_ids):
            return True
        time.sleep(0.2)
    return False


def held_gpus(cluster, job_id):
    """{(node, index)} a running job holds, whole GPUs and shards alike (squeue's gres_detail)."""
    job = queue(cluster)[job_id]
    return {(node, i) for node, items in job.gres_by_node() for item in items
            if item.name in ("gpu", "shard") and item.count > 0 for i in item.indices}


def submitted_id(result):
    assert result.returncode == 0, result.stderr
    return int(re.search(r"(\d+)", result.stdout.strip().splitlines()[-1]).group(1))


def slurmctld_lines(cluster, job_name):
    return [line for line in (cluster.root / "log" / "slurmctld.log").read_text().splitlines()
            if f"horus: job name={job_name} " in line]


# ---- item 4: the env line is all a user needs ------------------------------------------------------

def test_env_line_lets_doctor_and_horus_sbatch_find_horusd(clean):
    doctor = shell(clean, "horus doctor")
    assert "horusd socket not found" not in doctor.stdout and doctor.returncode == 0, doctor.stdout
    dry = shell(clean, "horus-sbatch --dry-run --gres=gpu:1 --horus-class resnet18-bs64 --wrap 'sleep 1'")
    assert dry.returncode == 0 and "no answer from horusd" not in dry.stderr, dry.stderr
    assert "--gres=shard:g" in dry.stdout


# ---- item 1: a GPU type the user asked for is kept -------------------------------------------------

def test_gpu_type_the_cluster_lacks_is_left_to_slurm(clean):
    # the cluster's GPUs are v100 (horus.conf gpu_type): a100 must not become "any two GPUs"
    result = shell(clean, "sbatch --gres=gpu:a100:2 -J want-a100 --wrap 'sleep 300'")
    assert result.returncode != 0, result.stdout  # Slurm refuses it, as it would without horus
    assert "sbatch: error: Batch job submission failed" in result.stderr
    lines = slurmctld_lines(clean, "want-a100")
    assert lines and "unchanged: " in lines[-1] and "a100" in lines[-1], lines
    dry = shell(clean, "horus-sbatch --dry-run --gres=gpu:a100:2 --wrap 'sleep 1'")
    assert "job left to Slurm" in dry.stdout and "a100" in dry.stdout, dry.stdout


def test_gpu_type_the_cluster_has_is_placed_among_gpus_of_that_type(clean):
    dry = shell(clean, "horus-sbatch --dry-run --gres=gpu:v100:1 --horus-class resnet18-bs64 --wrap 'sleep 1'")
    assert dry.returncode == 0 and "# decision " in dry.stdout, dry.stdout + dry.stderr


# ---- item 2: GPUs held by jobs horusd did not place -----------------------------------------------

def test_job_array_gpus_are_never_given_to_pinned_jobs(clean):
    # the array is left to Slurm; the two horus-sbatch jobs that follow at once must not be pinned
    # to the GPUs Slurm gives the array tasks (they would wait while the other node idles)
    array = shell(clean, "sbatch --parsable --array=0-1 --gres=gpu:1 --wrap 'sleep 300'")
    assert array.returncode == 0, array.stderr
    jobs = [submitted_id(shell(clean, "horus-sbatch --gres=gpu:1 --horus-class resnet18-bs64 --wrap 'sleep 300'"))
            for _ in range(2)]
    assert wait_running(clean, jobs, timeout=10), {j: queue(clean)[j].state_reason for j in jobs}
    deadline = time.monotonic() + 10
    while sum(j.state == "RUNNING" for j in clean.queue()) < 4:
        assert time.monotonic() < deadline, clean.queue()
        time.sleep(0.2)
    tasks = [j.job_id for j in clean.queue() if j.job_id not in jobs]
    taken = [held_gpus(clean, j) for j in tasks + jobs]
    assert all(a.isdisjoint(b) for i, a in enumerate(taken) for b in taken[i + 1:]), taken


def test_running_array_tasks_hold_their_gpus_in_horusds_state(clean):
    array = shell(clean, "sbatch --parsable --array=0-3 --gres=gpu:1 -w n1 --wrap 'sleep 300'")
    assert array.returncode == 0, array.stderr
    deadline = time.monotonic() + 30
    while sum(j.state == "RUNNING" for j in clean.queue()) < 4:
        assert time.monotonic() < deadline, clean.queue()
        time.sleep(0.2)
    horusd_sees_now(clean)
    for _ in range(3):
        dry = shell(clean, "horus-sbatch --dry-run --gres=gpu:1 --horus-class resnet18-bs64 --wrap 'sleep 1'")
        assert "--nodelist=n2 " in dry.stdout, dry.stdout  # every GPU of n1 is held by the array


# ---- item 3: --horus-off means never shared --------------------------------------------------------

@pytest.mark.parametrize("how, extra_env", [
    ("horus-sbatch --horus-off --comment=class=resnet18-bs64", None),
    ("sbatch --comment=class=resnet18-bs64", {"HORUS_OFF": "1"}),
    ("sbatch --comment='class=resnet18-bs64 horus=off'", None),
])
def test_opted_out_job_is_left_to_slurm_and_never_shared(clean, how, extra_env):
    name = f"off{abs(hash(how)) % 10000}"
    job = submitted_id(shell(clean, f"{how} -J {name} --gres=gpu:1 --wrap 'sleep 300'", extra_env))
    assert wait_running(clean, [job])
    assert "horus:" not in (queue(clean)[job].admin_comment or "")
    assert queue(clean)[job].gres_requested[0].name == "gpu"  # a whole GPU, no shard
    assert "skip: opted out" in slurmctld_lines(clean, name)[-1]


def test_horusd_leaves_an_opted_out_request_unchanged(cluster):
    for request in ({"hints": {"HORUS_OFF": "1"}}, {"comment": "class=resnet18-bs64 horus=off"}):
        reply = protocol.ask(dict({"op": "place", "gpus_per_node": 1, "num_nodes": 1, "dry_run": True,
                                   "job_class": "resnet18-bs64"}, **request), cluster.horus_socket, timeout_s=5)
        assert reply["action"] == "unchanged" and "opted out" in reply["reason"], reply


# ---- item 5: class names --------------------------------------------------------------------------

@pytest.mark.parametrize("options, says", [
    ("--horus-class 'bad class;x'", "--horus-class"),
    ("--horus-model resnet50 --horus-batch-size abc", "--horus-batch-size"),
    ("--horus-batch-size 0 --horus-model resnet50", "--horus-batch-size"),
    ("--horus-model 'res net'", "--horus-model"),
])
def test_bad_class_options_are_one_line_errors_and_submit_nothing(clean, options, says):
    result = shell(clean, f"horus-sbatch {options} -J badopt --gres=gpu:1 --wrap 'sleep 1'")
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("horus-sbatch: ") and says in lines[0], result.stderr
    assert [job for job in clean.queue() if job.name == "badopt"] == []


def test_unknown_class_gets_close_matches_and_a_gpu_of_its_own(clean):
    dry = shell(clean, "horus-sbatch --dry-run --horus-class resnet5-bs64 --gres=gpu:1 --wrap 'sleep 1'")
    assert dry.returncode == 0
    assert "unknown job class 'resnet5-bs64'" in dry.stderr and "resnet50-bs64" in dry.stderr, dry.stderr
    assert "--gres=gpu:g" in dry.stdout  # exclusive: a whole GPU, not a shareable shard


# ---- item 8: --explain -----------------------------------------------------------------------------

def test_explain_shows_real_scores_and_how_many_gpus_it_lists(clean):
    dry = shell(clean, "horus-sbatch --dry-run --explain --horus-class resnet18-bs64 --gres=gpu:1 --wrap 'sleep 1'")
    assert dry.returncode == 0
    assert "1000000000" not in dry.stdout
    assert re.search(r"candidates considered: \d+ of 8 GPUs", dry.stdout), dry.stdout
    assert "why: " in dry.stdout and "exclusive" not in dry.stdout.split("why: ")[1].splitlines()[0]
    assert "shard" in dry.stdout.split("why: ")[1].splitlines()[0]


def test_explain_fills_the_worst_corunner_column(clean):
    fillers = [clean.sbatch(["--gres=gpu:1", "-J", "filler"], FILLER) for _ in range(7)]
    assert wait_running(clean, fillers)
    first = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
    assert wait_running(clean, [first])
    horusd_sees_now(clean)
    dry = shell(clean, "horus-sbatch --dry-run --explain --horus-class resnet18-bs64 --gres=gpu:1 --wrap 'sleep 1'")
    rows = [line for line in dry.stdout.splitlines() if "with resnet18-bs32" in line]
    assert rows, dry.stdout
    assert re.search(r"\s\d\.\d\d\s+\d\.\d\d\s", rows[0]), rows[0]  # job slowdown and co-runner slowdown
