"""horusd under attack by one unprivileged local user (issue 15): the acceptance figures.

A local cluster with slurmdbd, job_submit.lua and horusd (real Slurm 22.05 daemons, 2 nodes x 4
fake GPUs). The user ``horustest`` (created if absent; needs root) talks to horusd's user socket
and submits held GPU jobs of a class with plain ``sbatch`` (wall time measured around sbatch):

* ``healthy``: 10 class jobs, nothing going on (the baseline);
* ``nested_line``: one line of 100,000 '[' on the user socket, then 10 class jobs: how many horus
  placed (a ``horus:`` token in AdminComment) and the slowest sbatch;
* ``reload``: 40 ``{"op": "reload"}`` from the user: how many horusd refused, and whether it reloaded;
* ``idle_connections``: horusd's soft open-file limit set to systemd's 1,024, the user holds 1,100
  idle connections, 12 class jobs: how many placed, slowest sbatch, descriptors horusd holds;
* ``hung``: horusd stopped (SIGSTOP) for ``--hung-s`` seconds while the user submits a job every
  0.2 s: the first few wait out the 100 ms deadline, then job_submit.lua's circuit breaker asks
  nothing for 5 s (doubling, at most 60 s) but one try per pause: figures for the first three, the
  tries, and all the others;
* ``forged_tokens``: a CPU-only job of the user with ``--comment "horus:<id> slowdown=0.20
  class=resnet50-bs64 gpus=n1:0"`` beside a real job on n1's GPU 0; then ``horus ingest``, ``report``
  and ``model-refit``: what each made of it.

Prints JSON. Timings are sbatch wall times on whatever machine runs it (noisy on a shared one:
compare with ``healthy`` of the same run), and job_submit.lua's own time in slurmctld (``lua_*_ms``,
from slurmctld.log: what horus adds while slurmctld holds its job lock). Needs root + the Debian
packages; no ../shared data. Usage: ``.venv/bin/python bench/bench_attacks.py [HUNG_SECONDS]``.
"""

import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from slurm_horus.localcluster import LocalCluster  # noqa: E402
from slurm_horus.service import protocol  # noqa: E402

from unprivileged import (  # noqa: E402
    IDLE_CONNECTIONS, ensure_user, nested_line_as, popen_python_as, requests_as, sbatch_as,
)

CLASS_JOB = ["-H", "--gres=gpu:1", "--comment=class=resnet18-bs32"]
FORGED = "horus:h0123456789 slowdown=0.20 class=resnet50-bs64 gpus=n1:0"


def ms_figures(times):
    return {"n": len(times), "p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)} \
        if times else {"n": 0}


def placed(cluster, job_ids):
    wanted = set(job_ids)
    return sum(1 for job in cluster.queue() if job.job_id in wanted and re.search(r"horus:h[0-9a-f]+ ", job.admin_comment or ""))


def lua_lines(cluster, count):
    """job_submit.lua's last ``count`` outcome lines in slurmctld.log."""
    lines = [line for line in (cluster.root / "log" / "slurmctld.log").read_text().splitlines()
             if "horus: job name=" in line]
    return lines[-count:] if count else []


def lua_figures(lines):
    """The Lua's own time (slurmctld holds its job lock meanwhile), and why jobs were not placed."""
    times = [float(m.group(1)) for m in (re.search(r"\(([0-9.]+) ms\)$", line) for line in lines) if m]
    reasons = {}
    for line in lines:
        if " placed horus:" not in line:
            why = re.sub(r" \([0-9.]+ ms\)$", "", line.split(" uid=", 1)[1].split(" ", 1)[1])
            reasons[why] = reasons.get(why, 0) + 1
    return {"lua_p50_ms": round(statistics.median(times), 2), "lua_max_ms": round(max(times), 2),
            "not_placed": reasons} if times else {}


def submit_round(cluster, user, count, args=CLASS_JOB):
    submitted = [sbatch_as(user, cluster, args) for _ in range(count)]
    ids = [job for job, _ms, _err in submitted if job]
    return {"accepted": len(ids), "placed_by_horus": placed(cluster, ids), **ms_figures([ms for _j, ms, _e in submitted]),
            **lua_figures(lua_lines(cluster, count))}


def clear(cluster):
    """No jobs, and horusd has seen the queue empty (its refresh is 1 s on the local cluster)."""
    cluster.cancel_all_jobs()
    time.sleep(1.5)


def horusd_pid(cluster):
    return [d for d in cluster.daemons if d["name"] == "horusd"][-1]["pid"]


def hung_phase(cluster, user, seconds):
    pid = horusd_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    times = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            _job, ms, _err = sbatch_as(user, cluster, ["-H", "--gres=gpu:1", "--comment=class=transformer-bs64"])
            times.append(ms)
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    log = lua_lines(cluster, len(times))
    outcomes = ["timeout" if "receive: timeout" in line or "connect" in line and "timeout" in line else
                "open" if "circuit open" in line else "other" for line in log]
    first, rest = times[:3], times[3:]
    tries = [ms for ms, outcome in zip(rest, outcomes[3:]) if outcome != "open"]
    skipped = [ms for ms, outcome in zip(rest, outcomes[3:]) if outcome == "open"]
    open_lines = [line for line, outcome in zip(log, outcomes) if outcome == "open"]
    return {"seconds": seconds, "submissions": len(times), "first_three": ms_figures(first),
            "breaker_tries": ms_figures(tries), "breaker_open": {**ms_figures(skipped), **lua_figures(open_lines)},
            "outcomes": {k: outcomes.count(k) for k in ("timeout", "open", "other")}}


def forged_phase(cluster, user):
    victim = cluster.sbatch(["-w", "n1", "--gres=gpu:g0:1", "--comment=class=resnet18-bs32"], "#!/bin/sh\nsleep 3\n")
    forged, _ms, _err = sbatch_as(user, cluster, ["-w", "n1", f"--comment={FORGED}"], "#!/bin/sh\nsleep 3\n")
    cluster.wait_jobs([victim, forged], timeout=120)
    deadline = time.time() + 90
    while {j.job_id for j in cluster.accounting([victim, forged]) if j.end_time} != {victim, forged}:
        if time.time() > deadline:
            return {"error": "sacct never showed both jobs"}
        time.sleep(1)
    directory = tempfile.mkdtemp(prefix="bench-attacks-")
    env = dict(cluster.env, HORUS_DB=os.path.join(directory, "h.db"))
    env.pop("HORUS_CONFIG", None)

    def horus(*args):
        return subprocess.run([sys.executable, "-m", "slurm_horus", *args], env=env, capture_output=True, text=True,
                              timeout=300).stdout

    horus("ingest", "--since", "2000-01-01", "--no-progress")
    from slurm_horus.store.db import open_db

    row = open_db(env["HORUS_DB"]).execute("SELECT horus_id, gpu_indices, n_gpus FROM jobs WHERE job_id = ?",
                                           [forged]).fetchone()
    victim_report = json.loads(horus("report", "job", str(victim), "--json"))
    forged_report = json.loads(horus("report", "job", str(forged), "--json"))
    refit = json.loads(horus("model-refit", "--json", "--predictor", "measured"))
    return {
        "ingest_horus_id": row[0], "ingest_gpu_indices": row[1], "ingest_n_gpus": row[2],
        "report_victim_corunners": len(victim_report["corunners"]),
        "report_forged_gpus": forged_report["gpu_list"], "report_forged_predicted": forged_report["predicted_slowdown"],
        "refit_pairs_of_forged_class": len([p for p in refit.get("pairs", []) if p["job_class"] == "resnet50-bs64"]),
    }


def main():
    hung_s = float(sys.argv[1]) if len(sys.argv) > 1 else 12.0
    user = ensure_user()
    cluster = LocalCluster(nodes=2, gpus=4, with_dbd=True, horus=True).up()
    out = {"benchmark": "attacks", "user": user.pw_name}
    user_socket = cluster.horus_socket + ".user"
    try:
        time.sleep(1.5)
        out["healthy"] = submit_round(cluster, user, 10)
        clear(cluster)

        answer = nested_line_as(user, user_socket)
        out["nested_line"] = {"answer": answer[:80], **submit_round(cluster, user, 10)}
        clear(cluster)

        log = cluster.root / "log" / "horusd.log"
        reloads = log.read_text().count("reloaded config")
        replies = requests_as(user, user_socket, *[{"op": "reload"}] * 40)
        out["reload"] = {"asked": 40, "refused": sum(r["ok"] is False for r in replies),
                         "reloaded": log.read_text().count("reloaded config") - reloads,
                         "after": submit_round(cluster, user, 10)}
        clear(cluster)

        pid = horusd_pid(cluster)
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, limits[1]))
        attacker = popen_python_as(user, IDLE_CONNECTIONS, user_socket, 1100)
        try:
            attacker.stdout.readline()
            round_ = submit_round(cluster, user, 12)  # 8 GPUs x 2 shards: room for all
            time.sleep(2.5)
            out["idle_connections"] = {"held_by_user": 1100, "horusd_fds": len(os.listdir(f"/proc/{pid}/fd")),
                                       "state_age_s": protocol.ask({"op": "ping"}, cluster.horus_socket, 5)["state_age_s"],
                                       **round_}
        finally:
            attacker.stdin.close()
            attacker.wait(30)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        clear(cluster)

        before = protocol.ask({"op": "ping"}, cluster.horus_socket, 5)
        out["hung"] = hung_phase(cluster, user, hung_s)
        time.sleep(1.0)
        after = protocol.ask({"op": "ping"}, cluster.horus_socket, 5)
        out["hung"]["decisions_while_hung"] = after["decisions"] - before["decisions"]
        clear(cluster)

        out["forged_tokens"] = forged_phase(cluster, user)
    finally:
        cluster.down()
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
