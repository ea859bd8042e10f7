"""Bad input gets one clear line and a non-zero exit, and loses nothing (issue 15, item 11).

Each case once ended in a traceback: ``horus ingest`` on a locked or read-only database, trace and
CSV files that are not UTF-8, numbers in trace columns that were never checked.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_horus.cli import main
from slurm_horus.store import db as store
from slurm_horus.store.db import open_db

from unprivileged import ensure_user, horus_as

DATA = Path(__file__).parent / "data"


def run(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def one_line_error(code, err, *words):
    assert code not in (0, None), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err


def test_ingest_into_a_locked_database_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    path = tmp_path / "h.db"
    code, _, _ = run(capsys, "ingest", "--db", path, "--from-file", DATA / "sacct-22.05.json", "--since", "0")
    assert code == 0
    before = open_db(path).execute("SELECT count(*), max(ingested_at) FROM jobs").fetchone()
    holder = open_db(path)
    holder.conn.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 200)
    try:
        code, _, err = run(capsys, "ingest", "--db", path, "--from-file", DATA / "sacct-22.05.json",
                           "--since", "0")
    finally:
        holder.conn.execute("ROLLBACK")
    one_line_error(code, err, str(path), "locked")
    assert open_db(path).execute("SELECT count(*), max(ingested_at) FROM jobs").fetchone() == before


def test_ingest_into_a_database_the_user_may_only_read_is_one_line():
    user = ensure_user()
    tmp_path = Path(tempfile.mkdtemp(prefix="horus-ro-"))  # pytest's own directory is root's only
    try:
        os.chmod(tmp_path, 0o755)
        path = tmp_path / "h.db"
        running = open_db(path)  # horusd has it open: its -wal and -shm exist
        running.execute("INSERT INTO meta (key, value) VALUES ('x', '1')")
        for name in (path, f"{path}-wal", f"{path}-shm"):
            os.chmod(name, 0o644)  # the admin lets everybody read it
        sacct = tmp_path / "sacct.json"
        sacct.write_text((DATA / "sacct-22.05.json").read_text())
        os.chmod(sacct, 0o644)
        result = horus_as(user, ["ingest", "--db", path, "--from-file", sacct, "--since", "0"])
        one_line_error(result.returncode, result.stderr, str(path), "read")
        assert running.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    finally:
        shutil.rmtree(tmp_path)


def test_ingest_refuses_a_window_that_never_ends(tmp_path, capsys):
    for hours in ("0", "-5", "nan"):
        code, _, err = run(capsys, "ingest", "--db", tmp_path / "h.db", "--window-hours", hours)
        one_line_error(code, err, "--window-hours")


TRACE_CASES = [
    ("submit_time,duration,num_gpus,gpus_per_node\n0,10,1,abc\n", "gpus_per_node"),
    ("submit_time,duration,num_gpus\n0,10,1e400\n", "num_gpus"),
    ("submit_time,duration,num_gpus\n0,10,1.5\n", "num_gpus"),
    ("submit_time,duration,num_gpus,mem_mb\n0,10,1,x\n", "mem_mb"),
    ("submit_time,duration,num_gpus,mem_mb\n0,10,1,-1e400\n", "mem_mb"),
    ("name,time,application,num_replicas,batch_size,duration,num_task\nj,0,infer-bert,1,8,10,zz\n", "num_task"),
    ("name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\np,1,500,0,10,abc\n", "scheduled_time"),
    (b"submit_time,duration,num_gpus\n0,10,1\n\xff\xfe,1,1\n", "UTF-8"),
    (b"\xff\xfe\x00\x01", "UTF-8"),
]


@pytest.mark.parametrize("content, word", TRACE_CASES)
def test_bad_trace_files_are_one_line_errors(tmp_path, capsys, content, word):
    trace = tmp_path / "trace.csv"
    trace.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run(capsys, "simulate", "--trace", trace, "--policy", "slurm-default", "--no-progress",
                       "--cluster", "2x4:v100")
    one_line_error(code, err, str(trace), word)


def test_a_gavel_trace_that_is_not_utf8(tmp_path, capsys):
    trace = tmp_path / "t.trace"
    trace.write_bytes(b"ResNet-18 (batch size 32)\tcmd\tx\t1\t1000\t0\t1\n\xff\n")
    code, _, err = run(capsys, "simulate", "--trace", trace, "--policy", "slurm-default", "--no-progress")
    one_line_error(code, err, str(trace), "UTF-8")


@pytest.mark.parametrize("option", ["--observations", "--profiles"])
def test_csv_files_that_are_not_utf8(tmp_path, capsys, option):
    bad = tmp_path / "bad.csv"
    header = b"gpu_type,job_class,corunner_class,norm_tput\n" if option == "--observations" else \
        b"job_class,gpu_type,gpu_util,mem_util,gmem_mb,solo_tput\n"
    bad.write_bytes(header + b"\xff\xfe,a,b,1\n")
    code, _, err = run(capsys, "model", "fit", "--db", tmp_path / "h.db", option, bad)
    one_line_error(code, err, str(bad), "UTF-8")


def test_a_truth_file_that_is_not_utf8(tmp_path, capsys):
    truth = tmp_path / "truth.csv"
    truth.write_bytes(b"gpu_type,job_class,corunner_class,norm_tput\nv100,a,b,0.5\n\xff,a,b,1\n")
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time,duration,num_gpus\n0,10,1\n")
    code, _, err = run(capsys, "simulate", "--trace", trace, "--truth", truth, "--policy", "slurm-default",
                       "--no-progress")
    one_line_error(code, err, str(truth), "UTF-8")
