"""History on the real local cluster with slurmdbd: fake GPU jobs, stand-in collectors, sacct ingest,
reports and a refit, all through the ``horus`` command line."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from slurm_horus.store.db import open_db

HORUS = [sys.executable, "-m", "slurm_horus.cli"]

# A fake GPU job: claims a utilization through HORUS_FAKE_GPU_UTIL (read by the stand-in NVML),
# optionally waits for a partner job to start (so two jobs surely share), then "trains" for a while.
FAKE_JOB = """#!/bin/sh
if [ -n "{partner}" ]; then
  touch {dir}/$SLURM_JOB_NAME
  for i in $(seq 1 300); do [ -e {dir}/{partner} ] && break; sleep 0.1; done
fi
sleep {seconds}
exit {exit_code}
"""


def horus(args, env, check=True):
    result = subprocess.run(HORUS + list(args), env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def history_env(slurm_cluster_dbd, tmp_path):
    env = dict(slurm_cluster_dbd.env, HORUS_DB=str(tmp_path / "horus.db"))
    env.pop("HORUS_CONFIG", None)
    return env


def submit(cluster, tmp_path, name, node, gres, seconds, util, partner="", exit_code=0, cls=None):
    script = FAKE_JOB.format(partner=partner, dir=tmp_path, seconds=seconds, exit_code=exit_code)
    args = ["-w", node, f"--gres={gres}", f"--job-name={name}",
            f"--export=ALL,HORUS_FAKE_GPU_UTIL={util},HORUS_FAKE_GPU_MEM_MB=1500"]
    if cls:
        args.append(f"--comment=class={cls}")
    return cluster.sbatch(args, script)


def wait_for_spool(path, proc, timeout=60):
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1].decode()
        if path.exists():
            conn = sqlite3.connect(path)
            try:
                if conn.execute("SELECT count(*) FROM batches").fetchone()[0]:
                    return
            except sqlite3.OperationalError:
                pass
            finally:
                conn.close()
        assert time.time() < deadline, f"collector never wrote {path}"
        time.sleep(0.2)


def sacct_view(cluster, job_ids):
    """What sacct says, through the cluster room's own (independent) parser."""
    return {j.job_id: j for j in cluster.accounting(job_ids)}


def sacct_exit_codes(cluster, job_ids):
    """Exit codes from ``sacct -P`` (22.05's --json reports 0 for a job that exited 3)."""
    out = cluster.run(["sacct", "-P", "-n", "-X", "-o", "JobIDRaw,ExitCode", "-j",
                       ",".join(map(str, job_ids))]).stdout
    return {int(line.split("|")[0]): int(line.split("|")[1].split(":")[0]) for line in out.split()}


def test_ingest_report_and_refit_on_real_accounting(slurm_cluster_dbd, history_env, tmp_path):
    cluster = slurm_cluster_dbd
    os.chmod(tmp_path, 0o777)
    tag = uuid.uuid4().hex[:5]
    collectors = [
        subprocess.Popen(HORUS + ["collect", "--backend", "standin", "--node", node, "--interval", "0.5",
                                  "--spool", str(tmp_path / f"spool-{node}.db"), "--ship-every", "2"],
                         env=history_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for node in cluster.node_names()
    ]
    try:
        for node, proc in zip(cluster.node_names(), collectors):  # sampling before the jobs start
            wait_for_spool(tmp_path / f"spool-{node}.db", proc)
        jobs = {
            # solo runs give the baselines: alpha 10 s, beta 2 s
            "alpha_solo": submit(cluster, tmp_path, f"a1{tag}", "n1", "gpu:g0:1", 10, 80, cls="alpha"),
            "beta_solo": submit(cluster, tmp_path, f"b1{tag}", "n1", "gpu:g1:1", 2, 40, cls="beta"),
            # alpha and beta share GPU 2 of n2 through shards for 11 s (the learning loop wants at
            # least 10 s shared) and run slower: observed normalized throughputs near 0.7 (alpha) and
            # 0.2 (beta), whatever the second-granular jitter, far from the 0.5 the model says for
            # classes it has never seen
            "alpha_shared": submit(cluster, tmp_path, f"a2{tag}", "n2", "shard:g2:1", 13, 70,
                                   partner=f"b2{tag}", cls="alpha"),
            "beta_shared": submit(cluster, tmp_path, f"b2{tag}", "n2", "shard:g2:1", 11, 35,
                                  partner=f"a2{tag}", cls="beta"),
            # holds GPUs 1 and 3 of n3, computes nothing on them; long enough for the 3 samples the
            # idle flag needs (the collectors sampled every ~2 s on a loaded machine, saw a job's second
            # GPU a sample late, and at load 16 saw its process 3 s after its start)
            "idle": submit(cluster, tmp_path, f"id{tag}", "n3", "gpu:g1:1,gpu:g3:1", 12, 0),
            "failed": submit(cluster, tmp_path, f"fa{tag}", "n4", "gpu:g0:1", 1, 50, exit_code=3),
        }
        states = cluster.wait_jobs(list(jobs.values()), timeout=90)
    finally:
        for proc in collectors:
            proc.send_signal(signal.SIGTERM)
        errors = [proc.communicate(timeout=30)[1].decode() for proc in collectors]
    assert not any("Traceback" in e for e in errors), errors
    assert states[jobs["failed"]] == "FAILED" and states[jobs["alpha_shared"]] == "COMPLETED"
    for node in cluster.node_names():  # what the killed collectors had not shipped yet
        horus(["collect", "--ship", "--spool", str(tmp_path / f"spool-{node}.db")], history_env)

    deadline = time.time() + 60  # slurmdbd stores records a few seconds after the job ends
    while True:
        sacct = sacct_view(cluster, jobs.values())
        if len(sacct) == len(jobs) and all(j.end_time for j in sacct.values()):
            break
        assert time.time() < deadline, "sacct never showed every job"
        time.sleep(1)

    exit_codes = sacct_exit_codes(cluster, jobs.values())
    assert exit_codes[jobs["failed"]] == 3
    first = json.loads(horus(["ingest", "--json", "--since", "2000-01-01"], history_env).stdout)
    assert first["source"] == "json" and first["jobs_new"] >= len(jobs)
    db = open_db(history_env["HORUS_DB"])
    rows = {r["job_id"]: r for r in db["jobs"].rows_where("job_id IN ({})".format(",".join(map(str, jobs.values()))))}
    for job_id, truth in sacct.items():
        row = rows[job_id]
        assert row["state"] == truth.state and row["elapsed_s"] == truth.elapsed_s
        assert row["nodes"] == truth.nodes and row["exit_code"] == exit_codes[job_id]
        assert row["gpu_indices"] == (",".join(map(str, truth.gpu_indices())) or None)
    assert rows[jobs["idle"]]["gpu_indices"] == "1,3" and rows[jobs["idle"]]["n_gpus"] == 2
    assert rows[jobs["alpha_shared"]]["shards"] == 1
    assert db["steps"].count_where("job_id = ? AND step_id = 'batch'", [jobs["failed"]]) == 1

    before = list(db.execute("SELECT * FROM jobs ORDER BY cluster, job_id"))
    steps_before = db["steps"].count
    again = json.loads(horus(["ingest", "--json"], history_env).stdout)
    assert again["jobs_new"] == 0
    assert db["steps"].count == steps_before
    after = list(db.execute("SELECT * FROM jobs ORDER BY cluster, job_id"))
    ingested_at = [c[0] for c in db.execute("SELECT * FROM jobs LIMIT 0").description].index("ingested_at")
    assert [r[:ingested_at] for r in before] == [r[:ingested_at] for r in after]

    # the sacct -P fallback reads the very same rows
    parsable_env = dict(history_env, HORUS_DB=str(tmp_path / "parsable.db"))
    horus(["ingest", "--format", "parsable", "--since", "2000-01-01"], parsable_env)
    other = open_db(parsable_env["HORUS_DB"])
    assert [r[:ingested_at] for r in other.execute("SELECT * FROM jobs ORDER BY cluster, job_id")] == \
        [r[:ingested_at] for r in after]
    assert list(other.execute("SELECT * FROM steps ORDER BY 1, 2, 3")) == \
        list(db.execute("SELECT * FROM steps ORDER BY 1, 2, 3"))

    # the shared jobs' GPU comes from the collector (sacct keeps shards untyped)
    report = json.loads(horus(["report", "job", str(jobs["alpha_shared"]), "--json"], history_env).stdout)
    assert report["gpu_list"] == ["n2:2"]
    assert [c["job_id"] for c in report["corunners"]] == [jobs["beta_shared"]]
    # the job's process claims 70 % on every sample it is seen; a sample where Slurm holds the GPU for
    # the job but its process has not started yet (or has just ended) is an idle 0, and a loaded
    # machine can catch one at either end of the run, never in the middle
    gpu = report["gpus"][0]
    sms = [point[1] for point in gpu["series"]]
    assert len(sms) == gpu["samples"] and max(sms) == 70
    inner = sms[1:-1] if len(sms) > 2 else sms
    assert set(inner) == {70} and set(sms) <= {0, 70}
    assert gpu["mean_sm_util"] == pytest.approx(sum(sms) / len(sms), abs=0.1)
    idle = json.loads(horus(["report", "job", str(jobs["idle"]), "--json"], history_env).stdout)
    assert idle["gpu_list"] == ["n3:1", "n3:3"] and "idle_gpu" in idle["flags"]
    text = horus(["report", "job", str(jobs["failed"])], history_env).stdout
    assert "state FAILED" in text and "exit 3" in text and "n4:0" in text

    users = json.loads(horus(["report", "users", "--json", "--since", "2000-01-01"], history_env).stdout)
    root = next(r for r in users["rows"] if r["user"] == "root")
    assert root["jobs"] >= len(jobs) and root["shared_jobs"] >= 2
    html = tmp_path / "cluster.html"
    horus(["report", "cluster", "--html", str(html)], history_env)
    assert "<svg" in html.read_text()

    # horusd's 5-minute feed learns the pairs from this real accounting before any refit has run
    from slurm_horus.service.history import History

    rebuilds = []
    feed = History(history_env["HORUS_DB"], on_pairs=lambda: rebuilds.append(1))
    assert feed.learn_pairs(db) and rebuilds == [1]
    fed = {(c, k): value for (_gpu, c, k), value in feed.told_pairs.items()}
    assert {("alpha", "beta"), ("beta", "alpha")} <= set(fed)

    refit = json.loads(horus(["model-refit", "--json"], history_env).stdout)
    pairs = {(p["job_class"], p["corunner_class"]): p for p in refit["pairs"]}
    assert {("alpha", "beta"), ("beta", "alpha")} <= set(pairs)
    for pair in (("alpha", "beta"), ("beta", "alpha")):  # the refit over the whole history agrees
        assert fed[pair] == pytest.approx(pairs[pair]["observed"], abs=1e-4)
    assert refit["after"]["mae"] < refit["before"]["mae"]
    # elapsed times are whole seconds and a loaded machine stretches short jobs, so a pair may be
    # observed right at the model's default already; no pair may move away, and one must move closer
    moved = [abs(p["before"] - p["observed"]) - abs(p["after"] - p["observed"])
             for p in (pairs[("alpha", "beta")], pairs[("beta", "alpha")])]
    assert min(moved) >= 0 and max(moved) > 0


# 120 MB held in a shell variable (written, so resident: MaxRSS sees it) while the shell spins for 4 s;
# plain sh and coreutils, so that it runs in a Slurm chroot too (no Python there)
BUSY = """#!/bin/sh
held=$(head -c 125829120 /dev/zero | tr '\\0' x)
sleep 4 &
timer=$!
while kill -0 $timer 2>/dev/null; do :; done
echo ${#held}
"""


def mailed_jobs(cluster, history_env, tmp_path, busy_args, array_args):
    """Run the two jobs with horus's MailProg wrapper in slurm.conf; check the mails it sent."""
    os.chmod(tmp_path, 0o755)
    mail = tmp_path / "mail"
    mail.write_text(f'#!/bin/sh\n{{ echo "ARGS $*"; cat; }} >> {tmp_path}/sent\n')
    mail.chmod(0o755)
    mailprog = tmp_path / "mailprog"
    mailprog.write_text(horus(["admin", "mailprog", "--mail", str(mail), "--db", history_env["HORUS_DB"]],
                              history_env).stdout)
    mailprog.chmod(0o755)
    conf = cluster.slurm_conf
    original = conf.read_text()
    conf.write_text(original.replace("MailProg=/bin/true", f"MailProg={mailprog}"))
    cluster.run(["scontrol", "reconfigure"])
    try:  # slurmctld itself calls the wrapper at job end, as it would on a site
        busy = cluster.sbatch(busy_args + ["--mail-type=END", "--mail-user=root"], BUSY)
        array = cluster.sbatch(array_args + ["--mail-type=END,ARRAY_TASKS", "--mail-user=root"],
                               "#!/bin/sh\nsleep 1\n")
        deadline = time.time() + 120
        while True:
            sent = (tmp_path / "sent").read_text() if (tmp_path / "sent").exists() else ""
            if sent.count("slurm-horus: job ") >= 3:
                break
            assert time.time() < deadline, sent
            time.sleep(1)
    finally:
        conf.write_text(original)
        cluster.run(["scontrol", "reconfigure"])
    assert f"ARGS -s Slurm Job_id={busy} Name=busy Ended" in sent
    assert f"slurm-horus: job {busy} (busy) COMPLETED after " in sent
    for task in (0, 1):
        assert f"slurm-horus: job {array}_{task} (arr) COMPLETED" in sent
    return busy, array


def test_efficiency_array_ids_and_the_mailprog_on_the_real_cluster(slurm_cluster_dbd, history_env, tmp_path):
    from slurm_horus.localcluster.chroot import slurm_install

    cluster = slurm_cluster_dbd
    busy_args = ["--mem=300M", "--time=10", "-J", "busy", "-w", "n1", "--gres=gpu:g0:1"]
    array_args = ["--array=0-1", "-J", "arr", "-w", "n2", "--gres=gpu:1"]
    if slurm_install().root is not None:
        # a chroot's Slurm (make test-slurm-newer): slurmctld runs MailProg inside the chroot, where
        # slurm-horus is not installed (on a site it is installed beside slurmctld); the jobs are
        # ingested here instead, and the rest of the test holds on that Slurm too
        busy = cluster.sbatch(busy_args, BUSY)
        array = cluster.sbatch(array_args, "#!/bin/sh\nsleep 1\n")
        deadline = time.time() + 120
        while len([j for j in cluster.accounting([busy, array]) if j.end_time]) < 3 and time.time() < deadline:
            time.sleep(1)
        horus(["ingest", "--since", "2000-01-01"], history_env)
    else:
        busy, array = mailed_jobs(cluster, history_env, tmp_path, busy_args, array_args)
    report = json.loads(horus(["report", "job", str(busy), "--json"], history_env).stdout)
    eff = report["efficiency"]
    assert eff["cpu_time_s"] > 1 and eff["max_rss_mb"] >= 120 and eff["mem_mb"] == 300
    assert 40 <= eff["mem_eff"] <= 100 and eff["time_limit_min"] == 10
    task = json.loads(horus(["report", "job", f"{array}_1", "--json"], history_env).stdout)
    assert task["job_name"] == f"{array}_1" and task["job"]["array_task_id"] == 1
    whole = json.loads(horus(["report", "job", str(array), "--json"], history_env).stdout)
    assert [t["job"] for t in whole["tasks"]] == [f"{array}_0", f"{array}_1"]
    mine = json.loads(horus(["report", "jobs", "--user", "root", "--json"], history_env).stdout)
    assert {f"{array}_0", f"{array}_1", str(busy)} <= {r["job"] for r in mine["rows"]}
