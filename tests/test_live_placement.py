"""Live placement on the real local cluster: horusd + job_submit.lua decide where plain sbatch jobs go.

One 2-node x 4-GPU cluster with horusd (binding ``shard``, policy ``horus``) for the module. Job
classes are Gavel's V100 classes (the built-in priors): resnet18-bs32 + resnet18-bs64 keep all of
their speed together (a complementary pair), two recommendation-bs2048 jobs keep 31 % each (heavy).
"""

import os
import re
import signal
import time
import uuid

import pytest

from slurm_horus.service import protocol

from conftest import horusd_sees_now, local_cluster

pytestmark = pytest.mark.slurm

FILLER = "#!/bin/sh\nsleep 300\n"
REPORT = "#!/bin/sh\necho GDO=$GPU_DEVICE_ORDINAL JOB_GPUS=$SLURM_JOB_GPUS\nsleep 300\n"


@pytest.fixture(scope="module")
def horus_cluster():
    yield from local_cluster(nodes=2, gpus=4, horus=True)


@pytest.fixture
def clean(horus_cluster):
    """Each test starts with an empty queue, and horusd has seen it empty.

    Before the test's jobs are cancelled horusd re-reads the queue once more: a decision stays in its
    ledger until squeue shows the job's token (or for 60 s), and a job that started and was cancelled
    between two refreshes (24.11 starts a job within 0.3 s) would hold its GPU there for the next test."""
    horus_cluster.cancel_all_jobs()
    settle(horus_cluster)
    yield horus_cluster
    settle(horus_cluster)
    horus_cluster.cancel_all_jobs()


def detail(cluster, job_id):
    """(node, admin_comment, {'gpu'|'shard': [indices]}) of a job, read by slurm-horus's squeue reader
    (the one that knows each Slurm version's way of naming a shard's GPU)."""
    (job,) = [j for j in cluster.queue() if j.job_id == job_id]
    held = {"gpu": list(job.gpu_indices()), "shard": list(job.shard_gpu_indices())}
    return job.nodes or None, job.admin_comment, held


def spelled(cluster, tres):
    """``tres`` (written with 22.05's ``gres:``) as this cluster's Slurm spells it, as a regex."""
    return re.escape(tres).replace("gres:", re.escape(cluster.slurm_version().gres_prefix))


def wait_running(cluster, job_ids, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = cluster.job_states(job_ids)
        if all(states.get(j) == "RUNNING" for j in job_ids):
            return
        time.sleep(0.2)
    raise AssertionError(f"jobs not running: {cluster.job_states(job_ids)}")


def wait_output(cluster, job_id, text, timeout=30):
    """The job's output once it contains ``text`` (a loaded machine may take a while to start it)."""
    deadline = time.monotonic() + timeout
    output = ""
    while time.monotonic() < deadline:
        try:
            output = cluster.job_output(job_id)
        except FileNotFoundError:
            output = ""
        if text in output:
            return output
        time.sleep(0.2)
    return output


def settle(cluster):
    """Let horusd's next refresh see the jobs Slurm has started."""
    time.sleep(0.2)  # slurmctld has answered; give the started jobs a moment to show in squeue
    horusd_sees_now(cluster)


def fill_gpus(cluster, count):
    """``count`` exclusive jobs of unknown class (horus keeps them on whole GPUs)."""
    jobs = [cluster.sbatch(["--gres=gpu:1", "-J", "filler"], FILLER) for _ in range(count)]
    wait_running(cluster, jobs)
    settle(cluster)
    return jobs


def test_job_lands_where_horusd_decided_and_sees_that_gpu(clean):
    job = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet50-bs64"], REPORT)
    wait_running(clean, [job])
    node, comment, held = detail(clean, job)
    token = re.search(r"horus:(h[0-9a-f]+) mode=(shareable|shared|exclusive) slowdown=[0-9.]+ class=resnet50-bs64 "
                      r"gpus=n\d:\d", comment)
    assert token, comment
    decision_line = [line for line in (clean.root / "log" / "horusd.log").read_text().splitlines()
                     if "class=resnet50-bs64" in line and re.search("action=(place|claim)", line)][-1]
    decided = re.search(r"nodes=(\S+) tres=" + spelled(clean, "gres:shard:g") + r"(\d+):1", decision_line)
    assert decided, decision_line
    assert node == decided.group(1) and held["shard"] == [int(decided.group(2))]
    assert f"GDO={decided.group(2)}" in wait_output(clean, job, "GDO=")
    slurmctld_log = (clean.root / "log" / "slurmctld.log").read_text()
    assert f"placed horus:{token.group(1)}" in slurmctld_log


def test_complementary_pair_shares_one_gpu_through_shards(clean):
    fill_gpus(clean, 7)
    first = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
    wait_running(clean, [first])
    settle(clean)
    second = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs64"], FILLER)
    wait_running(clean, [second])
    node1, _, held1 = detail(clean, first)
    node2, comment2, held2 = detail(clean, second)
    assert (node1, held1["shard"]) == (node2, held2["shard"]) and len(held1["shard"]) == 1
    assert "mode=shared " in comment2


def test_heavy_pair_is_kept_apart(clean):
    fill_gpus(clean, 7)
    first = clean.sbatch(["--gres=gpu:1", "--comment=class=recommendation-bs2048"], FILLER)
    wait_running(clean, [first])
    settle(clean)
    second = clean.sbatch(["--gres=gpu:1", "--comment=class=recommendation-bs2048"], FILLER)
    time.sleep(2)
    assert clean.job_states([second])[second] == "PENDING"  # not squeezed onto the first one's GPU
    _, comment, _ = detail(clean, second)
    assert re.search(r"horus:h[0-9a-f]+ mode=kept class=recommendation-bs2048$", comment)  # waits in horusd's queue
    assert "no free GPU and no pair predicted worth sharing" in (clean.root / "log" / "horusd.log").read_text()


@pytest.mark.parametrize("gpu_option", ["--gpus=2", "--gres=gpu:2"])
def test_multi_gpu_job_pinned_to_one_node_and_one_switch(clean, gpu_option):
    # GPU 1 of n1 busy: a 2-GPU job on n1 could only get {0, 2} (two switches) or {2, 3}
    blocker = clean.sbatch(["-w", "n1", "--gres=gpu:g1:1"], FILLER)
    wait_running(clean, [blocker])
    settle(clean)
    job = clean.sbatch([gpu_option, "--comment=class=resnet50-bs64"], FILLER)
    wait_running(clean, [job])
    node, comment, held = detail(clean, job)
    assert "horus:" in comment and "mode=exclusive " in comment
    assert sorted(held["gpu"]) in ([0, 1], [2, 3]), held
    queue = {j.job_id: j for j in clean.queue()}
    assert len(re.findall(spelled(clean, "gres:gpu:g"), queue[job].tres_per_node)) == 2


def test_jobs_horus_must_leave_alone_are_untouched(clean):
    explicit = clean.sbatch(["-w", "n2", "--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
    exclusive = clean.sbatch(["--exclusive", "--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
    no_gpu = clean.sbatch(["--comment=class=resnet18-bs32"], FILLER)
    clean.sbatch(["--array=0-1", "--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
    time.sleep(1)
    log = (clean.root / "log" / "slurmctld.log").read_text()
    for reason in ("explicit nodelist", "explicit exclusive", "no gpu", "job array"):
        assert f"skip: {reason}" in log
    for job in (explicit, exclusive, no_gpu):
        assert "horus:" not in detail(clean, job)[1]


def test_kill_switch_stops_asking(clean):
    disable = clean.root / "etc" / "horus.disabled"
    disable.write_text("")
    time.sleep(1.1)  # job_submit.lua re-reads the kill switch at most once a second
    try:
        job = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet18-bs32"], FILLER)
        wait_running(clean, [job])
        assert "horus:" not in detail(clean, job)[1]
        assert f"skip: disabled by {disable}" in (clean.root / "log" / "slurmctld.log").read_text()
    finally:
        disable.unlink()


def horusd_pid(cluster):
    return next(d["pid"] for d in cluster.status()["daemons"] if d["name"] == "horusd")


def test_status_lists_horusd_and_it_answers_ping(horus_cluster):
    pid = horusd_pid(horus_cluster)
    reply = protocol.ask({"op": "ping"}, horus_cluster.horus_socket, timeout_s=2)
    assert reply["pid"] == pid and reply["policy"] == "horus"


def test_reload_keeps_answering(horus_cluster):
    reply = protocol.ask({"op": "reload"}, horus_cluster.horus_socket, timeout_s=30)
    assert reply == {"ok": True, "reloaded": True}
    assert protocol.ask({"op": "ping"}, horus_cluster.horus_socket, timeout_s=2)["ok"] is True


def asks_horusd_again(cluster, timeout=30):
    """Wait until job_submit.lua asks horusd and gets a decision (its circuit breaker is closed: an
    earlier test's timeouts on a loaded machine may have opened it for a pause)."""
    deadline = time.monotonic() + timeout
    while True:
        job = cluster.sbatch(["-H", "--gres=gpu:1", f"--comment=class=probe{uuid.uuid4().hex[:6]}"], FILLER)
        decided = "horus:" in (detail(cluster, job)[1] or "")
        cluster.cancel_all_jobs()
        if decided or time.monotonic() > deadline:
            return decided
        time.sleep(1.0)


def test_job_goes_through_untouched_while_horusd_is_stopped(clean):
    assert asks_horusd_again(clean), "job_submit.lua does not get horusd's decisions before the test"
    settle(clean)
    pid = horusd_pid(clean)
    os.kill(pid, signal.SIGSTOP)  # hung: connects succeed, nothing answers
    try:
        started = time.monotonic()
        # a class nobody asked for before: horusd has published no offer for it, so the Lua must ask
        job = clean.sbatch(["--gres=gpu:1", f"--comment=class=hung{uuid.uuid4().hex[:6]}"], FILLER)
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_running(clean, [job])
    assert "horus:" not in detail(clean, job)[1]
    assert elapsed < 5
    log = (clean.root / "log" / "slurmctld.log").read_text()
    # the 100 ms deadline ran out in receive, or (on a loaded machine) already before it: both are the
    # hung-horusd path ("timeout" is what the circuit breaker counts, horus.is_timeout)
    assert re.search(r"unchanged: horusd (receive: )?timeout", log), \
        [line for line in log.splitlines() if "horus:" in line][-5:]


def test_horus_sbatch_asks_the_real_horusd_and_the_job_runs_where_it_said(clean, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\necho GDO=$GPU_DEVICE_ORDINAL\nsleep 300\n")
    env = dict(clean.env, HORUS_CONFIG=str(clean.horus_config))
    argv = [sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()"]
    dry = subprocess.run(argv + ["--horus-class", "resnet18-bs32", "--dry-run", str(script)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "--gres=shard:g" in dry.stdout
    result = subprocess.run(argv + ["--horus-class", "resnet18-bs32", "--parsable",
                                    f"--output={clean.root}/jobs/slurm-%j.out", str(script)],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    job = int(result.stdout.strip().split(";")[0])
    wait_running(clean, [job])
    node, comment, held = detail(clean, job)
    decided = [line for line in (clean.root / "log" / "horusd.log").read_text().splitlines()
               if "class=resnet18-bs32" in line and "action=place" in line][-1]
    # job_submit.lua had horusd confirm the decision horus-sbatch carried, and recorded its token
    assert re.search(r"horus:h[0-9a-f]+ mode=(shareable|shared) slowdown=[0-9.]+ class=resnet18-bs32", comment), comment
    assert "confirmed horus:" in (clean.root / "log" / "slurmctld.log").read_text()
    assert re.search(f"nodes={node} tres=" + spelled(clean, f"gres:shard:g{held['shard'][0]}:1"), decided)
    assert f"GDO={held['shard'][0]}" in wait_output(clean, job, "GDO=")


def test_garbage_from_the_socket_leaves_jobs_unchanged(clean):
    import socket as socketlib
    import threading

    from slurm_horus.localcluster import horus as horus_local

    # horusd goes away (job_submit.lua's kept connection with it) and something else answers junk
    os.kill(horusd_pid(clean), signal.SIGKILL)
    clean.daemons = [d for d in clean.daemons if d["name"] != "horusd"]
    path = clean.horus_socket
    time.sleep(0.2)
    if os.path.exists(path):
        os.unlink(path)
    server = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    junk = [b"ok=1;action=place;nodes=n1;tres=gres:gpu:g0:1\n", b"\x00\xff\n",
            b"ok=1;action=place;id=x;nodes=n1 && reboot;tres=gres:gpu:g0:1;age=0\n", b""]

    def serve():
        for reply in junk:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        jobs = [clean.sbatch(["-H", "--gres=gpu:1", "--comment=class=lm-bs20"], FILLER) for _ in junk]
        thread.join(5)
    finally:
        server.close()
        os.unlink(path)
        horus_local.start_horusd(clean, 60)
        clean._write_state()
    queue = {j.job_id: j for j in clean.queue()}
    assert all(re.fullmatch(spelled(clean, "gres:gpu:1"), queue[j].tres_per_node)
               and "horus:" not in queue[j].admin_comment for j in jobs)
    log = (clean.root / "log" / "slurmctld.log").read_text()
    for why in ("unchanged: bad id", "unchanged: malformed reply", "unchanged: bad nodes", "unchanged: horusd receive"):
        assert why in log


def test_killed_horusd_costs_nothing_and_a_restart_resumes(horus_cluster):
    from slurm_horus.localcluster import horus as horus_local

    cluster = horus_cluster
    cluster.cancel_all_jobs()
    os.kill(horusd_pid(cluster), signal.SIGKILL)
    cluster.daemons = [d for d in cluster.daemons if d["name"] != "horusd"]
    job = cluster.sbatch(["-H", "--gres=gpu:1", "--comment=class=lm-bs20"], FILLER)
    assert "horus:" not in detail(cluster, job)[1]
    last = [line for line in (cluster.root / "log" / "slurmctld.log").read_text().splitlines() if "lua: horus:" in line][-1]
    assert "unchanged: horusd" in last  # connect refused, or closed if the kill was still under way
    horus_local.start_horusd(cluster, 60)
    cluster._write_state()
    placed = cluster.sbatch(["-H", "--gres=gpu:1", "--comment=class=lm-bs20"], FILLER)
    assert "horus:" in detail(cluster, placed)[1]
    settle(cluster)  # see the clean fixture: horusd must see the job before it goes
    cluster.cancel_all_jobs()


def run_doctor(cluster, slurm_conf, extra_env=None):
    import subprocess
    import sys

    env = dict(cluster.env, HORUS_CONFIG=str(cluster.horus_config), **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "slurm_horus", "doctor", "--slurm-conf", str(slurm_conf)],
                          env=env, capture_output=True, text=True, timeout=60)


def test_doctor_passes_the_local_cluster_and_names_what_is_wrong(horus_cluster, tmp_path):
    good = run_doctor(horus_cluster, horus_cluster.slurm_conf)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "error:" not in good.stdout
    version = horus_cluster.slurm_version()  # doctor names the version and what is done there
    assert f"info: Slurm {version}: tested" in good.stdout
    assert f"spell GRES as {version.gres_prefix}gpu:gK:1" in good.stdout
    broken = tmp_path / "etc"
    broken.mkdir()
    (broken / "slurm.conf").write_text(horus_cluster.slurm_conf.read_text().replace("JobSubmitPlugins=lua", "")
                                       .replace("DefMemPerCPU", "#DefMemPerCPU"))
    (broken / "gres.conf").write_text("AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-3]\n")
    (broken / "job_submit.lua").write_text("function slurm_job_submit(\n")
    bad = run_doctor(horus_cluster, broken / "slurm.conf", {"HORUS_SOCKET": str(tmp_path / "none.sock")})
    assert bad.returncode == 1
    for expected in ("JobSubmitPlugins does not include lua", "no DefMemPerCPU", "AutoDetect=nvml",
                     "does not compile", "horusd socket not found", "none.sock.offers: no such file"):
        assert expected in bad.stdout, bad.stdout


def test_decisions_land_in_the_history_database_and_a_stored_model_is_used_after_reload(clean):
    from slurm_horus.interference import build_model
    from slurm_horus.store.db import open_db
    from slurm_horus.store.decisions import decision
    from slurm_horus.store.models import save_model

    job = clean.sbatch(["--gres=gpu:1", "--comment=class=transformer-bs32"], FILLER)
    wait_running(clean, [job])
    _, comment, _ = detail(clean, job)
    decision_id = re.search(r"horus:(\S+)", comment).group(1)
    db = open_db(clean.root / "horus.db")
    deadline = time.monotonic() + 10
    while decision(db, decision_id) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    stored = decision(db, decision_id)
    assert stored["job_class"] == "transformer-bs32" and stored["policy"] == "horus"
    model_id = save_model(db, "chain", build_model("chain").to_dict(), origin="test")
    assert protocol.ask({"op": "reload"}, clean.horus_socket, timeout_s=60) == {"ok": True, "reloaded": True}
    deadline = time.monotonic() + 10
    log = clean.root / "log" / "horusd.log"
    while f"using stored model {model_id} " not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"using stored model {model_id} (chain" in log.read_text()



def test_second_job_of_a_class_takes_horusds_published_offer_without_a_round_trip(clean):
    first = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet50-bs32"], FILLER)
    wait_running(clean, [first])
    time.sleep(0.5)  # horusd republishes its offers after the decision
    second = clean.sbatch(["--gres=gpu:1", "--comment=class=resnet50-bs32"], REPORT)
    wait_running(clean, [second])
    node, comment, held = detail(clean, second)
    decision_id = re.search(r"horus:(h[0-9a-f]+) ", comment + " ").group(1)
    lua_line = [line for line in (clean.root / "log" / "slurmctld.log").read_text().splitlines()
                if f"placed horus:{decision_id} " in line][-1]
    taken = re.search(r"nodes=(\S+) tres=" + spelled(clean, "gres:shard:g") + r"(\d+):1 \(offer \d+\)", lua_line)
    assert taken, lua_line  # no round trip: the published offer was taken
    assert node == taken.group(1) and held["shard"] == [int(taken.group(2))]
    assert f"GDO={taken.group(2)}" in wait_output(clean, second, "GDO=")
    # the offer was made after the first decision: the two jobs are on different GPUs
    first_node, _, first_held = detail(clean, first)
    assert (first_node, first_held["shard"]) != (node, held["shard"])
    horusd_log = (clean.root / "log" / "horusd.log").read_text()
    assert f"offer {decision_id} taken" in horusd_log  # horusd recorded the claim


def test_a_burst_of_one_class_spreads_over_the_free_gpus(clean):
    # back to back, faster than horusd refreshes: offers, claims, withdrawals, round trips and the
    # ledger together must still give eight jobs eight different GPUs
    jobs = [clean.sbatch(["--gres=gpu:1", "--comment=class=resnet50-bs64"], FILLER) for _ in range(8)]
    wait_running(clean, jobs)
    placed = [detail(clean, job) for job in jobs]
    assert all("horus:" in comment for _node, comment, _held in placed)
    gpus = {(node, tuple(held["shard"])) for node, _comment, held in placed}
    assert len(gpus) == 8, placed


def test_a_burst_of_mixed_classes_spreads_over_the_free_gpus(clean):
    # four classes in turn, back to back: job_submit.lua may take several offers of one version (joint
    # offers) without waiting for its claims; eight jobs must still get eight different GPUs
    classes = ["resnet50-bs64", "lm-bs20", "transformer-bs64", "resnet18-bs32"]
    warm = [clean.sbatch(["--gres=gpu:1", f"--comment=class={c}"], FILLER) for c in classes]
    wait_running(clean, warm)  # every class has asked once: horusd publishes an offer for each
    clean.cancel_all_jobs()
    settle(clean)
    jobs = [clean.sbatch(["--gres=gpu:1", f"--comment=class={classes[i % 4]}"], FILLER) for i in range(8)]
    wait_running(clean, jobs)
    placed = [detail(clean, job) for job in jobs]
    assert all("horus:" in comment for _node, comment, _held in placed)
    gpus = {(node, tuple(held["shard"])) for node, _comment, held in placed}
    assert len(gpus) == 8, placed
