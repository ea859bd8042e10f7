"""Speed of the history path: ingest of 100k sacct job records, `horus report users` over 1M samples.

Goals (issue 7): ingest of 100k records <= 60 s; `horus report users` over 1M GPU samples <= 5 s.
The records are synthetic (bench/history_synth.py: the real 22.05 record of tests/data with ids,
times and users changed, about 12 KB of JSON each) and are served in sacct-sized windows of 5,000
jobs; generating the text is timed apart and not counted. The report is timed as a whole command
(`python -m slurm_horus.cli report users`), start-up included. Prints one JSON object.
Reads nothing outside the repository.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from history_synth import EPOCH, SyntheticJobs, finish, gpu_sample_rows  # noqa: E402

from slurm_horus.collect.ingest import ingest  # noqa: E402
from slurm_horus.collect.records import apply_exit_codes, job_rows_from_json  # noqa: E402
from slurm_horus.store.db import open_db, transaction  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", 100_000))
SAMPLES = int(os.environ.get("BENCH_SAMPLES", 1_000_000))
PER_WINDOW = 5000


class SyntheticSource:
    """Serves the synthetic jobs whose start lies in each window, like sacct would."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.generate_s = 0.0
        self.used = "json"

    def fetch(self, start, end):
        first = max(0, (start - EPOCH) // 30)
        last = min(self.jobs.count, max(first, (end - EPOCH) // 30))
        began = time.perf_counter()
        text, codes = self.jobs.window_text(first, last)
        self.generate_s += time.perf_counter() - began
        jobs, steps = job_rows_from_json(json.loads(text))
        apply_exit_codes(jobs, steps, codes)
        return jobs, steps


def main():
    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    db_path = work / "horus.db"
    db = open_db(db_path)
    synthetic = SyntheticJobs(JOBS)
    source = SyntheticSource(synthetic)
    began = time.perf_counter()
    result = ingest(db, source, since=EPOCH, until=EPOCH + JOBS * 30, window_s=PER_WINDOW * 30,
                    now=EPOCH + JOBS * 30 + 86400)
    ingest_s = time.perf_counter() - began - source.generate_s
    assert result.jobs_seen == JOBS, result
    jobs_in_db = db.execute("SELECT count(*) FROM jobs").fetchone()[0]

    began = time.perf_counter()
    again = ingest(db, source, now=EPOCH + JOBS * 30 + 86400, until=EPOCH + JOBS * 30 + 60)
    reingest_s = time.perf_counter() - began

    use, gpu = gpu_sample_rows(list(range(1, JOBS + 1)), SAMPLES)
    with transaction(db) as conn:
        conn.executemany("INSERT INTO job_gpu_use (job_id, node, gpu_index, ts, sm_util, mem_util, mem_used_mb, "
                         "n_procs, shared) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", use)
        conn.executemany("INSERT INTO gpu_samples (node, gpu_index, ts, uuid, gpu_name, gpu_util, mem_util, "
                         "mem_used_mb, mem_total_mb, job_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", gpu)
    db.conn.close()
    since = time.strftime("%Y-%m-%d", time.localtime(EPOCH - 86400))
    began = time.perf_counter()
    report = subprocess.run([sys.executable, "-m", "slurm_horus.cli", "report", "users", "--db", str(db_path),
                             "--since", since, "--json"], capture_output=True, text=True)
    report_s = time.perf_counter() - began
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["rows"]
    figures = {
        "jobs": JOBS, "jobs_in_db": jobs_in_db, "ingest_s": round(ingest_s, 2),
        "ingest_jobs_per_s": round(JOBS / ingest_s), "ingest_goal_s": 60, "sacct_windows": result.windows,
        "generate_s_not_counted": round(source.generate_s, 2),
        "incremental_rerun_new_jobs": again.jobs_new, "incremental_rerun_s": round(reingest_s, 2),
        "gpu_samples": SAMPLES, "report_users_s": round(report_s, 2), "report_goal_s": 5,
        "report_users_rows": len(rows), "db_mb": round(db_path.stat().st_size / 2 ** 20, 1),
        "ok": ingest_s <= 60 and report_s <= 5 and jobs_in_db == JOBS and again.jobs_new == 0,
    }
    return finish(figures, work)


if __name__ == "__main__":
    sys.exit(main())
