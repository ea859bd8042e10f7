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

# Version 3: rollups that the reports, the learning loop and horusd read instead of the raw samples
# (at a thousand nodes x 8 GPUs every 10 s the raw tables grow by ~70 million rows a day). Triggers
# keep them: AFTER INSERT fires only for rows actually inserted, so INSERT OR IGNORE of a batch sent
# twice counts nothing twice, whoever writes (receiver, --db ship, --import, Prometheus ingest).
# Raw samples older than ``raw_days`` may be pruned (``prune_raw``); the rollups stay. The raw tables
# become WITHOUT ROWID (their primary key is the table: no second copy of the key) and job_gpu_use
# loses its (node, gpu_index, ts) index, which nothing reads any more: with the GPU's uuid and name
# kept in ``gpus`` instead of on every sample, a GPU sample with its job row takes ~40% less space.
_SCHEMA_V3 = """
CREATE TABLE gpus (
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    uuid TEXT,
    gpu_name TEXT,
    mem_total_mb REAL,
    first_ts REAL,
    last_ts REAL,
    PRIMARY KEY (node, gpu_index)
);

CREATE TABLE job_gpu_summary (
    job_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    shared INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    sm_sum REAL NOT NULL,
    sm_n INTEGER NOT NULL,
    sm_max REAL,
    mem_util_sum REAL NOT NULL,
    mem_util_n INTEGER NOT NULL,
    mem_max_mb REAL,
    first_ts REAL,
    last_ts REAL,
    PRIMARY KEY (job_id, node, gpu_index, shared)
);

CREATE TABLE cluster_hourly (
    hour INTEGER PRIMARY KEY,
    samples INTEGER NOT NULL,
    util_sum REAL NOT NULL,
    util_n INTEGER NOT NULL,
    busy INTEGER NOT NULL,
    gpus INTEGER NOT NULL
);

INSERT INTO job_gpu_summary
    SELECT job_id, node, gpu_index, coalesce(shared, 0), count(*), coalesce(sum(sm_util), 0), count(sm_util),
           max(sm_util), coalesce(sum(mem_util), 0), count(mem_util), max(mem_used_mb), min(ts), max(ts)
    FROM job_gpu_use GROUP BY job_id, node, gpu_index, coalesce(shared, 0);

INSERT INTO gpus
    SELECT node, gpu_index, max(uuid), max(gpu_name), max(mem_total_mb), min(ts), max(ts)
    FROM gpu_samples GROUP BY node, gpu_index;

INSERT INTO cluster_hourly
    SELECT CAST(ts / 3600 AS INTEGER) * 3600, count(*), coalesce(sum(gpu_util), 0), count(gpu_util),
           sum(job_ids IS NOT NULL), count(DISTINCT node || ':' || gpu_index)
    FROM gpu_samples GROUP BY 1;

CREATE TABLE gpu_samples_v2 (
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
) WITHOUT ROWID;
INSERT INTO gpu_samples_v2 SELECT node, gpu_index, ts, uuid, gpu_name, gpu_util, mem_util, mem_used_mb,
    mem_total_mb, job_ids FROM gpu_samples;
DROP TABLE gpu_samples;
ALTER TABLE gpu_samples_v2 RENAME TO gpu_samples;
CREATE INDEX gpu_samples_ts ON gpu_samples (ts);

CREATE TABLE job_gpu_use_v2 (
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
) WITHOUT ROWID;
INSERT INTO job_gpu_use_v2 SELECT job_id, node, gpu_index, ts, sm_util, mem_util, mem_used_mb, n_procs, shared
    FROM job_gpu_use;
DROP TABLE job_gpu_use;
ALTER TABLE job_gpu_use_v2 RENAME TO job_gpu_use;

CREATE TRIGGER gpu_samples_rollup AFTER INSERT ON gpu_samples BEGIN
    INSERT INTO cluster_hourly (hour, samples, util_sum, util_n, busy, gpus)
    VALUES (CAST(NEW.ts / 3600 AS INTEGER) * 3600, 1, coalesce(NEW.gpu_util, 0), NEW.gpu_util IS NOT NULL,
            NEW.job_ids IS NOT NULL,
            NOT EXISTS (SELECT 1 FROM gpu_samples s WHERE s.node = NEW.node AND s.gpu_index = NEW.gpu_index
                        AND s.ts >= CAST(NEW.ts / 3600 AS INTEGER) * 3600
                        AND s.ts < CAST(NEW.ts / 3600 AS INTEGER) * 3600 + 3600 AND s.ts <> NEW.ts))
    ON CONFLICT (hour) DO UPDATE SET samples = samples + 1, util_sum = util_sum + excluded.util_sum,
        util_n = util_n + excluded.util_n, busy = busy + excluded.busy, gpus = gpus + excluded.gpus;
    INSERT INTO gpus (node, gpu_index, uuid, gpu_name, mem_total_mb, first_ts, last_ts)
    VALUES (NEW.node, NEW.gpu_index, NEW.uuid, NEW.gpu_name, NEW.mem_total_mb, NEW.ts, NEW.ts)
    ON CONFLICT (node, gpu_index) DO UPDATE SET uuid = coalesce(excluded.uuid, uuid),
        gpu_name = coalesce(excluded.gpu_name, gpu_name), mem_total_mb = coalesce(excluded.mem_total_mb, mem_total_mb),
        first_ts = min(first_ts, excluded.first_ts), last_ts = max(last_ts, excluded.last_ts)
    WHERE excluded.last_ts > gpus.last_ts + 600 OR excluded.first_ts < gpus.first_ts
        OR (excluded.uuid IS NOT NULL AND excluded.uuid IS NOT gpus.uuid)
        OR (excluded.gpu_name IS NOT NULL AND excluded.gpu_name IS NOT gpus.gpu_name);
END;

CREATE TRIGGER job_gpu_use_rollup AFTER INSERT ON job_gpu_use BEGIN
    INSERT INTO job_gpu_summary (job_id, node, gpu_index, shared, samples, sm_sum, sm_n, sm_max, mem_util_sum,
                                 mem_util_n, mem_max_mb, first_ts, last_ts)
    VALUES (NEW.job_id, NEW.node, NEW.gpu_index, coalesce(NEW.shared, 0), 1, coalesce(NEW.sm_util, 0),
            NEW.sm_util IS NOT NULL, NEW.sm_util, coalesce(NEW.mem_util, 0), NEW.mem_util IS NOT NULL, NEW.mem_used_mb, NEW.ts,
            NEW.ts)
    ON CONFLICT (job_id, node, gpu_index, shared) DO UPDATE SET samples = samples + 1,
        sm_sum = sm_sum + excluded.sm_sum, sm_n = sm_n + excluded.sm_n,
        sm_max = max(coalesce(sm_max, excluded.sm_max), coalesce(excluded.sm_max, sm_max)),
        mem_util_sum = mem_util_sum + excluded.mem_util_sum, mem_util_n = mem_util_n + excluded.mem_util_n,
        mem_max_mb = max(coalesce(mem_max_mb, excluded.mem_max_mb), coalesce(excluded.mem_max_mb, mem_max_mb)),
        first_ts = min(first_ts, excluded.first_ts), last_ts = max(last_ts, excluded.last_ts);
END;
"""

MIGRATIONS = [_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3]
SCHEMA_VERSION = len(MIGRATIONS)


def _pending(conn, version):
    """The migrations (target version, script) that take a store at ``version`` to the newest.

    Two schemas were numbered 2 before they were merged: the users' work (job CPU time and peak
    memory, today's version 2) and the site-scale rollups (today's version 3). A store that the
    site-scale branch left at version 2 holds the rollups' ``gpus`` table and lacks the CPU time
    column: it needs today's version 2 and is then at version 3."""
    if version == 2:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        if "gpus" in tables and "cpu_time_s" not in columns:
            return [(3, _SCHEMA_V2)]
    return [(target, MIGRATIONS[target - 1]) for target in range(version + 1, SCHEMA_VERSION + 1)]


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
        for target, script in _pending(conn, version):
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _statements(script):
    """Split a schema script into statements (the schema holds no ';' inside literals; a CREATE
    TRIGGER's body, BEGIN ... END, is one statement with ';' inside)."""
    statements, current = [], ""
    for part in script.split(";"):
        current = f"{current};{part}" if current else part
        text = current.strip()
        if text.upper().startswith("CREATE TRIGGER") and not text.upper().endswith("END"):
            continue
        if text:
            statements.append(text)
        current = ""
    return statements


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
