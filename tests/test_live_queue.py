"""horusd's queue on the real local cluster: kept jobs, started where the shared cycle places them,
and started by Slurm itself when horusd is killed or switched off.

One 2-node x 4-GPU cluster with horusd (binding shard, policy horus) and a short lease (8 s) so that
fail-open is quick to watch. The acceptance run with the site defaults (32-job burst, a kill with 16
waiting) is bench/bench_live_queue.py.
"""

import os
import random
import re
import signal
import time

import pytest

import conftest
from slurm_horus.localcluster import horus as horus_local
from slurm_horus.localcluster import poll as wait_until
from slurm_horus.service import protocol
from slurm_horus.tokens import parse_gpu_list, parse_horus_tokens

pytestmark = pytest.mark.slurm

LEASE_S = 8
REPORT = "#!/bin/sh\necho GDO=$GPU_DEVICE_ORDINAL JOB_GPUS=$SLURM_JOB_GPUS\nsleep {seconds}\n"


@pytest.fixture(scope="module")
def cluster():
    yield from conftest.horus_cluster(lease_s=LEASE_S, cycle_s=1)


def horusd_refreshed(cluster, timeout=30):
    """Wait until horusd holds a view of the cluster read after now (its ping's state_age_s counts from
    the start of the read), however late its refreshes run on a loaded machine."""
    since = time.monotonic()

    def fresh():
        reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=5)  # None: busy, ask again
        return reply is not None and reply["state_age_s"] < time.monotonic() - since - 0.05

    assert wait_until(fresh, timeout), f"horusd read no state within {timeout} s"


@pytest.fixture
def clean(cluster):
    cluster.cancel_all_jobs()
    horusd_refreshed(cluster)  # horusd sees the empty queue
    yield cluster
    cluster.cancel_all_jobs()


def tokens(cluster):
    """{job id: (state, token fields)} of the queue."""
    return {j.job_id: (j.state, parse_horus_tokens(j.admin_comment)[1]) for j in cluster.queue()}


def fill(cluster):
    """Two jobs of unknown class hold all 8 GPUs (horusd places them at submission)."""
    blockers = [cluster.sbatch(["--gres=gpu:4", "-J", "blocker"], "#!/bin/sh\nsleep 600\n") for _ in range(2)]
    cluster.wait_jobs(blockers, timeout=60, states=("RUNNING",))
    horusd_refreshed(cluster)  # horusd sees them running
    return blockers


def kept_now(cluster, job_ids):
    return all(tokens(cluster).get(j, (None, {}))[1].get("mode") == "kept" for j in job_ids)


def submit(cluster, job_class, seconds=5, gres="--gres=gpu:1", extra=()):
    args = [gres, *extra] + ([f"--comment=class={job_class}"] if job_class else [])
    return cluster.sbatch(args, REPORT.format(seconds=seconds))


def horusd_pid(cluster):
    return next(d["pid"] for d in cluster.status()["daemons"] if d["name"] == "horusd")


def kill_horusd(cluster):
    os.kill(horusd_pid(cluster), signal.SIGKILL)
    cluster.daemons = [d for d in cluster.daemons if d["name"] != "horusd"]


def restart_horusd(cluster):
    horus_local.start_horusd(cluster, 60)
    cluster._write_state()


def ran_where_token_says(cluster, job_id):
    _state, fields = tokens(cluster)[job_id]
    (node, indices), = parse_gpu_list(fields["gpus"])
    out = cluster.job_output(job_id)
    return (next(j.nodes for j in cluster.queue() if j.job_id == job_id) == node
            and f"GDO={','.join(str(i) for i in indices)} " in out)


def test_a_burst_waits_in_horusds_queue_and_starts_where_the_cycle_places_it(clean):
    classes = ["resnet18-bs32", "resnet18-bs64", "lm-bs20", "a3c", "recommendation-bs2048", "cyclegan"]
    jobs = [submit(clean, classes[i % len(classes)], seconds=4 + i % 3) for i in range(20)]
    clean.wait_jobs(jobs, timeout=180)
    log = (clean.root / "log" / "horusd.log").read_text()
    started_from_queue = {int(j) for j in re.findall(r"decision job=(\d+) .*action=start", log)}
    assert started_from_queue & set(jobs)  # some waited in the queue
    for job in jobs:
        state, fields = tokens(clean)[job]
        assert state == "COMPLETED" and fields.get("gpus") and fields["mode"] != "kept", (job, fields)
        assert ran_where_token_says(clean, job), (job, fields, clean.job_output(job))


def test_whole_gpus_are_kept_untyped_and_started_on_exactly_the_gpus_horusd_chose(clean):
    blockers = fill(clean)
    job = submit(clean, None, seconds=3, gres="--gres=gpu:2")  # unknown class: whole GPUs
    assert wait_until(lambda: kept_now(clean, [job]), 30)
    kept_as = next(j for j in clean.queue() if j.job_id == job).tres_per_node
    assert kept_as == f"{clean.slurm_version().gres_prefix}gpu:2"  # gres/gpu:2 on 24.11+
    clean.run(["scancel"] + [str(b) for b in blockers])
    clean.wait_jobs([job], timeout=60)
    _state, fields = tokens(clean)[job]
    (node, indices), = parse_gpu_list(fields["gpus"])
    assert fields["mode"] == "exclusive" and len(indices) == 2
    assert f"JOB_GPUS={','.join(str(i) for i in indices)}" in clean.job_output(job)  # those two, no other


def test_a_killed_horusd_lets_slurm_start_every_kept_job_within_the_lease(clean):
    blockers = fill(clean)
    kept = [submit(clean, "lm-bs20", seconds=2) for _ in range(3)]
    assert wait_until(lambda: kept_now(clean, kept), 30)
    kill_horusd(clean)
    try:
        killed = time.monotonic()
        clean.run(["scancel"] + [str(b) for b in blockers])
        states = clean.wait_jobs(kept, timeout=LEASE_S + 40)
        assert set(states.values()) == {"COMPLETED"}
        assert time.monotonic() - killed < LEASE_S + 40
        # nobody placed them: Slurm started them as they were kept (any GPU, one shard each)
        assert all(tokens(clean)[j][1]["mode"] == "kept" and "GDO=" in clean.job_output(j) for j in kept)
    finally:
        restart_horusd(clean)


def test_a_restarted_horusd_finds_its_queue_and_places_it(clean):
    blockers = fill(clean)
    kept = [submit(clean, c, seconds=2) for c in ("resnet18-bs32", "resnet18-bs64")]
    assert wait_until(lambda: kept_now(clean, kept), 30)
    kill_horusd(clean)
    restart_horusd(clean)  # well within the lease: the new horusd renews it and places the jobs
    reply = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
    assert reply["queue"]["kept"] == 2 and reply["lease_s"] == LEASE_S
    clean.run(["scancel"] + [str(b) for b in blockers])
    clean.wait_jobs(kept, timeout=60)
    for job in kept:
        assert tokens(clean)[job][1]["mode"] in ("shared", "shareable") and ran_where_token_says(clean, job)


def test_horusd_estimates_run_times_from_its_history_store(clean):
    """The duration estimator on the real daemon: horusd reads the finished jobs of its history store
    (what ``horus ingest`` writes there; inserted here) when it (re)starts, and the jobs its cycle starts
    carry the estimate (the user's median run of that class, capped by the limit), not the limit."""
    from slurm_horus.config import load_config
    from slurm_horus.store.db import open_db

    blockers = fill(clean)
    kept = {cls: submit(clean, cls, seconds=2, extra=["-t", "10"]) for cls in ("resnet18-bs32", "lm-bs20")}
    assert wait_until(lambda: kept_now(clean, list(kept.values())), 30)
    user = next(j.user for j in clean.queue() if j.job_id == kept["lm-bs20"])
    db = open_db(load_config(path=str(clean.horus_config), environ={}).db)
    runs = [("resnet18-bs32", 30), ("resnet18-bs32", 40), ("resnet18-bs32", 50), ("lm-bs20", 900), ("lm-bs20", 1500)]
    db["jobs"].insert_all([{"cluster": "history", "job_id": 9000 + k, "user": user, "job_class": cls, "state": "COMPLETED",
                            "elapsed_s": run, "end_time": 1000 + k, "n_gpus": 0, "shards": 1}
                           for k, (cls, run) in enumerate(runs)], replace=True)
    # horusd feeds its estimator at start, every 5 minutes, and when it reloads
    assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60) == {"ok": True, "reloaded": True}
    pong = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
    assert pong["duration_history_jobs"] >= len(runs)
    assert set(pong["duration_order"].split(" > ")) == {"user+class", "class", "user", "site"}
    clean.run(["scancel"] + [str(b) for b in blockers])
    clean.wait_jobs(list(kept.values()), timeout=60)
    log = (clean.root / "log" / "horusd.log").read_text()
    expected = {int(j): float(s) for j, s in re.findall(r"decision job=(\d+) .*action=start .*expected_s=(\d+)", log)}
    # resnet18: the median of 30, 40, 50; lm-bs20: the median of 900 and 1500, capped by its 10 minutes
    assert expected.get(kept["resnet18-bs32"]) == 40 and expected.get(kept["lm-bs20"]) == 600, (kept, [line for line in log.splitlines() if "decision" in line or "duration" in line][-12:])

    # duration_levels = measured (the site file, read again at reload): on a history where the user
    # sets the run time and the class says nothing, horusd tries the user's history before the class's
    rng = random.Random(3)
    noisy = []
    for k in range(300):
        who, cls = rng.randrange(4), rng.randrange(6)
        noisy.append({"cluster": "history", "job_id": 9100 + k, "user": f"hist{who}", "job_class": f"c{cls}",
                      "state": "COMPLETED", "elapsed_s": round(100 * 3 ** who * rng.lognormvariate(0, 0.3)),
                      "end_time": 2000 + k, "n_gpus": 1, "shards": 0})
    db["jobs"].insert_all(noisy, replace=True)
    site_file = clean.horus_config.read_text()
    try:
        clean.horus_config.write_text(site_file + "\nduration_levels = measured\n")
        assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60)["reloaded"]
        pong = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
        order = pong["duration_order"].split(" > ")
        assert order.index("user") < order.index("class"), order  # (fixed: class before user)
        # a pair measured here (as the feed stores one) counts as measured after the next rebuild
        db["observations"].insert({"cluster": "history", "job_id": 9999, "corunner_job_id": 9998,
                                   "gpu_type": "v100", "job_class": "c1", "corunner_class": "c2",
                                   "norm_tput": 0.7})
        assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60)["reloaded"]
        after = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
        assert after["pairs_measured"] == pong["pairs_measured"] + 1 and after["reloads"] == pong["reloads"] + 1
        # a site file halfway through an edit: the reload says why, and the running policy stays
        clean.horus_config.write_text(site_file + "\npolicy = no-such-policy\n")
        assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60) is None  # (not ok)
        still = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
        assert still["reloads"] == after["reloads"] and still["policy"] == after["policy"]
        warned = [line for line in (clean.root / "log" / "horusd.log").read_text().splitlines()
                  if "reload failed, the running config and policy stay" in line]
        assert len(warned) == 1 and "no-such-policy" in warned[0] and "Traceback" not in warned[0]
    finally:
        clean.horus_config.write_text(site_file)
        db["jobs"].delete_where("cluster = ?", ["history"])
        db["observations"].delete_where("cluster = ?", ["history"])
        assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60)["reloaded"]
    pong = protocol.ask({"op": "ping"}, clean.horus_socket, timeout_s=2)
    assert pong["duration_order"] == "user+class > class > user > site"


def test_the_kill_switch_lets_every_kept_job_go_at_once(clean):
    blockers = fill(clean)
    kept = [submit(clean, "a3c", seconds=2) for _ in range(2)]
    assert wait_until(lambda: kept_now(clean, kept), 30)
    disable = clean.root / "etc" / "horus.disabled"
    disable.write_text("")
    try:
        # released at once (horusd renews the lease every LEASE_S / 2: it had at least 4 s to run)
        assert wait_until(lambda: all(j.state_reason != "BeginTime" for j in clean.queue() if j.job_id in kept), 3)
        clean.run(["scancel"] + [str(b) for b in blockers])
        assert set(clean.wait_jobs(kept, timeout=40).values()) == {"COMPLETED"}
    finally:
        disable.unlink()


def test_jobs_horus_cannot_place_right_are_left_alone(clean):
    first = submit(clean, "lm-bs20", seconds=30)
    left = {
        "dependency": submit(clean, "lm-bs20", extra=[f"--dependency=afterany:{first}"]),
        "begin time set by the user": submit(clean, "lm-bs20", extra=["--begin=now+600"]),
        # a GPU index the user names (a model type, e.g. gpu:v100:1, is kept and placed:
        # test_first_use.py)
        "already pinned to a gpu index": submit(clean, "lm-bs20", gres="--gres=gpu:g1:1"),
    }
    log_file = clean.root / "log" / "slurmctld.log"
    wait_until(lambda: all(f"skip: {reason}" in log_file.read_text() for reason in left), 30)
    log = log_file.read_text()
    for reason, job in left.items():
        assert f"skip: {reason}" in log
        assert "horus:" not in next(j.admin_comment for j in clean.queue() if j.job_id == job)


def test_doctor_shows_the_queue(clean):
    import subprocess
    import sys

    blockers = fill(clean)
    kept = [submit(clean, "lm-bs20") for _ in range(2)]
    assert wait_until(lambda: kept_now(clean, kept), 30)
    env = dict(clean.env, HORUS_CONFIG=str(clean.horus_config))

    def doctor():
        return subprocess.run([sys.executable, "-m", "slurm_horus", "doctor", "--slurm-conf", str(clean.slurm_conf)],
                              env=env, capture_output=True, text=True, timeout=60)

    # horusd writes its queue header every second: ask until it names both jobs
    shown = re.compile(r"queue: 2 jobs kept by horusd, the oldest for \d+ s")
    outputs = []
    assert wait_until(lambda: outputs.append(doctor().stdout) or shown.search(outputs[-1]), 30, step=0.5), outputs[-1]
    kill_horusd(clean)  # nobody renews leases now
    try:
        clean.run(["scontrol", "update", f"jobid={kept[0]}", "StartTime=now+3600"])  # a lease far too long
        result = doctor()
        assert f"job {kept[0]} is kept until" in result.stdout, result.stdout
    finally:
        restart_horusd(clean)
    del blockers
