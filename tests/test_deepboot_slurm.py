"""DeepBoot on real Slurm (hpc_configs/slurm.conf.deepboot on the local cluster): a training job
borrows idle inference GPUs, an inference burst takes them back within seconds through Slurm's
preemption, and the borrower checkpoints, is requeued and resumes (hpc_configs/deepboot-train-example.sh);
the borrower Slurm preempts is the one horusd's reclaim chose (the scheduling cycle's, as in the simulator);
a multi-node borrower can instead shrink itself off the inference node without a restart."""

import re
import sys
import time
from pathlib import Path

import pytest

from slurm_horus.localcluster import LocalCluster, prerequisite_problems
from slurm_horus.localcluster.files import deepboot_conf

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parent.parent / "hpc_configs" / "deepboot-train-example.sh"
SHRINKABLE = EXAMPLE.with_name("deepboot-shrinkable-example.sh")
GRACE_S = 10
PARTITIONS, PREEMPTION = deepboot_conf("n1", "n2", GRACE_S)


@pytest.fixture(scope="module")
def deepboot_cluster():
    problems = prerequisite_problems(with_dbd=False)
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    cluster = LocalCluster(nodes=2, gpus=2, horus=True, partitions=PARTITIONS, extra_conf=PREEMPTION,
                           cred_expire=5, horus_settings={"binding": "indexed", "policy": "deepboot"}).up()
    try:
        yield cluster
    finally:
        assert not cluster.down()


def requeue_line(cluster):
    """What the example prints when it is preempted: before 24.11 it requeues itself, from 24.11 on
    Slurm requeues it (hpc_configs/deepboot-train-example.sh)."""
    version = cluster.slurm_version()
    return "requeued itself" if (version.major, version.minor) < (24, 11) else "preempted: Slurm requeues it"


def squeue_rows(cluster, job_ids):
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)), "-o", "%i %P %T %N"]).stdout
    return {int(f[0]): f[1:] for f in (line.split() for line in out.splitlines())}


def state_of(cluster, job_id):
    return squeue_rows(cluster, [job_id]).get(job_id, [None, None])[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_horusd_lends_an_inference_gpu_a_burst_takes_it_back_within_seconds_and_the_borrower_resumes(
        deepboot_cluster):
    cluster = deepboot_cluster
    steps = 150
    busy = [cluster.sbatch(["-p", "train", "--gres=gpu:1", "--comment=class=resnet50-bs64"],
                           "#!/bin/sh\nsleep 300\n") for _ in range(2)]
    try:
        wait_for(lambda: all(r[1] == "RUNNING" for r in squeue_rows(cluster, busy).values()), 30, "train full")
        time.sleep(1.5)  # horusd sees the training partition full
        borrower = cluster.sbatch(["-p", "train,infer-lend", "--requeue", "--open-mode=append", "--gres=gpu:1",
                                   "--comment=class=resnet50-bs64", f"--export=ALL,STEPS={steps},STEP_S=0.1"],
                                  EXAMPLE.read_text())
        row = wait_for(lambda: state_of(cluster, borrower) == "RUNNING" and squeue_rows(cluster, [borrower])[borrower],
                       30, "the borrower to start")
        assert row[0] == "infer-lend" and row[2] == "n2"  # horusd lent it an inference GPU
        ckpt = cluster.root / "jobs" / f"ckpt-{borrower}"
        wait_for(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 10, 60, "the borrower to make progress")
        submitted = time.monotonic()
        burst = [cluster.sbatch(["-p", "infer", "--gres=gpu:1", "--comment=class=lm-bs20"], "#!/bin/sh\nsleep 3\n")
                 for _ in range(2)]
        wait_for(lambda: all(r[1] == "RUNNING" for r in squeue_rows(cluster, burst).values()), 30,
                 "both inference jobs to run at once (one on the reclaimed GPU)")
        reclaim_s = time.monotonic() - submitted
        assert reclaim_s < 10, f"the burst waited {reclaim_s:.1f} s for its GPUs"
        assert f"Requeuing JobId={borrower}" in (cluster.root / "log" / "slurmctld.log").read_text()
        # the victim was horusd's reclaim decision (the scheduling cycle's, as in the simulator): the
        # inference job was pinned to the borrower's GPU and Slurm preempted that job
        assert re.search(rf"horus: reclaim: partition infer takes the GPUs of {borrower}\b",
                         (cluster.root / "log" / "horusd.log").read_text())
        wait_for(lambda: state_of(cluster, borrower) == "COMPLETED", 120, "the borrower to resume and complete")
        out = cluster.job_output(borrower)
        saved = [int(s) for s in re.findall(r"checkpoint step=(\d+)", out)]
        starts = [int(s) for s in re.findall(r"start run=\d+ step=(\d+)", out)]
        assert len(saved) == 1 and out.count(requeue_line(cluster)) == 1, out
        assert starts == [0, saved[0]] and 10 <= saved[0] < steps, out  # resumed where it stopped: no step lost
        assert f"done step={steps}" in out, out
        states = {j: r[1] for j, r in squeue_rows(cluster, busy + burst).items()}
        assert [states[j] for j in busy] == ["RUNNING", "RUNNING"] and [states[j] for j in burst] == ["COMPLETED"] * 2
    finally:  # the next tests of the module need the training partition back, whatever happened here
        cluster.run(["scancel", *map(str, busy)])
        wait_for(lambda: all(r[1] != "RUNNING" for r in squeue_rows(cluster, busy).values()), 30, "train empty")


def test_a_multi_node_borrower_shrinks_itself_off_the_inference_node_without_a_restart(deepboot_cluster):
    """Slurm shrinks a running job (scontrol update NumNodes): the node is free at once and the job goes
    on with the rest, which is DeepBoot's reclaim by shrinking at node granularity. Asked with a signal,
    the example shrinks itself between two steps (a shrink that releases a node where a step runs aborts
    slurmctld 24.11.5 and 26.05.5: hpc_configs/deepboot-shrinkable-example.sh)."""
    cluster = deepboot_cluster
    job = cluster.sbatch(["-p", "train-lend", "-N2", "--gres=gpu:2", "--comment=class=resnet50-bs64",
                          "--export=ALL,EPOCHS=30,EPOCH_S=0.3"], SHRINKABLE.read_text())
    wait_for(lambda: state_of(cluster, job) == "RUNNING", 30, "the two-node job to start")
    # its first step runs on both nodes (on a loaded machine srun may take seconds to get there)
    out_file = cluster.root / "jobs" / f"slurm-{job}.out"
    wait_for(lambda: out_file.exists() and "epoch 0 on n[1-2]" in out_file.read_text(), 30,
             "the first epoch on both nodes")
    asked = time.monotonic()
    cluster.run(["scancel", "--batch", "--signal=USR1", str(job)])
    wait_for(lambda: squeue_rows(cluster, [job])[job][2] == "n1", 30, "the job to shrink itself to n1")
    shrink_s = time.monotonic() - asked
    submitted = time.monotonic()
    inference = cluster.sbatch(["-p", "infer", "--gres=gpu:2", "--comment=class=lm-bs20"], "#!/bin/sh\nsleep 1\n")
    wait_for(lambda: state_of(cluster, inference) in ("RUNNING", "COMPLETED"), 30, "inference on the freed node")
    assert time.monotonic() - submitted < 10 and shrink_s < 10, shrink_s
    wait_for(lambda: state_of(cluster, job) == "COMPLETED", 120, "the shrunk job to complete")
    out = cluster.job_output(job)
    assert "epoch 0 on n[1-2]" in out and "shrank itself to 1 node(s)" in out, out
    assert "epoch 29 on n1" in out and "done epochs=30" in out and "failed" not in out, out
    assert out.count("epoch 0 on") == 1, out  # it went on: no restart


def test_doctor_checks_the_deepboot_partitions(deepboot_cluster, tmp_path):
    import subprocess

    def doctor(conf):
        env = dict(deepboot_cluster.env, HORUS_CONFIG=str(deepboot_cluster.horus_config))
        return subprocess.run([sys.executable, "-m", "slurm_horus", "doctor", "--slurm-conf", str(conf)],
                              env=env, capture_output=True, text=True, timeout=60).stdout

    good = doctor(deepboot_cluster.slurm_conf)
    assert "Preempt" not in good and "PriorityTier" not in good and "GraceTime" not in good, good
    broken = tmp_path / "etc"
    broken.mkdir()
    for name in ("gres.conf", "job_submit.lua"):
        (broken / name).write_text((deepboot_cluster.slurm_conf.parent / name).read_text())
    text = deepboot_cluster.slurm_conf.read_text()
    (broken / "slurm.conf").write_text(text.replace("PreemptType=preempt/partition_prio", "")
                                       .replace(f"PreemptMode=REQUEUE GraceTime={GRACE_S}", "PreemptMode=CANCEL"))
    bad = doctor(broken / "slurm.conf")
    for expected in ("PreemptType=preempt/none", "partition infer-lend: PreemptMode=CANCEL", "no GraceTime"):
        assert expected in bad, bad


def test_slurm_preempts_the_borrower_horusd_reclaims_not_its_own_pick(deepboot_cluster):
    """Two borrowers on the inference node, the older one at a lower job priority: Slurm on its own
    preempts that one (lowest priority first; bench/bench_deepboot_slurm.py measures it). horusd
    reclaims through the scheduling cycle's step (DeepBoot: the most recently started borrower) and
    pins the inference job to its GPU: Slurm preempts exactly that job, which requeues itself."""
    cluster = deepboot_cluster
    borrowers = []
    for nice in (100, 0):
        borrowers.append(cluster.sbatch(["-p", "infer-lend", "--requeue", "--open-mode=append", "--gres=gpu:1",
                                         f"--nice={nice}", "--comment=class=resnet50-bs64",
                                         "--export=ALL,STEPS=600,STEP_S=0.1"], EXAMPLE.read_text()))
        wait_for(lambda: state_of(cluster, borrowers[-1]) == "RUNNING", 30, "a borrower to start")
        time.sleep(1.5)  # distinct start times (Slurm's are in seconds)
    older, younger = borrowers
    # how fast is the first test's and the benchmark's business; this one is about which job goes
    inference = cluster.sbatch(["-p", "infer", "--gres=gpu:1", "--comment=class=lm-bs20"], "#!/bin/sh\nsleep 1\n")
    wait_for(lambda: state_of(cluster, inference) in ("RUNNING", "COMPLETED"), 30, "the inference job")
    assert re.search(rf"horus: reclaim: partition infer takes the GPUs of {younger}\b",
                     (cluster.root / "log" / "horusd.log").read_text())
    try:
        wait_for(lambda: requeue_line(cluster) in cluster.job_output(younger), 60, "the younger borrower to be requeued")
    except AssertionError:
        raise AssertionError((squeue_rows(cluster, [*borrowers, inference]), cluster.job_output(younger),
                              (cluster.root / "log" / "slurmctld.log").read_text()[-2500:])) from None
    assert state_of(cluster, older) == "RUNNING" and "checkpoint step=" not in cluster.job_output(older)
    cluster.run(["scancel", str(older), str(younger)])
    wait_for(lambda: all(state_of(cluster, b) not in ("RUNNING", "PENDING", "COMPLETING") for b in borrowers), 30,
             "the borrowers to end")
