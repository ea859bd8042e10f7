"""The history database: one SQLite file, WAL mode, schema versioned by ``PRAGMA user_version``.

Opening the database migrates it: each entry of :data:`MIGRATIONS` moves the schema one version up,
and all pending entries run in one transaction, so a crash mid-migration leaves the previous version
intact and processes opening a new file at the same moment do not trip over each other. Only the head
node writes this file (collectors spool locally and ship, see ``slurm_horus.collect``): SQLite over
NFS from many writers is exactly what this layout avoids.
"""

import os
import sqlite3
import time
from pathlib import Path

import sqlite_utils

from ..errors import HorusError
from ..private import make_private

BUSY_TIMEOUT_MS = 30000

# Version 1: the tables of the history issue. Keys are natural keys, so every writer can use
# INSERT OR REPLACE / OR IGNORE and a re-run after a crash adds nothing twice.
_SCHEMA_V1 = """
CREATE TABLE jobs (
    cluster TEXT NOT NULL,
    job_id INTEGER NOT NULL,
    array_job_id INTEGER,
    array_task_id INTEGER,
    name TEXT,
    user TEXT,
    account TEXT,
    partition TEXT,
    qos TEXT,
    state TEXT,
    exit_code INTEGER,
    exit_signal INTEGER,
    submit_time INTEGER,
    start_time INTEGER,
    end_time INTEGER,
    elapsed_s INTEGER,
    time_limit_min INTEGER,
    nodes TEXT,
    n_nodes INTEGER,
    n_cpus INTEGER,
    mem_mb REAL,
    n_gpus INTEGER,
    gres_alloc TEXT,
    gres_req TEXT,
    gpu_indices TEXT,
    shards INTEGER,
    comment TEXT,
    admin_comment TEXT,
    horus_id TEXT,
    horus_tokens TEXT,
    job_class TEXT,
    ingested_at INTEGER,
    PRIMARY KEY (cluster, job_id)
);
CREATE INDEX jobs_end ON jobs (end_time);
CREATE INDEX jobs_start ON jobs (start_time);
CREATE INDEX jobs_user ON jobs (user);
CREATE INDEX jobs_class ON jobs (job_class);

CREATE TABLE steps (
    cluster TEXT NOT NULL,
    job_id INTEGER NOT NULL,
    step_id TEXT NOT NULL,
    name TEXT,
    state TEXT,
    exit_code INTEGER,
    exit_signal INTEGER,
    start_time INTEGER,
    end_time INTEGER,
    elapsed_s INTEGER,
    nodes TEXT,
    tres_alloc TEXT,
    PRIMARY KEY (cluster, job_id, step_id)
);

CREATE TABLE gpu_samples (
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    ts REAL NOT NULL,
    uuid TEXT,
    gpu_name TEXT,
    gpu_util REAL,
    mem_util REAL,
    mem_used_mb REAL,
    mem_total_mb REAL,
    job_ids TEXT,
    PRIMARY KEY (node, gpu_index, ts)
);
CREATE INDEX gpu_samples_ts ON gpu_samples (ts);

CREATE TABLE job_gpu_use (
    job_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    ts REAL NOT NULL,
    sm_util REAL,
    mem_util REAL,
    mem_used_mb REAL,
    n_procs INTEGER,
    shared INTEGER,
    PRIMARY KEY (job_id, node, gpu_index, ts)
);
CREATE INDEX job_gpu_use_gpu ON job_gpu_use (node, gpu_index, ts);

CREATE TABLE decisions (
    decision_id TEXT PRIMARY KEY,
    ts REAL,
    job_id INTEGER,
    job_class TEXT,
    user TEXT,
    policy TEXT,
    mode TEXT,
    nodes TEXT,
    gpus TEXT,
    predicted_slowdown REAL,
    corunners TEXT,
    detail TEXT
);
CREATE INDEX decisions_job ON decisions (job_id);

CREATE TABLE observations (
    cluster TEXT NOT NULL,
    job_id INTEGER NOT NULL,
    corunner_job_id INTEGER NOT NULL,
    gpu_type TEXT NOT NULL,
    job_class TEXT NOT NULL,
    corunner_class TEXT NOT NULL,
    norm_tput REAL NOT NULL,
    overlap_s REAL,
    elapsed_s REAL,
    solo_elapsed_s REAL,
    util_shared REAL,
    util_solo REAL,
    derived_at INTEGER,
    PRIMARY KEY (cluster, job_id, corunner_job_id)
);
CREATE INDEX observations_pair ON observations (gpu_type, job_class, corunner_class);

CREATE TABLE models (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    created TEXT NOT NULL,
    json TEXT NOT NULL,
    origin TEXT,
    n_observations INTEGER,
    error_before REAL,
    error_after REAL
);

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
"""

# Version 2: what seff/reportseff show per job: CPU time used (sacct TotalCPU, the sum over steps)
# and the largest resident memory of any step (MaxRSS), for CPU and host-memory efficiency.
_SCHEMA_V2 = """
ALTER TABLE jobs ADD COLUMN cpu_time_s REAL;
ALTER TABLE jobs ADD COLUMN max_rss_mb REAL;
CREATE INDEX jobs_array ON jobs (array_job_id, array_task_id)
"""

MIGRATIONS = [_SCHEMA_V1, _SCHEMA_V2]
SCHEMA_VERSION = len(MIGRATIONS)


def _migrate(conn):
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    # executescript() would COMMIT first and run each statement on its own; one explicit transaction
    # keeps the migration all-or-nothing. The version is read again under the write lock: several
    # processes (collectors, ingest) may open a new file at the same moment.
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HorusError(
                f"history database schema version {version} is newer than this slurm-horus "
                f"understands ({SCHEMA_VERSION}); upgrade slurm-horus"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _statements(MIGRATIONS[target - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _statements(script):
    """Split a schema script into statements (the schema holds no ';' inside literals)."""
    return [part.strip() for part in script.split(";") if part.strip()]


def _while_locked(step, timeout_s=BUSY_TIMEOUT_MS / 1000):
    """Run ``step``; retry it while SQLite reports the database locked, up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def open_db(path, create=True):
    """Open (creating and migrating as needed) the history database at ``path``.

    Returns a :class:`sqlite_utils.Database`. ``path`` may be ``":memory:"`` for a throw-away store.
    ``create=False`` (readers: reports, ``horus model classes``) refuses a path where no database
    exists instead of creating one, and its directory, there.
    """
    if not create and str(path) != ":memory:" and not os.path.isfile(path):
        raise HorusError(f"no history database at {path} (`horus ingest` and `horus collect` create it; "
                         "or give --db)")
    if str(path) != ":memory:":
        parent = Path(path).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HorusError(f"cannot create directory {parent} for the history database: {exc.strerror}")
        make_private(path)  # 0640, and so its -wal and -shm: it names every user's jobs
    try:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch is one transaction.
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if str(path) != ":memory:":
            # switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
            # locked" at once (no busy handler) while another process creates or migrates the file
            _while_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
        # NORMAL is durable against process crashes in WAL mode (only power loss may lose the last
        # transactions), which is the failure the kill -9 benchmark exercises.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        _while_locked(lambda: _migrate(conn))
    except sqlite3.DatabaseError as exc:
        raise HorusError(f"history database {path}: {exc}") from None
    return sqlite_utils.Database(conn)


def schema_version(db):
    return db.execute("PRAGMA user_version").fetchone()[0]


def default_db_path(config=None):
    """The ``db`` setting of the site config (flag > HORUS_DB > horus.conf > default)."""
    if config is None:
        from ..config import load_config

        config = load_config()
    return os.path.expanduser(config.db)


class transaction:
    """``with transaction(db):`` -- BEGIN IMMEDIATE ... COMMIT, ROLLBACK on any error."""

    def __init__(self, db):
        self.conn = db.conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("ROLLBACK")
        return False


def get_meta(db, key, default=None):
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return default if row is None else row[0]


def set_meta(conn, key, value):
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, str(value)])


def integrity_check(db):
    """``PRAGMA integrity_check`` result: ``"ok"`` for a sound file."""
    return db.execute("PRAGMA integrity_check").fetchone()[0]
