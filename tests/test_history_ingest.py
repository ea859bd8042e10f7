"""sacct record parsing (output captured from a real 22.05.8 cluster) and idempotent ingest."""

import json
from pathlib import Path

import pytest

from slurm_horus.collect.ingest import FileSource, ingest, watermark
from slurm_horus.collect.records import apply_exit_codes, job_rows_from_json, job_rows_from_parsable
from slurm_horus.slurm.acct import PARSABLE_DELIMITER
from slurm_horus.tokens import parse_horus_tokens
from slurm_horus.errors import InputError
from slurm_horus.store.db import open_db

DATA = Path(__file__).parent / "data"


def test_captured_sacct_json_gives_gpu_indices_shards_and_steps():
    jobs, steps = job_rows_from_json(json.loads((DATA / "sacct-22.05.json").read_text()))
    by_id = {j["job_id"]: j for j in jobs}
    assert by_id[1]["gpu_indices"] == "2" and by_id[1]["n_gpus"] == 1
    assert by_id[4]["gpu_indices"] == "0,3" and by_id[4]["gres_alloc"] == "gpu:g0=1,gpu:g3=1,gpu=2"
    assert by_id[2]["shards"] == 1 and by_id[2]["gpu_indices"] is None
    assert by_id[1]["state"] == "COMPLETED" and by_id[1]["elapsed_s"] == 8 and by_id[1]["nodes"] == "n3"
    assert {(s["job_id"], s["step_id"]) for s in steps} == {(i, "batch") for i in (1, 2, 3, 4)}


def test_parsable_output_with_comments_and_a_delimiter_inside_one():
    d = PARSABLE_DELIMITER
    fields = ["7", "7", "lab", "train", "alice", "ml", "gpu", "normal", "CANCELLED by 0", "0:15",
              "2026-01-01T10:00:00", "2026-01-01T10:00:05", "2026-01-01T10:01:05", "60", "120", "n[1-2]",
              "2", "billing=2,cpu=2,gres/gpu:g1=1,gres/gpu=1,mem=4G,node=2", "", "horus:h-9 gpus=n1:1",
              f"class=resnet50-bs64 note{d}odd"]
    step = ["7.0", "7.0", "lab", "python", "", "ml", "", "", "COMPLETED", "0:0", "2026-01-01T10:00:05",
            "2026-01-01T10:00:05", "2026-01-01T10:00:50", "45", "", "n1", "1", "cpu=1", "", "", ""]
    jobs, steps = job_rows_from_parsable(d.join(fields) + "\n" + d.join(step) + "\n")
    job = jobs[0]
    assert job["state"] == "CANCELLED" and job["exit_code"] == 0 and job["exit_signal"] == 15
    assert job["gpu_indices"] == "1" and job["mem_mb"] == 4096 and job["horus_id"] == "h-9"
    assert job["job_class"] == "resnet50-bs64" and job["comment"].endswith(f"note{d}odd")
    assert steps[0]["step_id"] == "0" and steps[0]["elapsed_s"] == 45
    with pytest.raises(InputError, match="sacct -P:1"):
        job_rows_from_parsable("1|%|2\n")


def test_exit_codes_from_parsable_replace_json_ones():
    jobs = [{"job_id": 5, "exit_code": 0, "exit_signal": 0}]
    steps = [{"job_id": 5, "step_id": "batch", "exit_code": 0, "exit_signal": 0}]
    apply_exit_codes(jobs, steps, "5|3:0\n5.batch|3:0\n")
    assert jobs[0]["exit_code"] == 3 and steps[0]["exit_code"] == 3


def test_horus_tokens():
    assert parse_horus_tokens("placed horus:h-1 class=a pred=1.2", None) == ("h-1", {"class": "a", "pred": "1.2"})
    assert parse_horus_tokens("horus:class=b", "x=1") == (None, {"class": "b"})
    assert parse_horus_tokens("", None) == (None, {})


def test_file_ingest_is_idempotent_and_keeps_a_watermark(tmp_path):
    db = open_db(tmp_path / "h.db")
    source = FileSource(DATA / "sacct-22.05.json")
    first = ingest(db, source, since=0, window_s=10 ** 10)
    assert first.jobs_new == 4 and first.steps_seen == 4
    mark = watermark(db)
    assert mark == max(r[0] for r in db.execute("SELECT end_time FROM jobs"))
    columns = ", ".join(c for c in db["jobs"].columns_dict if c != "ingested_at")
    dump = list(db.execute(f"SELECT {columns} FROM jobs ORDER BY job_id"))
    again = ingest(db, source, window_s=10 ** 10)
    assert again.jobs_new == 0 and again.jobs_seen == 4
    assert list(db.execute(f"SELECT {columns} FROM jobs ORDER BY job_id")) == dump
    assert db.execute("SELECT count(*) FROM steps").fetchone()[0] == 4


def test_bad_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="bad.json"):
        ingest(open_db(tmp_path / "h.db"), FileSource(bad), since=0)


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_newer_sacct_json_fills_every_column_2205_fills_and_agrees_with_parsable(release):
    """24.11+ wraps time limits and step times ({"set":..,"number":..}); none may come out NULL."""
    old_jobs, old_steps = job_rows_from_json(json.loads((DATA / "sacct-22.05.json").read_text()))
    jobs, steps = job_rows_from_json((DATA / f"sacct-{release}.json").read_text())
    old = {row["job_id"]: row for row in old_jobs}  # the same four jobs (scripts/capture_slurm_json.py)
    assert [(row["job_id"], c) for row in jobs for c, v in old[row["job_id"]].items()
            if v is not None and row[c] is None] == []
    step_filled = {c for row in old_steps for c, v in row.items() if v is not None}
    assert [(s["job_id"], c) for s in steps for c in step_filled if s[c] is None] == []
    by_id = {j["job_id"]: j for j in jobs}
    assert by_id[1]["time_limit_min"] == 5 and by_id[1]["gpu_indices"] == "2" and by_id[2]["shards"] == 1
    assert by_id[2]["job_class"] == "lm-bs20" and by_id[4]["gpu_indices"] == "0,3"
    text_jobs, text_steps = job_rows_from_parsable((DATA / f"sacct-{release}.txt").read_text())
    same = ("job_id", "state", "exit_code", "submit_time", "start_time", "end_time", "elapsed_s",
            "time_limit_min", "nodes", "n_nodes", "n_cpus", "gres_alloc", "gpu_indices", "shards", "job_class")
    assert [{c: j[c] for c in same} for j in jobs] == [{c: j[c] for c in same} for j in text_jobs]
    assert [(s["step_id"], s["start_time"], s["end_time"]) for s in steps] == [
        (s["step_id"], s["start_time"], s["end_time"]) for s in text_steps]
