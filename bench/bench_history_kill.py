"""Reliability: kill -9 `horus ingest` and `horus collect` at random points, 50 times each.

After every kill the history database (and the collector's spool) must open and pass
``PRAGMA integrity_check``; after the last kill one undisturbed re-run must leave exactly the rows
the source has:

* ingest: the source is a saved ``sacct --json`` file of BENCH_KILL_JOBS synthetic 22.05 records
  (bench/history_synth.py), so each run parses and writes for a few seconds and the kills land
  anywhere in opening, migrating, parsing and writing; the end state must equal the file's jobs and
  steps, row for row.
* collect: the stand-in NVML with fake GPU job processes (real processes carrying the Slurm GPU
  variables), sampling every 10 ms and shipping every 50 ms into the database; the end state must hold
  every batch the spool recorded, each exactly once.

Kill times are uniform over [0, 1.2 x an undisturbed ingest] and, for the collector (which runs until
killed), over [0, 2 x start-up plus 20 samples]. BENCH_PARTS=ingest or =collect runs one part.
Prints one JSON object.
Reads nothing outside the repository.
"""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from history_synth import SyntheticJobs, finish  # noqa: E402

from slurm_horus.collect.records import JOB_COLUMNS, STEP_COLUMNS, job_rows_from_json  # noqa: E402

KILLS = int(os.environ.get("BENCH_KILLS", 50))
JOBS = int(os.environ.get("BENCH_KILL_JOBS", 20000))
HORUS = [sys.executable, "-m", "slurm_horus.cli"]


def integrity(path):
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def run_and_kill(argv, delay, env=None):
    """Start argv, SIGKILL it after ``delay`` seconds (if still running); return whether it was killed."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def timed(argv, env=None):
    began = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr}")
    return time.perf_counter() - began


def bench_ingest(work, rng):
    source = work / "sacct.json"
    SyntheticJobs(JOBS).write_json(source)
    db = work / "ingest.db"
    argv = HORUS + ["ingest", "--db", str(db), "--from-file", str(source), "--no-progress"]
    reference = timed(argv)
    db.unlink()
    for extra in ("-wal", "-shm"):
        Path(str(db) + extra).unlink(missing_ok=True)
    killed, bad = 0, []
    for number in range(KILLS):
        killed += run_and_kill(argv, rng.uniform(0, 1.2 * reference))
        if db.exists():
            check = integrity(db)
            if check != "ok":
                bad.append((number, check))
    timed(argv)
    jobs, steps = job_rows_from_json(json.loads(source.read_text()))
    conn = sqlite3.connect(db)
    want_jobs = sorted(tuple(j[c] for c in JOB_COLUMNS) for j in jobs)
    have_jobs = sorted(conn.execute(f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs").fetchall())
    want_steps = sorted(tuple(s[c] for c in STEP_COLUMNS) for s in steps)
    have_steps = sorted(conn.execute(f"SELECT {', '.join(STEP_COLUMNS)} FROM steps").fetchall())
    return {"runs": KILLS, "killed_mid_run": killed, "undisturbed_run_s": round(reference, 2),
            "integrity_failures": bad, "jobs": len(have_jobs), "exact_jobs": have_jobs == want_jobs,
            "exact_steps": have_steps == want_steps}


def start_fake_jobs(count):
    procs = []
    for job in range(count):
        env = dict(os.environ, SLURM_JOB_ID=str(7000 + job), SLURMD_NODENAME="killnode",
                   GPU_DEVICE_ORDINAL=str(job % 4), HORUS_FAKE_GPU_UTIL=str(10 + job * 7),
                   HORUS_FAKE_GPU_MEM_MB="1000")
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env))
    return procs


def bench_collect(work, rng):
    db, spool = work / "collect.db", work / "spool.db"
    fakes = start_fake_jobs(6)
    try:
        argv = HORUS + ["collect", "--backend", "standin", "--node", "killnode", "--gpus", "4",
                        "--interval", "0.01", "--ship-every", "0.05", "--spool", str(spool),
                        "--db", str(db)]
        env = dict(os.environ)
        env.pop("SLURM_CONF", None)
        reference = timed(argv + ["--count", "20"], env)  # start-up, 20 samples and the last ship
        killed, bad = 0, []
        for number in range(KILLS):  # the collector runs until killed
            killed += run_and_kill(argv, rng.uniform(0, 2 * reference), env)
            for path in (db, spool):
                if path.exists():
                    check = integrity(path)
                    if check != "ok":
                        bad.append((number, path.name, check))
        timed(HORUS + ["collect", "--ship", "--spool", str(spool), "--db", str(db)], env)
    finally:
        for proc in fakes:
            proc.kill()
            proc.wait()
    queue = sqlite3.connect(spool)
    want_gpu, want_use = set(), set()
    unshipped = queue.execute("SELECT count(*) FROM batches WHERE shipped = 0").fetchone()[0]
    for (payload,) in queue.execute("SELECT payload FROM batches"):
        batch = json.loads(payload)
        want_gpu |= {(g["node"], g["gpu_index"], g["ts"]) for g in batch["gpus"]}
        want_use |= {(u["job_id"], u["node"], u["gpu_index"], u["ts"]) for u in batch["jobs"]}
    conn = sqlite3.connect(db)
    have_gpu = conn.execute("SELECT node, gpu_index, ts FROM gpu_samples").fetchall()
    have_use = conn.execute("SELECT job_id, node, gpu_index, ts FROM job_gpu_use").fetchall()
    return {"runs": KILLS, "killed_mid_run": killed, "undisturbed_run_s": round(reference, 2),
            "integrity_failures": bad, "batches": queue.execute("SELECT count(*) FROM batches").fetchone()[0],
            "unshipped_after_rerun": unshipped, "gpu_rows": len(have_gpu),
            "exact_gpu_rows": sorted(have_gpu) == sorted(want_gpu) and len(have_gpu) == len(set(have_gpu)),
            "exact_job_rows": sorted(have_use) == sorted(want_use)}


def main():
    rng = random.Random(int(os.environ.get("BENCH_SEED", 7)))
    work = Path(tempfile.mkdtemp(prefix="bench-history-kill-"))
    parts = os.environ.get("BENCH_PARTS", "ingest,collect").split(",")
    checks = {"ingest": (bench_ingest, ("jobs", "steps")), "collect": (bench_collect, ("gpu_rows", "job_rows"))}
    figures = {name: checks[name][0](work, rng) for name in parts}
    figures["ok"] = all(figures[name]["exact_" + key] and not figures[name]["integrity_failures"]
                        for name in parts for key in checks[name][1])
    return finish(figures, work)


if __name__ == "__main__":
    sys.exit(main())
