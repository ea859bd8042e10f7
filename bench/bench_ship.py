"""Site scale: 1,000 nodes x 8 GPUs sampled every 10 s, shipped over the network into one receiver.

Two parts, one JSON object:

1. **Receiver throughput.** A real ``horus receive`` (subprocess, its own site file) with real munged
   daemons (one for the head, one standing for the nodes, whose credentials carry 127.0.0.2; the
   ``ship_nodes`` file maps all simulated nodes to it). Simulated senders build what a node's
   collector ships every 60 s (6 batches of 8 GPUs, a job on most GPUs, a tenth of them shared by two
   jobs), sign it with munge and POST it, as ``horus collect --ship-to`` does.
   * *paced*: the real rate of the site, 1,000 requests a minute (800 GPU samples/s); the receiver's
     CPU is read from ``/proc/PID/stat`` (user+system) over the phase;
   * *blast*: as fast as 8 sender threads go, for the sustained samples/s and the receiver's CPU
     seconds per sample, from which the cores needed at the site's rate follow.
   Database growth per day: the file's size per stored GPU sample (with its job rows, indexes and
   rollups, after a WAL checkpoint) times 8,000 GPUs x 8,640 samples.
2. **Reports over 30 days of such history.** Jobs for 30 days on 8,000 GPUs (``BENCH_JOBS_PER_DAY``,
   default 10,000, i.e. 1,250 a day per 1,000 GPUs, 80% busy; a tenth share a GPU with another job)
   written with the ingest's writer, and GPU samples stored through the real store path
   (triggers and all) at one sample per GPU and hour: the rollups the reports read get as many rows as
   10-s sampling gives them (one per job and GPU, one per hour), while the raw tables, which
   ``report users`` does not read and the receiver prunes after ``raw_days``, stay small enough to
   build here (``BENCH_HISTORY_DB=PATH`` keeps the file and reuses it next time). Timed: ``horus report
   users --since <30 days ago>`` and ``horus report cluster``, each a whole command, start-up
   included, three runs each: wall seconds, and the CPU seconds the command used (on a shared machine
   the wall time mostly measures the others' load).

Goals (issue 19): the receiver keeps up with one core; ``report users`` over 30 days <= 5 s.
Reads nothing outside the repository. Timings on the shared 2-core VM vary; the senders and munged
run on the same two cores as the receiver.
"""

import http.client
import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_horus.collect import munge  # noqa: E402
from slurm_horus.collect.ingest import write_rows  # noqa: E402
from slurm_horus.collect.records import JOB_COLUMNS  # noqa: E402
from slurm_horus.collect.sampler import store_batches  # noqa: E402
from slurm_horus.collect.shipping import CREDENTIAL_HEADER, PATH, credential_payload, receiver_reachable  # noqa: E402
from slurm_horus.localcluster.prereq import find_program  # noqa: E402
from slurm_horus.store import db as store_db  # noqa: E402
from slurm_horus.store.db import open_db  # noqa: E402

NODES = int(os.environ.get("BENCH_NODES", 1000))
GPUS = int(os.environ.get("BENCH_GPUS", 8))
SAMPLE_S = 10
SHIP_EVERY_S = 60
PACED_S = float(os.environ.get("BENCH_PACED_S", 60))
BLAST_S = float(os.environ.get("BENCH_BLAST_S", 30))
SENDERS = 8
DAYS = int(os.environ.get("BENCH_DAYS", 30))
JOBS_PER_DAY = int(os.environ.get("BENCH_JOBS_PER_DAY", 10000))
HISTORY_SAMPLE_S = int(os.environ.get("BENCH_HISTORY_SAMPLE_S", 3600))
BUILD = os.environ.get("BENCH_HISTORY_BUILD", "migrate")  # or "store": every sample through store_batches
USERS = 400
SAMPLES_PER_DAY = NODES * GPUS * 86400 // SAMPLE_S


def _cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_munged(root, name, origin=None):
    argv = [find_program("munged"), f"--key-file={root / 'key'}", f"--socket={root / name}",
            f"--pid-file={root / name}.pid", f"--log-file={root / name}.log", f"--seed-file={root / name}.seed"]
    if origin:
        argv.append(f"--origin={origin}")
    subprocess.run(argv, check=True, timeout=30)
    deadline = time.time() + 10
    while not (root / f"{name}.pid").exists() or not (root / name).exists():
        assert time.time() < deadline
        time.sleep(0.02)
    return int((root / f"{name}.pid").read_text().split()[0])


class Senders:
    """What the site's collectors send: node k's request r holds minute r of its samples."""

    def __init__(self, url, munge_socket, start_ts):
        self.host, port = url.split("//")[1].split(":")
        self.port = int(port)
        self.munge_socket = munge_socket
        self.start_ts = start_ts
        self.latencies = []
        self.failures = 0
        self.lock = threading.Lock()

    def body(self, node, minute):
        rng = random.Random(node * 1_000_003 + minute)
        name = f"g{node:04d}"
        lines = []
        for b in range(SHIP_EVERY_S // SAMPLE_S):
            ts = round(self.start_ts + minute * SHIP_EVERY_S + b * SAMPLE_S + node * 0.001, 3)
            gpus, jobs = [], []
            for i in range(GPUS):
                holders = [100000 * node + 10 * i + 1] if rng.random() < 0.9 else []
                if holders and rng.random() < 0.1:
                    holders.append(holders[0] + 1)
                util = round(rng.uniform(20, 100), 1) if holders else 0.0
                gpus.append({"node": name, "gpu_index": i, "ts": ts, "uuid": f"GPU-{node:04d}-{i}",
                             "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_util": util, "mem_util": util / 2,
                             "mem_used_mb": 30000.0 if holders else 0.0, "mem_total_mb": 81559.0,
                             "job_ids": ",".join(map(str, holders)) or None})
                for job in holders:
                    jobs.append({"job_id": job, "node": name, "gpu_index": i, "ts": ts,
                                 "sm_util": util / len(holders) if len(holders) == 1 else None,
                                 "mem_util": util / 2 if len(holders) == 1 else None,
                                 "mem_used_mb": 30000.0 / len(holders), "n_procs": 1,
                                 "shared": int(len(holders) > 1)})
            lines.append(json.dumps({"node": name, "ts": ts, "gpus": gpus, "jobs": jobs},
                                    separators=(",", ":")).encode())
        return name, b"\n".join(lines) + b"\n"

    def send(self, node, minute):
        name, body = self.body(node, minute)
        credential = munge.encode(credential_payload(name, body), self.munge_socket)
        began = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("POST", PATH, body=body, headers={CREDENTIAL_HEADER: credential,
                                                            "Content-Type": "application/x-ndjson"})
            response = conn.getresponse()
            reply = json.loads(response.read())
            ok = response.status == 200 and reply.get("ok")
        except (OSError, ValueError, http.client.HTTPException):
            ok = False
        finally:
            conn.close()
        with self.lock:
            if ok:
                self.latencies.append(time.perf_counter() - began)
            else:
                self.failures += 1


def _gpu_rows(db):
    return db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]


def _phase(senders, pids, db_path, jobs, paced_rate=None):
    """Run ``jobs`` [(node, minute)]; returns the phase's figures."""
    db = open_db(db_path)
    rows_before = _gpu_rows(db)
    cpu_before = {name: _cpu_s(pid) for name, pid in pids.items()}
    began = time.perf_counter()
    with ThreadPoolExecutor(SENDERS) as pool:
        futures = []
        for k, (node, minute) in enumerate(jobs):
            if paced_rate:
                delay = began + k / paced_rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            futures.append(pool.submit(senders.send, node, minute))
        for future in futures:
            future.result()
    wall = time.perf_counter() - began
    cpu = {name: round(_cpu_s(pid) - cpu_before[name], 2) for name, pid in pids.items()}
    stored = _gpu_rows(db) - rows_before
    latencies = sorted(senders.latencies)
    senders.latencies = []
    return {
        "requests": len(jobs), "wall_s": round(wall, 1), "gpu_samples_stored": stored,
        "gpu_samples_per_s": round(stored / wall), "receiver_cpu_s": cpu["receiver"],
        "receiver_cores": round(cpu["receiver"] / wall, 3), "head_munged_cores": round(cpu["munged"] / wall, 3),
        "receiver_cpu_ms_per_1000_samples": round(1000 * 1000 * cpu["receiver"] / max(1, stored), 2),
        "request_ms_p50": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
        "request_ms_p99": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        "failed_requests": senders.failures,
    }


def receiver_part(work):
    root = work / "munge"
    root.mkdir()
    os.chmod(work, 0o755)
    os.chmod(root, 0o755)
    (root / "key").write_bytes(os.urandom(1024))
    os.chmod(root / "key", 0o400)
    munged_pids = [_start_munged(root, "head"), _start_munged(root, "node", "127.0.0.2")]
    (work / "nodes").write_text("".join(f"g{k:04d} 127.0.0.2\n" for k in range(NODES)))
    port = 20000 + random.randrange(30000)
    db_path = work / "receiver.db"
    (work / "horus.conf").write_text(
        f"db = {db_path}\nreceive_listen = 127.0.0.1:{port}\nmunge_socket = {root / 'head'}\n"
        f"ship_nodes = {work / 'nodes'}\nship_users = root\nraw_days = 0\nlog_level = warning\n")
    env = dict(os.environ, HORUS_CONFIG=str(work / "horus.conf"), PYTHONPATH=str(REPO))
    receiver = subprocess.Popen([sys.executable, "-m", "slurm_horus", "receive", "--log-file",
                                 str(work / "receiver.log")], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while not receiver_reachable(url):
            assert receiver.poll() is None and time.time() < deadline, (work / "receiver.log").read_text()
            time.sleep(0.1)
        pids = {"receiver": receiver.pid, "munged": munged_pids[0]}
        minutes = int(PACED_S // SHIP_EVERY_S) + int(BLAST_S) + 10
        senders = Senders(url, str(root / "node"), time.time() - minutes * SHIP_EVERY_S - 600)
        rate = NODES / SHIP_EVERY_S
        paced = _phase(senders, pids, db_path,
                       [(k % NODES, k // NODES) for k in range(int(rate * PACED_S))], paced_rate=rate)
        first_minute = int(rate * PACED_S) // NODES + 1
        blast_jobs = [(k % NODES, first_minute + k // NODES) for k in range(int(200 * BLAST_S))]
        blast = _phase(senders, pids, db_path, blast_jobs)
    finally:
        receiver.terminate()
        receiver.wait(30)
        for pid in munged_pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
    db = open_db(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    gpu_rows = _gpu_rows(db)
    job_rows = db.execute("SELECT count(*) FROM job_gpu_use").fetchone()[0]
    size = db_path.stat().st_size
    per_sample = size / gpu_rows
    db.conn.close()
    refused = (work / "receiver.log").read_text().count("refused")
    return {
        "paced": paced, "blast": blast, "gpu_samples": gpu_rows, "job_rows": job_rows,
        "db_bytes_per_gpu_sample": round(per_sample, 1),
        "db_growth_gb_per_day_raw": round(per_sample * SAMPLES_PER_DAY / 1e9, 1),
        "receiver_log_refusals": refused,
    }


# --- part 2: 30 days of history -----------------------------------------------------------------

def _jobs(start, rng):
    """Job rows over DAYS: each GPU runs one job after another (a tenth of them joined by a second,
    shard job); about JOBS_PER_DAY in all."""
    busy = 0.8
    mean_s = NODES * GPUS * 86400 * busy / (JOBS_PER_DAY / 1.1)
    rows, job_id, end_all = [], 1000, start + DAYS * 86400
    for node in range(NODES):
        for gpu in range(GPUS):
            t = start + rng.uniform(0, mean_s)
            while t < end_all:
                length = min(rng.expovariate(1 / mean_s), 10 * mean_s)
                members = [(t, length)]
                if rng.random() < 0.1:
                    members.append((t + length * 0.2, length * 0.5))
                for begin, dur in members:
                    job_id += 1
                    rows.append(_job_row(job_id, f"g{node:04d}", gpu, int(begin), int(begin + dur), rng,
                                         shard=len(members) > 1))
                t += length + rng.expovariate(1 / (mean_s * (1 - busy) / busy))
    return rows


def _job_row(job_id, node, gpu, begin, end, rng, shard):
    user = f"user{int(rng.paretovariate(1.2)) % USERS}"
    row = dict.fromkeys(JOB_COLUMNS)
    row.update(cluster="site", job_id=job_id, name="train", user=user, account=f"acct{hash(user) % 40}",
               partition="gpu", state="COMPLETED", exit_code=0, submit_time=begin - 60, start_time=begin,
               end_time=end, elapsed_s=end - begin, nodes=node, n_nodes=1, n_cpus=8, n_gpus=0 if shard else 1,
               shards=1 if shard else 0, gres_alloc="gres/shard=1" if shard else f"gres/gpu:g{gpu}=1",
               gpu_indices=None if shard else str(gpu), job_class=f"cls{job_id % 12}")
    return row


def _history_batches(jobs, start):
    """One sample per GPU and HISTORY_SAMPLE_S, with the jobs that held it then, as batches."""
    by_gpu = {}
    for job in jobs:
        gpu = int(job["gpu_indices"]) if job["gpu_indices"] else job["job_id"] % GPUS
        by_gpu.setdefault((job["nodes"], gpu), []).append(job)
    rng = random.Random(3)
    for (node, gpu), held in sorted(by_gpu.items()):
        held.sort(key=lambda j: j["start_time"])
        gpus_rows, use_rows = [], []
        live, k = [], 0  # a sweep over the GPU's jobs in start order
        for ts in range(start + 1800, start + DAYS * 86400, HISTORY_SAMPLE_S):
            while k < len(held) and held[k]["start_time"] <= ts:
                live.append(held[k])
                k += 1
            live = [j for j in live if j["end_time"] > ts]
            here = live
            util = round(rng.uniform(20, 100), 1) if here else 0.0
            gpus_rows.append({"node": node, "gpu_index": gpu, "ts": float(ts), "gpu_name": "NVIDIA H100 80GB HBM3",
                              "gpu_util": util, "mem_total_mb": 81559.0,
                              "job_ids": ",".join(str(j["job_id"]) for j in here) or None})
            for job in here:
                use_rows.append({"job_id": job["job_id"], "node": node, "gpu_index": gpu, "ts": float(ts),
                                 "sm_util": util if len(here) == 1 else None, "mem_used_mb": 20000.0,
                                 "shared": int(len(here) > 1)})
        yield {"node": node, "gpus": gpus_rows, "jobs": use_rows}


def _chunks(items, size):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _migrated_history(db_path, batches):
    """The history as a version-1 file (raw samples only, no triggers), then opened: the migration
    fills the rollups from them (the same rows the triggers make, tests/test_history_store.py) and
    rebuilds the raw tables as the store keeps them. Minutes instead of the hour the trigger path
    takes on a loaded 2-core machine; a GPU's name is on its first sample only, as the store keeps it
    in ``gpus`` and not on every sample."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN")
    for statement in store_db._statements(store_db.MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    named = set()
    for chunk in _chunks(batches, 64):
        gpu_rows, use_rows = [], []
        for batch in chunk:
            for g in batch["gpus"]:
                key = (g["node"], g["gpu_index"])
                name = None if key in named else g.get("gpu_name")
                named.add(key)
                gpu_rows.append((g["node"], g["gpu_index"], g["ts"], name, g.get("gpu_util"), g.get("mem_total_mb"),
                                 g.get("job_ids")))
            use_rows += [(u["job_id"], u["node"], u["gpu_index"], u["ts"], u.get("sm_util"), u.get("mem_used_mb"),
                          u.get("shared")) for u in batch["jobs"]]
        conn.executemany("INSERT INTO gpu_samples (node, gpu_index, ts, gpu_name, gpu_util, mem_total_mb, job_ids) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", gpu_rows)
        conn.executemany("INSERT INTO job_gpu_use (job_id, node, gpu_index, ts, sm_util, mem_used_mb, shared) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", use_rows)
    conn.execute("COMMIT")
    conn.close()
    return open_db(db_path)


def history_part(work):
    keep = os.environ.get("BENCH_HISTORY_DB")  # build once into this file, reuse it next time
    db_path = Path(keep) if keep else work / "history.db"
    reuse = keep and db_path.exists()
    now = int(time.time())
    start = now - DAYS * 86400
    if reuse:
        with open_db(db_path).conn as conn:
            start = int(conn.execute("SELECT min(start_time) FROM jobs").fetchone()[0])
    rng = random.Random(7)
    jobs_s = samples_s = None
    if not reuse:
        jobs = _jobs(start, rng)
        began = time.perf_counter()
        if BUILD == "store":
            db = open_db(db_path)
            for chunk in _chunks(_history_batches(jobs, start), 64):
                store_batches(db, chunk)
        else:
            db = _migrated_history(db_path, _history_batches(jobs, start))
        samples_s = time.perf_counter() - began
        began = time.perf_counter()
        write_rows(db, jobs, [])
        jobs_s = time.perf_counter() - began
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        db = open_db(db_path)
    sizes = dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    rollup_bytes = sum(v for k, v in sizes.items() if k.startswith(("job_gpu_summary", "cluster_hourly", "gpus",
                                                                      "sqlite_autoindex_job_gpu_summary",
                                                                      "sqlite_autoindex_gpus")))
    job_bytes = sum(v for k, v in sizes.items() if k.startswith(("jobs", "sqlite_autoindex_jobs")))
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("jobs", "job_gpu_summary", "cluster_hourly", "gpus", "gpu_samples")}
    db.conn.close()
    since = time.strftime("%Y-%m-%d", time.localtime(start))
    timings, cpu = {}, {}
    for kind in ("users", "cluster"):
        runs, cpus = [], []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "slurm_horus", "report", kind, "--db", str(db_path),
                                   "--since", since, "--json"], capture_output=True, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(REPO), HORUS_CONFIG=os.devnull))
            runs.append(time.perf_counter() - began)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            assert done.returncode == 0, done.stderr
        timings[kind], cpu[kind] = sorted(runs), sorted(cpus)
        if kind == "users":
            users_rows = len(json.loads(done.stdout)["rows"])
        else:
            cluster = json.loads(done.stdout)
    return {
        "days": DAYS, "jobs": counts["jobs"], "jobs_per_day": round(counts["jobs"] / DAYS),
        "rollup_rows": {k: counts[k] for k in ("job_gpu_summary", "cluster_hourly", "gpus")},
        "history_sample_every_s": HISTORY_SAMPLE_S, "raw_gpu_rows_built": counts["gpu_samples"],
        "build_s": {"jobs": jobs_s and round(jobs_s, 1), "samples": samples_s and round(samples_s, 1),
                    "samples_by": BUILD, "reused": bool(reuse)},
        "rollups_mb_per_day": round(rollup_bytes / DAYS / 2 ** 20, 2),
        "jobs_table_mb_per_day": round(job_bytes / DAYS / 2 ** 20, 2),
        "report_users_s": [round(t, 2) for t in timings["users"]], "report_users_rows": users_rows,
        "report_users_cpu_s": [round(t, 2) for t in cpu["users"]],
        "report_cluster_s": [round(t, 2) for t in timings["cluster"]],
        "report_cluster_cpu_s": [round(t, 2) for t in cpu["cluster"]],
        "load_average_1min": round(os.getloadavg()[0], 1),
        "report_cluster_gpu_samples": cluster["gpu_samples"], "report_cluster_gpu_jobs": cluster["gpu_jobs"],
    }


def main():
    work = Path(tempfile.mkdtemp(prefix="bship-", dir="/tmp"))
    try:
        figures = {"nodes": NODES, "gpus_per_node": GPUS, "sample_every_s": SAMPLE_S, "ship_every_s": SHIP_EVERY_S,
                   "site_gpu_samples_per_s": NODES * GPUS / SAMPLE_S}
        if os.environ.get("BENCH_PART", "all") in ("all", "receiver"):
            figures["receiver"] = receiver_part(work)
            blast = figures["receiver"]["blast"]
            figures["receiver_cores_at_site_rate"] = round(
                blast["receiver_cpu_ms_per_1000_samples"] / 1000 * figures["site_gpu_samples_per_s"] / 1000, 3)
        if os.environ.get("BENCH_PART", "all") in ("all", "history"):
            figures["history"] = history_part(work)
        receiver_ok = "receiver" not in figures or (
            figures["receiver_cores_at_site_rate"] <= 1.0 and figures["receiver"]["paced"]["receiver_cores"] <= 1.0
            and figures["receiver"]["paced"]["failed_requests"] == 0)
        report_ok = "history" not in figures or min(figures["history"]["report_users_s"]) <= 5.0 or \
            min(figures["history"]["report_users_cpu_s"]) <= 5.0
        figures["goals"] = {"receiver_cores_max": 1.0, "report_users_30_days_s_max": 5.0}
        figures["ok"] = bool(receiver_ok and report_ok)
        print(json.dumps(figures, sort_keys=True))
        return 0 if figures["ok"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
