"""``horus ingest``: copy sacct's jobs and steps into the history store, incrementally and idempotently.

* Incremental: the store remembers the latest end time of a finished job it ingested (per cluster,
  ``meta`` key ``ingest.watermark``); the next run asks sacct from there (less a safety margin for
  records slurmdbd stores late) up to now.
* Idempotent: rows are keyed by (cluster, job_id) and (cluster, job_id, step_id) and replaced, and a
  job's steps are rewritten with it, so re-running (or running again after a kill) adds nothing twice.
* Crash-safe: every batch is one SQLite transaction, and the watermark only moves after a whole
  sacct window is committed, so a kill -9 at any point is repaired by the next run.
* Long ranges are split into windows (one sacct call each, sized to the job rate) with progress.

Sources: ``sacct --json`` (any supported Slurm: 22.05, 24.11, 26.05), falling back to ``sacct -P`` when
``--json`` is unavailable, or a saved file of either form (``--from-file``).
"""

import time
from dataclasses import dataclass

from ..errors import InputError
from ..store.db import get_meta, set_meta, transaction
from ..slurm.acct import PARSABLE_DELIMITER, PARSABLE_FIELDS
from .records import (
    JOB_COLUMNS, STEP_COLUMNS, TERMINAL_STATES, apply_decision_token, apply_exit_codes, apply_usage,
    drop_decision_token, job_rows_from_json, job_rows_from_parsable,
)

WATERMARK_KEY = "ingest.watermark"
DEFAULT_FIRST_DAYS = 30
DEFAULT_WINDOW_S = 7 * 86400
DEFAULT_MARGIN_S = 300
BATCH_JOBS = 5000
WINDOW_JOBS = 20000  # aim for about this many jobs per sacct call
MIN_WINDOW_S = 600


def sacct_time(epoch):
    """sacct's -S/-E format (local time)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


class SacctSource:
    """Runs sacct through ``slurm_horus.slurm`` (the only room that runs Slurm commands)."""

    def __init__(self, slurm_conf=None, mode="auto"):
        self.slurm_conf = slurm_conf
        self.mode = mode  # "auto" | "json" | "parsable"
        self.used = None

    def _run(self, argv):
        from ..slurm.runner import run_slurm

        return run_slurm(argv, slurm_conf=self.slurm_conf, timeout=600)

    def fetch(self, start, end):
        window = ["-a", "-S", sacct_time(start), "-E", sacct_time(end)]
        if self.mode in ("auto", "json") and self.used != "parsable":
            from ..slurm.runner import SlurmCommandError

            try:
                result = self._run(["sacct", "--json"] + window)
                jobs, steps = job_rows_from_json(result.stdout)
                codes = self._run(["sacct", "-P", "-n", "-o", "JobIDRaw,ExitCode"] + window)
                apply_exit_codes(jobs, steps, codes.stdout)
                self.used = "json"
                return jobs, steps
            except (SlurmCommandError, InputError) as exc:
                if self.mode == "json":
                    raise InputError(f"sacct --json failed: {exc}") from None
                self.used = "parsable"  # e.g. a build without the openapi plugin
        result = self._run(
            ["sacct", "-P", "-n", f"--delimiter={PARSABLE_DELIMITER}", "-o", ",".join(PARSABLE_FIELDS)]
            + window
        )
        self.used = "parsable"
        jobs, steps = job_rows_from_parsable(result.stdout)
        usage = self._run(["sacct", "-P", "-n", "-o", "JobIDRaw,TotalCPU,MaxRSS"] + window)
        apply_usage(jobs, usage.stdout)
        return jobs, steps


class FileSource:
    """A saved ``sacct --json`` or ``sacct -P`` (with PARSABLE_FIELDS) output, as one window."""

    def __init__(self, path):
        self.path = str(path)
        self.used = None

    def fetch(self, start, end):
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError as exc:
            raise InputError(f"cannot read {self.path}: {exc.strerror}") from None
        if text.lstrip().startswith("{"):
            try:
                rows = job_rows_from_json(text)
            except InputError as exc:
                raise InputError(f"{self.path}: not valid sacct JSON: {exc}") from None
            self.used = "json"
            return rows
        self.used = "parsable"
        return job_rows_from_parsable(text, source=self.path)


@dataclass
class IngestResult:
    windows: int = 0
    jobs_seen: int = 0
    steps_seen: int = 0
    jobs_new: int = 0
    watermark: int = None
    source: str = None

    def as_dict(self):
        return dict(self.__dict__)


def _watermark_key(cluster):
    return f"{WATERMARK_KEY}.{cluster}" if cluster else WATERMARK_KEY


def watermark(db, cluster=""):
    value = get_meta(db, _watermark_key(cluster))
    return int(value) if value is not None else None


_JOB_SQL = "INSERT OR REPLACE INTO jobs ({}, ingested_at) VALUES ({}, ?)".format(
    ", ".join(JOB_COLUMNS), ", ".join("?" * len(JOB_COLUMNS))
)
_STEP_SQL = "INSERT OR REPLACE INTO steps ({}) VALUES ({})".format(
    ", ".join(STEP_COLUMNS), ", ".join("?" * len(STEP_COLUMNS))
)


def known_decisions(db, decision_ids):
    """The ids among ``decision_ids`` that horusd recorded in the history's ``decisions`` table."""
    ids, known = sorted(set(decision_ids)), set()
    for offset in range(0, len(ids), 500):
        chunk = ids[offset: offset + 500]
        known.update(row[0] for row in db.execute(
            f"SELECT decision_id FROM decisions WHERE decision_id IN ({','.join('?' * len(chunk))})", chunk))
    return known


def verify_tokens(db, jobs):
    """Believe a job's ``horus:`` token only when its decision is in the history (AdminComment is
    written by job_submit.lua, but a copied or made-up token must not name GPUs or classes)."""
    known = known_decisions(db, [job["horus_id"] for job in jobs if job.get("horus_id")])
    for job in jobs:
        if job.get("horus_id") in known:
            apply_decision_token(job)
        elif job.get("horus_id") or job.get("horus_tokens"):
            drop_decision_token(job)


def write_rows(db, jobs, steps, now=None):
    """Upsert job rows (tokens verified) and replace their steps, in batches of BATCH_JOBS (one
    transaction each)."""
    now = int(now if now is not None else time.time())
    verify_tokens(db, jobs)
    steps_by_job = {}
    for step in steps:
        steps_by_job.setdefault((step["cluster"], step["job_id"]), []).append(step)
    for offset in range(0, len(jobs), BATCH_JOBS):
        batch = jobs[offset: offset + BATCH_JOBS]
        keys = [(job["cluster"], job["job_id"]) for job in batch]
        with transaction(db) as conn:
            conn.executemany(_JOB_SQL, [tuple(job[c] for c in JOB_COLUMNS) + (now,) for job in batch])
            conn.executemany("DELETE FROM steps WHERE cluster = ? AND job_id = ?", keys)
            conn.executemany(
                _STEP_SQL,
                [tuple(step[c] for c in STEP_COLUMNS) for key in keys for step in steps_by_job.get(key, ())],
            )


def _count_jobs(db):
    return db.execute("SELECT count(*) FROM jobs").fetchone()[0]


def ingest(db, source, since=None, until=None, cluster="", window_s=DEFAULT_WINDOW_S,
           margin_s=DEFAULT_MARGIN_S, progress=None, now=None):
    """Ingest sacct records into ``db``; returns an :class:`IngestResult`.

    ``since`` (epoch) overrides the stored watermark; without either, the last DEFAULT_FIRST_DAYS
    days are read. Windows start at ``window_s`` and adapt to the job rate.
    ``progress(fraction_of_range_done, windows, jobs_seen)`` is called after each window.
    """
    now = int(now if now is not None else time.time())
    until = int(until if until is not None else now)
    mark = watermark(db, cluster)
    if since is None:
        since = mark - margin_s if mark is not None else now - DEFAULT_FIRST_DAYS * 86400
    since = int(since)
    if since >= until:
        since = until - 1
    result = IngestResult(watermark=mark)
    before = _count_jobs(db)
    start, size = since, int(window_s)
    while start < until:
        end = min(until, start + size)
        jobs, steps = source.fetch(start, end)
        write_rows(db, jobs, steps, now=now)
        ends = [j["end_time"] for j in jobs if j["state"] in TERMINAL_STATES and j["end_time"]]
        if ends:
            newest = min(max(ends), end)
            if result.watermark is None or newest > result.watermark:
                result.watermark = newest
                with transaction(db) as conn:
                    set_meta(conn, _watermark_key(cluster), newest)
        result.windows += 1
        result.jobs_seen += len(jobs)
        result.steps_seen += len(steps)
        if progress is not None:
            progress((end - since) / (until - since), result.windows, result.jobs_seen)
        # Adapt the window to the job rate: quiet years pass in a few calls, busy days are split.
        if len(jobs) < WINDOW_JOBS // 4:
            size *= 2
        elif len(jobs) > WINDOW_JOBS:
            size = max(MIN_WINDOW_S, size // 2)
        start = end
    result.jobs_new = _count_jobs(db) - before
    result.source = getattr(source, "used", None)
    return result
