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
