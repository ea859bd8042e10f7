"""horusd's queue on a real cluster: a burst, the shared cycle on one snapshot, a kill with jobs waiting.

One local cluster, 2 nodes x 4 fake GPUs, with slurmdbd (accounting), job_submit.lua and horusd
(binding shard, policy horus, the site defaults for the queue: lease 30 s, cycle 2 s; refresh 1 s as
the local cluster sets it). Jobs are plain ``sbatch --gres=gpu:1`` of Gavel's V100 classes, sleeping
10-22 s, printing the GPU they got. Three phases:

A. **burst**: 32 jobs at once on the idle cluster. Counted from sacct once all ended: how many
   started through a horus decision (a ``horus:`` token with ``gpus=``), how many of those waited in
   horusd's queue (kept, then started by horusd), whether each ran on the GPU its token names, and
   the time from horusd's cycle placing a kept job to slurmctld allocating it (their two logs).
B. **same snapshot**: 2 blocker jobs hold every GPU while 16 jobs are submitted (all kept); horusd is
   paused (SIGSTOP) while the blockers are cancelled and ``sinfo``/``squeue --json`` are saved, then
   resumed: the placements of its first cycle are compared with :func:`run_cycle` run here, by the
   same placer code, on the saved snapshot (``--save DIR`` keeps the JSON: tests/data/queue_snapshot).
   After phase A, the burst's run times are ingested into horusd's history store (what
   horus-ingest.timer does) and horusd reloads, so both sides estimate durations from that history
   (the placer here reads the same store); without phase A both use the time limits.
C. **kill**: 32 jobs again; once at least 16 wait in horusd's queue, horusd is SIGKILLed. All must
   complete; the last one must start within 90 s of the kill (the lease is 30 s).
D. **lease cost** (``--phases D``, not in the default run): N jobs kept behind blockers; the time one
   lease renewal of all of them takes (horusd's scontrol, one RPC per job), slurmctld's own time per
   update from its log, and how many jobs slurmctld's schedulers look at (sdiag: kept jobs are not
   eligible, so neither the main scheduler nor backfill considers them).

``--slurm 24.11`` (or ``26.05``) runs it all on that Slurm from its chroot (docs/slurm-versions.md);
phase B then saves ``scontrol --json show nodes`` instead of ``sinfo --json`` (which groups nodes there).

Prints JSON. Needs root + the Debian packages (as ``make test``); reads no ../shared data. Takes
about 4 minutes on the project's 2-core VM.
"""

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

from slurm_horus.config import load_config
from slurm_horus.localcluster import LocalCluster
from slurm_horus.localcluster import poll as wait_until
from slurm_horus.service import protocol
from slurm_horus.service.app import build_placer
from slurm_horus.service.history import History
from slurm_horus.service.snapshot import Snapshot
from slurm_horus.slurm.parse import parse_sinfo, parse_squeue
from slurm_horus.tokens import parse_gpu_list, parse_horus_tokens

CLASSES = ["resnet18-bs32", "resnet18-bs64", "lm-bs20", "resnet50-bs64", "transformer-bs32", "a3c",
           "recommendation-bs2048", "cyclegan"]
SCRIPT = "#!/bin/sh\necho GDO=$GPU_DEVICE_ORDINAL\nsleep {seconds}\n"


def burst(cluster, n, seconds=lambda i: 10 + (i % 5) * 3):
    return [cluster.sbatch(["--gres=gpu:1", f"--comment=class={CLASSES[i % len(CLASSES)]}", f"-t{2 + i % 4}"],
                           SCRIPT.format(seconds=seconds(i))) for i in range(n)]


def log_times(path, pattern):
    """[(epoch, match)] of the lines of a log matching ``pattern`` (timestamps to the ms)."""
    out = []
    for line in Path(path).read_text().splitlines():
        found = re.search(pattern, line)
        stamp = re.match(r"\[?(\d{4}-\d\d-\d\dT?\s?\d\d:\d\d:\d\d[.,]\d{3})", line)
        if found and stamp:
            text = stamp.group(1).replace(" ", "T").replace(",", ".")
            out.append((datetime.fromisoformat(text).timestamp(), found))
    return out


def horusd_pid(cluster):
    return next(d["pid"] for d in cluster.status()["daemons"] if d["name"] == "horusd")


def kept_waiting(cluster):
    return [j for j in cluster.queue() if j.state == "PENDING" and parse_horus_tokens(j.admin_comment)[1].get("mode") == "kept"]


def accounted(cluster, ids):
    """sacct's records of ``ids`` once slurmdbd has all of them ended."""
    records = {}

    def complete():
        records.update({j.job_id: j for j in cluster.accounting(ids)})
        return all(j in records and records[j].state == "COMPLETED" for j in ids)

    wait_until(complete, 120, step=1.0)
    return records


def phase_burst(cluster):
    started_at = time.time()
    ids = burst(cluster, 32)
    cluster.wait_jobs(ids, timeout=400)
    records = accounted(cluster, ids)
    horus_started, waited, on_token_gpu = 0, 0, 0
    kept_ids = set()
    for line in (cluster.root / "log" / "horusd.log").read_text().splitlines():
        found = re.search(r"decision job=(\d+) .*action=start", line)
        if found:
            kept_ids.add(int(found.group(1)))
    for job_id in ids:
        record = records.get(job_id)
        _decision, fields = parse_horus_tokens(record.admin_comment if record else "")
        if not fields.get("gpus"):
            continue
        horus_started += 1
        waited += job_id in kept_ids
        (node, (index,)), = parse_gpu_list(fields["gpus"])
        output = cluster.job_output(job_id)
        on_token_gpu += record.nodes == node and f"GDO={index}" in output
    # placement -> allocation: horusd's cycle line vs slurmctld's "sched: Allocate JobId=" line
    placed = {}
    for stamp, found in log_times(cluster.root / "log" / "horusd.log", r"cycle placed \d+ kept jobs: (.*)$"):
        for item in found.group(1).split():
            placed.setdefault(int(item.split("->")[0]), stamp)
    allocated = {int(m.group(1)): stamp for stamp, m in  # main scheduler or backfill, whichever started it
                 log_times(cluster.root / "log" / "slurmctld.log", r"(?:sched: Allocate|_start_job: Started) JobId=(\d+) ")}
    latency = sorted(allocated[j] - placed[j] for j in placed if j in allocated and j in ids)
    return {
        "jobs": len(ids), "started_through_a_horus_decision": horus_started, "of_which_waited_in_horusd_queue": waited,
        "ran_on_the_gpu_their_token_names": on_token_gpu, "goal_started_through_horus": 29,
        "placement_to_allocation_s": {"n": len(latency), "median": round(statistics.median(latency), 3),
                                      "max": round(max(latency), 3)} if latency else None,
        "burst_makespan_s": round(max(r.end_time for r in records.values()) - started_at, 1),
    }


def learn_history(cluster):
    """What horus-ingest.timer does (sacct into horusd's history store), then a reload: horusd's
    duration estimator learns the run times of the jobs that ended."""
    import subprocess

    env = dict(os.environ, HORUS_CONFIG=str(cluster.horus_config))
    done = subprocess.run([sys.executable, "-m", "slurm_horus", "ingest", "--slurm-conf", str(cluster.slurm_conf)],
                          env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"horus ingest failed: {done.stderr.strip()}")
    protocol.ask({"op": "reload"}, cluster.horus_socket, timeout_s=60)
    return protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=5).get("duration_history_jobs", 0)


def phase_same_snapshot(cluster, save):
    blockers = [cluster.sbatch(["--gres=gpu:4", "-J", "blocker"], "#!/bin/sh\nsleep 600\n") for _ in range(2)]
    cluster.wait_jobs(blockers, timeout=60, states=("RUNNING",))
    time.sleep(2)  # horusd has seen them
    ids = burst(cluster, 16, seconds=lambda i: 8)
    if not wait_until(lambda: len(kept_waiting(cluster)) == 16, 30):
        raise SystemExit("phase B: the 16 jobs were not all kept")
    time.sleep(1.5)  # horusd's queue holds all 16 (it refreshes every second)
    pid = horusd_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        cluster.run(["scancel"] + [str(b) for b in blockers])
        gone = wait_until(lambda: not any(j.job_id in blockers and j.state in ("RUNNING", "COMPLETING", "CONFIGURING")
                                          for j in cluster.queue()), 20, step=0.2)
        nodes_argv = ["sinfo", "--json"] if cluster.slurm_version().gres_prefix == "gres:" else \
            ["scontrol", "--json", "show", "nodes"]  # newer sinfo --json groups nodes
        sinfo = cluster.run(nodes_argv).stdout
        squeue = cluster.run(["squeue", "--json"]).stdout
        resumed_at = time.time()
    finally:
        os.kill(pid, signal.SIGCONT)
    if not gone:
        raise SystemExit("phase B: the blockers did not end within 20 s")
    if save:
        Path(save).mkdir(parents=True, exist_ok=True)
        (Path(save) / "sinfo.json").write_text(sinfo)
        (Path(save) / "squeue.json").write_text(squeue)
    # what the shared cycle does on that snapshot, here (the same placer code horusd runs)
    os.environ["HORUS_CONFIG"] = str(cluster.horus_config)
    config = load_config()
    placer = build_placer(config)
    history = History(config.db).duration_estimator()  # the run times horusd reads from its store
    if history is not None:
        placer.set_durations(history)
    placer.load_snapshot(Snapshot(parse_sinfo(sinfo, nodes_argv[0]), parse_squeue(squeue), taken_at=time.time(),
                                  slurm_version=cluster.slurm_version()))
    estimates = sorted({round(req.predicted_duration) for req in placer.queue})
    expected = {int(m.kept.job_id): (m.reply.gpulist, m.reply.tres) for m in placer.cycle()}
    cluster.wait_jobs(ids, timeout=120)
    first = None
    for stamp, found in log_times(cluster.root / "log" / "horusd.log", r"cycle placed \d+ kept jobs: (.*)$"):
        if stamp >= resumed_at - 0.5:
            first = found.group(1)
            break
    live = {}
    for stamp, found in log_times(cluster.root / "log" / "horusd.log",
                                  r"decision job=(\d+) .*action=start nodes=(\S+) tres=(\S+)"):
        if stamp >= resumed_at - 0.5 and int(found.group(1)) in expected and int(found.group(1)) not in live:
            live[int(found.group(1))] = found.group(3)
    first_cycle = {int(item.split("->")[0]): item.split("->")[1] for item in (first or "").split()}
    pairs = lambda placements: sorted(sorted(j for j, g in placements.items() if g == gpu)  # noqa: E731
                                      for gpu in set(placements.values()))
    expected_gpus = {j: g for j, (g, _t) in expected.items()}
    return {
        "kept_jobs": len(ids), "history_jobs": history.observed if history is not None else 0,
        "estimated_durations_s": estimates, "placed_by_the_shared_cycle_here": len(expected),
        "placed_by_horusd_first_cycle": len(first_cycle),
        "same_placements": first_cycle == expected_gpus,
        "same_pairs": pairs(first_cycle) == pairs(expected_gpus),
        "pairs": pairs(expected_gpus),
    }


def phase_kill(cluster):
    ids = burst(cluster, 32, seconds=lambda i: 12 + (i % 4) * 3)
    if not wait_until(lambda: len(kept_waiting(cluster)) >= 16, 60, step=0.2):
        raise SystemExit("phase C: fewer than 16 jobs waiting in horusd's queue")
    waiting = len(kept_waiting(cluster))
    os.kill(horusd_pid(cluster), signal.SIGKILL)
    killed_at = time.time()
    cluster.daemons = [d for d in cluster.daemons if d["name"] != "horusd"]
    states = cluster.wait_jobs(ids, timeout=400)
    records = accounted(cluster, ids)
    last_start = max(r.start_time for r in records.values())
    return {
        "jobs": len(ids), "waiting_in_queue_at_kill": waiting,
        "completed": sum(s == "COMPLETED" for s in states.values()),
        "in_sacct": len(records), "last_start_after_kill_s": round(last_start - killed_at, 1),
        "goal_last_start_after_kill_s": 90,
    }


def phase_lease_cost(cluster, n=300):
    from slurm_horus.service.mover import Mover

    fill = [cluster.sbatch(["--gres=gpu:4", "-J", "blocker"], "#!/bin/sh\nsleep 900\n") for _ in range(2)]
    cluster.wait_jobs(fill, timeout=60, states=("RUNNING",))
    time.sleep(2)
    ids = [cluster.sbatch(["--gres=gpu:1", "--comment=class=lm-bs20", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
           for _ in range(n)]
    if not wait_until(lambda: len(kept_waiting(cluster)) == n, 120, step=1.0):
        raise SystemExit("phase D: not every job was kept")
    mover = Mover(str(cluster.slurm_conf))
    marker = time.time()
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        mover.renew(ids, 30)
        timings.append(time.perf_counter() - started)
    usec = [int(m.group(1)) for stamp, m in log_times(cluster.root / "log" / "slurmctld.log",
                                                        r"_slurm_rpc_update_job: complete JobId=\d+ uid=0 usec=(\d+)")
            if stamp >= marker]
    sdiag = cluster.run(["sdiag"]).stdout
    queue_lengths = [int(x) for x in re.findall(r"Last queue length: (\d+)", sdiag)]
    cluster.cancel_all_jobs()
    return {"kept_jobs": n, "renewal_s": [round(t, 3) for t in timings],
            "per_job_ms": round(1000 * statistics.median(timings) / n, 2),
            "slurmctld_usec_per_update_median": statistics.median(usec) if usec else None,
            "scheduler_queue_lengths_main_backfill": queue_lengths}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="keep phase B's sinfo/squeue JSON in this directory")
    parser.add_argument("--phases", default="ABC", help="which phases to run (default: ABC)")
    parser.add_argument("--slurm", default="system", help="system (default), 24.11 or 26.05")
    args = parser.parse_args()
    with LocalCluster(nodes=2, gpus=4, with_dbd=True, horus=True, slurm=args.slurm) as cluster:
        os.environ["PATH"] = cluster.env.get("PATH", os.environ.get("PATH", os.defpath))  # phase D's Mover
        out = {"benchmark": "horusd_live_queue", "cluster": "2 nodes x 4 GPUs, slurmdbd, binding shard",
               "slurm": str(cluster.slurm_version())}
        if "A" in args.phases:
            out["burst"] = phase_burst(cluster)
        if "B" in args.phases:
            if "A" in args.phases:
                out["history_jobs_horusd_read"] = learn_history(cluster)
            out["same_snapshot"] = phase_same_snapshot(cluster, args.save)
        if "C" in args.phases:
            out["kill"] = phase_kill(cluster)
        if "D" in args.phases:
            out["lease_cost"] = phase_lease_cost(cluster)
        out["load_average"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))
    ok = all((out.get("burst", {}).get("started_through_a_horus_decision", 29) >= 29,
              out.get("same_snapshot", {}).get("same_placements", True),
              out.get("kill", {}).get("completed", 0) == out.get("kill", {}).get("jobs", 0),
              out.get("kill", {}).get("last_start_after_kill_s", 0) <= 90))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
