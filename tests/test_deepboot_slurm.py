"""DeepBoot on real Slurm: a training job borrows an idle inference GPU, is requeued when inference
needs it back, and then completes (hpc_configs/slurm.conf.deepboot on the local cluster)."""

import time

import pytest

from slurm_horus.localcluster import LocalCluster, prerequisite_problems

pytestmark = pytest.mark.slurm

PARTITIONS = [
    "PartitionName=train Nodes=n1 Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
    "PartitionName=infer Nodes=n2 MaxTime=INFINITE State=UP PriorityTier=10",
    "PartitionName=infer-lend Nodes=n2 MaxTime=INFINITE State=UP PriorityTier=1",
]
PREEMPTION = ["PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE"]


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


def squeue_rows(cluster, job_ids):
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)), "-o", "%i %P %T %N"]).stdout
    return {int(f[0]): f[1:] for f in (line.split() for line in out.splitlines())}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_training_borrows_an_idle_inference_gpu_is_requeued_and_completes(deepboot_cluster):
    cluster = deepboot_cluster
    runs = cluster.root / "jobs" / "borrower.runs"
    busy = [cluster.sbatch(["-p", "train", "--gres=gpu:1", "--comment=class=resnet50-bs64"],
                           "#!/bin/sh\nsleep 300\n") for _ in range(2)]
    wait_for(lambda: all(r[1] == "RUNNING" for r in squeue_rows(cluster, busy).values()), 30, "train full")
    time.sleep(1.5)  # horusd sees the training partition full
    borrower = cluster.sbatch(["-p", "train,infer-lend", "--requeue", "--gres=gpu:1",
                               "--comment=class=resnet50-bs64"], f"#!/bin/sh\necho run >> {runs}\nsleep 6\n")
    row = wait_for(lambda: squeue_rows(cluster, [borrower]).get(borrower, [None, None])[1] == "RUNNING"
                   and squeue_rows(cluster, [borrower])[borrower], 30, "the borrower to start")
    assert row[0] == "infer-lend" and row[2] == "n2"  # horusd lent it the inference node
    inference = [cluster.sbatch(["-p", "infer", "--gres=gpu:1", "--comment=class=lm-bs20"], "#!/bin/sh\nsleep 4\n")
                 for _ in range(2)]
    wait_for(lambda: all(r[1] == "RUNNING" for r in squeue_rows(cluster, inference).values()), 30,
             "both inference jobs to run (one on the reclaimed GPU)")
    log = (cluster.root / "log" / "slurmctld.log").read_text()
    assert f"preempted JobId={borrower} has been requeued" in log
    wait_for(lambda: squeue_rows(cluster, [borrower]).get(borrower, [None, None])[1] == "COMPLETED", 90,
             "the borrower to complete after its requeue")
    assert runs.read_text().count("run") == 2  # started twice: lent, reclaimed, then finished
    cluster.run(["scancel", *map(str, busy)])
