"""Files that name other users' jobs are 0640 (issue 15, item 12), and a log field cannot forge a line."""

import logging
import os
import stat

from slurm_horus.collect.sampler import Spool
from slurm_horus.private import OneLineFormatter, private_log_handler
from slurm_horus.store.db import open_db


def world_bits(path):
    return stat.S_IMODE(os.stat(path).st_mode) & 0o007


def test_the_history_database_and_its_wal_are_not_world_readable(tmp_path):
    path = tmp_path / "h.db"
    db = open_db(path)
    db.execute("INSERT INTO meta (key, value) VALUES ('x', '1')")
    for name in (path, f"{path}-wal", f"{path}-shm"):
        assert world_bits(name) == 0, oct(os.stat(name).st_mode)


def test_an_old_world_readable_database_is_tightened_on_open(tmp_path):
    path = tmp_path / "h.db"
    open_db(path).conn.close()
    os.chmod(path, 0o644)
    open_db(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_the_collector_spool_is_not_world_readable(tmp_path):
    spool = Spool(tmp_path / "spool.db")
    spool.append({"ts": 1.0, "gpus": []})
    for name in (tmp_path / "spool.db", tmp_path / "spool.db-wal"):
        assert world_bits(name) == 0


def test_horusd_log_is_private_and_one_field_cannot_forge_a_line(tmp_path):
    path = tmp_path / "horusd.log"
    logger = logging.getLogger("horusd-test-private")
    handler = private_log_handler(path)
    logger.addHandler(handler)
    try:
        logger.warning("horus: decision user=%s class=%s", "alice\n2024-01-01 INFO horus: forged", "x\r\x1b[2J")
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and "alice\\n2024-01-01" in lines[0] and "x\\r\\x1b[2J" in lines[0]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_traceback_still_spans_lines():
    formatter = OneLineFormatter("%(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), __import__("sys").exc_info())
    text = formatter.format(record)
    assert text.startswith("failed: a\\nb\nTraceback")
