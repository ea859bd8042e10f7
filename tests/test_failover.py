"""Failover on one machine: a primary and a backup slurmctld (the backup in network and UTS namespaces
of its own, see localcluster/backup.py), a horusd beside each. The primary stops; the backup takes
over; the horusd beside it rebuilds its state from squeue and answers, the other one stands by."""

import time

import pytest

from slurm_horus.errors import InputError
from slurm_horus.localcluster import LocalCluster
from slurm_horus.localcluster.backup import BACKUP_HOST, primary_host
from slurm_horus.localcluster.chroot import slurm_install
from slurm_horus.service import protocol
from slurm_horus.store.db import open_db
from slurm_horus.tokens import parse_horus_tokens

pytestmark = pytest.mark.slurm


def _ping(path):
    return protocol.ask({"op": "ping"}, path, timeout_s=2.0)


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _placed(cluster, job_id):
    """(decision id, gpus token) of the horus: token slurmctld's job_submit.lua put on the job."""
    [job] = [j for j in cluster.queue() if j.job_id == job_id]
    decision, fields = parse_horus_tokens(job.admin_comment)
    return decision, fields.get("gpus"), job


def _namespaces_allowed():
    import subprocess

    try:
        done = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True,
                              timeout=30)
    except OSError as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.strip()


def test_the_horusd_beside_the_controller_in_control_answers_after_a_failover():
    refused = _namespaces_allowed()
    if refused:  # a property of the machine (e.g. an unprivileged container), not a missing package
        pytest.skip(f"this machine allows no network namespaces ({refused}); the one-machine backup "
                    "controller needs them")
    if slurm_install().root is not None:  # make test-slurm-newer
        pytest.skip("the one-machine backup controller runs the system's Slurm only (see the test below)")
    cluster = LocalCluster(nodes=2, gpus=2, horus=True, backup_controller=True,
                           horus_settings={"binding": "indexed"})  # see test_a_shard_binding_places_nothing...
    cluster.up()
    try:
        primary, backup = _ping(cluster.horus_socket), _ping(cluster.backup_horus_socket)
        assert primary["active"] and primary["in_control"] == primary_host()
        assert not backup["active"] and backup["controller"] == BACKUP_HOST
        assert protocol.ask({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"},
                            cluster.backup_horus_socket, timeout_s=2.0)["reason"].startswith("standby")

        first = cluster.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs32"], "#!/bin/sh\nsleep 300\n")
        cluster.wait_jobs([first], states={"RUNNING"}, timeout=60)
        first_decision, first_gpus, _ = _placed(cluster, first)
        assert first_decision, "the primary's job_submit.lua and horusd placed the first job"

        took = cluster.fail_over()
        assert took < 45
        _wait(lambda: _ping(cluster.backup_horus_socket)["active"], 30, "the backup horusd to take over")
        _wait(lambda: not _ping(cluster.horus_socket)["active"], 30, "the primary horusd to stand by")
        # the first job is in the backup horusd's state: rebuilt from squeue (once the new controller answers)
        _wait(lambda: _ping(cluster.backup_horus_socket)["jobs"] == 1, 30, "the state rebuilt from squeue")
        assert _ping(cluster.backup_horus_socket)["in_control"] == BACKUP_HOST
        assert "state rebuilt from squeue (1 jobs, 0 kept)" in (cluster.layout.log / "horusd-backup.log").read_text()
        assert "standby" in (cluster.layout.log / "horusd.log").read_text()

        # the backup slurmctld's job_submit.lua asks the backup horusd, which knows where the first job is
        second = cluster.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs64"], "#!/bin/sh\nsleep 300\n")
        cluster.wait_jobs([second], states={"RUNNING"}, timeout=60)
        second_decision, second_gpus, job = _placed(cluster, second)
        assert second_decision and second_decision != first_decision
        assert second_gpus != first_gpus and job.gpu_indices()

        # one writer at a time: each decision was recorded by the horusd that made it
        db = open_db(cluster.root / "horus.db")
        _wait(lambda: {first_decision, second_decision} <= {
            row[0] for row in db.execute("SELECT decision_id FROM decisions")}, 30, "both decisions in the db")
    finally:
        assert not cluster.down()


def test_a_chroot_slurm_refuses_a_backup_controller():
    """The backup runs the host's slurmctld in its namespaces: a chroot cluster says so and starts nothing."""
    with pytest.raises(InputError, match="system's Slurm only, not Slurm 24.11"):
        LocalCluster(nodes=1, gpus=1, slurm="24.11", backup_controller=True)
