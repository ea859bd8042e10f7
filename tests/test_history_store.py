"""History store: schema versions, migration on open, WAL, refusing a newer schema."""

import sqlite3

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.store import db as store
from slurm_horus.store.db import SCHEMA_VERSION, integrity_check, open_db, schema_version

TABLES = {"jobs", "steps", "gpu_samples", "job_gpu_use", "decisions", "observations", "models", "meta"}


def test_new_database_has_every_table_in_wal_mode(tmp_path):
    db = open_db(tmp_path / "sub" / "h.db")
    assert TABLES <= set(db.table_names())
    assert schema_version(db) == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert integrity_check(db) == "ok"


def test_reopening_keeps_data_and_runs_no_migration_twice(tmp_path):
    db = open_db(tmp_path / "h.db")
    db.execute("INSERT INTO meta (key, value) VALUES ('x', '1')")
    again = open_db(tmp_path / "h.db")
    assert again.execute("SELECT value FROM meta WHERE key = 'x'").fetchone() == ("1",)


def test_an_older_schema_is_migrated_step_by_step(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    open_db(path).conn.close()
    # A next version adds a column; a version-1 file gets it on open, its rows untouched.
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO meta (key, value) VALUES ('kept', 'yes')")
    conn.commit()
    conn.close()
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS + ["ALTER TABLE jobs ADD COLUMN energy_j REAL"])
    monkeypatch.setattr(store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    db = open_db(path)
    assert schema_version(db) == SCHEMA_VERSION + 1
    assert "energy_j" in db["jobs"].columns_dict
    assert db.execute("SELECT value FROM meta WHERE key = 'kept'").fetchone() == ("yes",)


def test_a_failing_migration_leaves_the_previous_version(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    open_db(path).conn.close()
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS + [
        "ALTER TABLE jobs ADD COLUMN a REAL; ALTER TABLE no_such_table ADD COLUMN b REAL"])
    monkeypatch.setattr(store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(HorusError):
        open_db(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert "a" not in [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]


def test_a_newer_schema_is_refused_with_one_clear_error(tmp_path):
    path = tmp_path / "h.db"
    open_db(path).conn.close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(HorusError, match="newer"):
        open_db(path)


def test_a_file_that_is_not_a_database_is_an_error(tmp_path):
    path = tmp_path / "h.db"
    path.write_text("not sqlite at all, just text" * 100)
    with pytest.raises(HorusError, match=str(path)):
        open_db(path)


def test_processes_opening_a_new_file_at_once_all_succeed(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "race.db"
    code = f"from slurm_horus.store.db import open_db; open_db({str(path)!r})"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE) for _ in range(6)]
    errors = [p.communicate()[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert schema_version(open_db(path)) == SCHEMA_VERSION


def _v1_file(path):
    conn = sqlite3.connect(path)
    for statement in store._statements(store.MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    return conn


def test_a_version_1_file_gets_its_rollups_backfilled(tmp_path):
    path = tmp_path / "h.db"
    conn = _v1_file(path)
    conn.executemany("INSERT INTO gpu_samples (node, gpu_index, ts, gpu_name, gpu_util, job_ids) VALUES (?, ?, ?, ?, ?, ?)",
                     [("n1", 0, 10.0, "Tesla V100", 50.0, "5"), ("n1", 0, 20.0, "Tesla V100", 70.0, "5"),
                      ("n1", 1, 10.0, "Tesla V100", None, None), ("n1", 0, 3700.0, "Tesla V100", 10.0, None)])
    conn.executemany("INSERT INTO job_gpu_use (job_id, node, gpu_index, ts, sm_util, mem_used_mb, shared) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", [(5, "n1", 0, 10.0, 50.0, 100.0, 0), (5, "n1", 0, 20.0, 70.0, 300.0, 0)])
    conn.commit()
    conn.close()
    db = open_db(path)
    assert db.execute("SELECT samples, sm_sum, sm_n, sm_max, mem_max_mb FROM job_gpu_summary").fetchall() == [
        (2, 120.0, 2, 70.0, 300.0)]
    assert db.execute("SELECT hour, samples, util_sum, util_n, busy, gpus FROM cluster_hourly ORDER BY hour").fetchall() \
        == [(0, 3, 120.0, 2, 2, 2), (3600, 1, 10.0, 1, 0, 1)]
    assert db.execute("SELECT count(*) FROM gpus").fetchone()[0] == 2


def _old_v2_file(path, script):
    """A store left at version 2 by one of the two branches that each numbered their schema 2."""
    conn = _v1_file(path)
    for statement in store._statements(script):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    return conn


def _fill(conn):
    conn.execute("INSERT INTO jobs (cluster, job_id, user) VALUES ('c', 5, 'ada')")
    conn.executemany("INSERT INTO gpu_samples (node, gpu_index, ts, gpu_util, job_ids) VALUES (?, ?, ?, ?, ?)",
                     [("n1", 0, 10.0, 50.0, "5"), ("n1", 0, 20.0, 70.0, "5")])
    conn.executemany("INSERT INTO job_gpu_use (job_id, node, gpu_index, ts, sm_util, shared) VALUES (?, ?, ?, ?, ?, ?)",
                     [(5, "n1", 0, 10.0, 50.0, 0), (5, "n1", 0, 20.0, 70.0, 0)])
    conn.commit()
    conn.close()


def _assert_newest(db):
    assert schema_version(db) == SCHEMA_VERSION == 3
    assert {"cpu_time_s", "max_rss_mb"} <= set(db["jobs"].columns_dict)
    assert "jobs_array" in {row[1] for row in db.execute("PRAGMA index_list(jobs)")}
    assert {"gpus", "job_gpu_summary", "cluster_hourly"} <= set(db.table_names())
    assert db.execute("SELECT user FROM jobs").fetchall() == [("ada",)]
    assert db.execute("SELECT samples, sm_sum FROM job_gpu_summary").fetchall() == [(2, 120.0)]
    assert db.execute("SELECT sum(samples) FROM cluster_hourly").fetchone()[0] == 2
    assert integrity_check(db) == "ok"


def test_a_users_version_2_store_gets_the_rollups(tmp_path):
    path = tmp_path / "h.db"
    _fill(_old_v2_file(path, store._SCHEMA_V2))  # version 2 of main: CPU time and peak memory
    _assert_newest(open_db(path))


def test_a_site_scale_version_2_store_gets_the_users_columns(tmp_path):
    path = tmp_path / "h.db"
    conn = _old_v2_file(path, store._SCHEMA_V3)  # version 2 of the site-scale branch: the rollups
    _fill(conn)  # its triggers keep the rollups
    _assert_newest(open_db(path))
    again = open_db(path)  # nothing runs twice
    _assert_newest(again)


def test_pruned_raw_samples_leave_the_rollups_and_a_late_batch_counts_nothing_twice(tmp_path):
    from slurm_horus.collect.sampler import store_batches
    from slurm_horus.store.samples import prune_raw, raw_horizon

    db = open_db(tmp_path / "h.db")
    day = 86400.0

    def batch(ts):
        return {"node": "n1", "ts": ts, "gpus": [{"node": "n1", "gpu_index": 0, "ts": ts, "gpu_util": 40.0,
                                                  "job_ids": "9"}],
                "jobs": [{"job_id": 9, "node": "n1", "gpu_index": 0, "ts": ts, "sm_util": 40.0, "shared": 0}]}

    old, new = [batch(10 * day + k) for k in range(3)], [batch(20 * day + k) for k in range(2)]
    store_batches(db, old + new)
    assert prune_raw(db, raw_days=5, now=21 * day) == 3 + 3
    assert raw_horizon(db) == 16 * day
    assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2
    assert db.execute("SELECT count(*) FROM job_gpu_use").fetchone()[0] == 2
    store_batches(db, old)  # the old batches arrive once more, after their raw rows are gone
    assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2
    assert db.execute("SELECT samples FROM job_gpu_summary").fetchone()[0] == 5
    assert db.execute("SELECT sum(samples) FROM cluster_hourly").fetchone()[0] == 5
    assert prune_raw(db, raw_days=5, now=21 * day) == 0  # nothing newer to prune
    assert prune_raw(db, raw_days=0, now=99 * day) == 0  # 0: keep everything


@pytest.mark.parametrize("paired_run_max", [64, 2])  # 2: runs of three or more go through the heap sweep
def test_overlaps_finds_exactly_the_pairs_that_held_a_gpu_at_once(monkeypatch, paired_run_max):
    """The sweep (numpy's runs of overlapping jobs, their pairs at once or by the heap) against the
    definition: every two jobs on one GPU whose [start, end) intersect, overlap = min(ends) - max(starts)."""
    import random

    from slurm_horus.store import queries
    from slurm_horus.store.queries import job_gpus, overlaps

    monkeypatch.setattr(queries, "PAIRED_RUN_MAX", paired_run_max)

    for seed in range(200):
        rng = random.Random(seed)
        jobs = []
        for j in range(rng.randint(0, 50)):
            start = None if rng.random() < 0.05 else rng.randint(0, 400)
            jobs.append({"job_id": j + 1, "start_time": start,
                         "end_time": None if rng.random() < 0.1 else (start or 0) + rng.randint(0, 150),
                         "nodes": rng.choice(["n1", "n2", "n[1-2]", ""]), "n_gpus": rng.choice([0, 1, 2]),
                         "gpu_indices": rng.choice(["0", "1", "0,1", None])})
        sampled = {j["job_id"]: {("n3", rng.randint(0, 1))} for j in jobs if rng.random() < 0.2}
        now = 10 ** 6
        spans = {}
        for job in jobs:
            if job["start_time"] is not None:
                for gpu in job_gpus(job, sampled):
                    spans.setdefault(gpu, []).append((job["start_time"], job["end_time"] or now, job["job_id"]))
        expected = []
        for gpu, items in spans.items():
            items.sort()
            for a in range(len(items)):
                for b in range(a + 1, len(items)):
                    overlap = min(items[a][1], items[b][1]) - items[b][0]
                    if overlap > 0:
                        expected.append((gpu, items[b][2], items[a][2], overlap))
        assert sorted(overlaps(jobs, sampled, now)) == sorted(expected), seed
