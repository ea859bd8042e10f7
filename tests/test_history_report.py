"""Reports over a small made-up history: flags, co-runners, group sums, HTML with SVG plots."""

import json

import pytest

from slurm_horus.cli import main
from slurm_horus.collect.ingest import write_rows
from slurm_horus.collect.sampler import store_batches
from slurm_horus.store.db import open_db
from slurm_horus.store.decisions import record_decision
from history_data import job, samples


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "h.db"
    db = open_db(path)
    busy, idle = job(1, "alpha", 1000, 100, 0), job(2, "beta", 1000, 100, 1)
    idle["user"] = "bob"
    pair = [job(3, "alpha", 2000, 160, 2), job(4, "beta", 2000, 160, 2)]
    pair[0]["horus_id"] = "h-3"
    record_decision(db, "h-3", job_class="alpha", mode="shared", nodes=["n1"], gpus={"n1": [2]},
                    predicted_slowdown=1.25, corunners={"4": 1.3})
    write_rows(db, [busy, idle] + pair, [])
    store_batches(db, samples(1, 0, 1000, 100, 90, 12000) + samples(2, 1, 1000, 100, 0, 0)
                  + samples(3, 2, 2000, 160, 40, 2000, shared=1) + samples(4, 2, 2000, 160, 30, 1000, shared=1))
    return path


def run(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_job_report_flags_and_corunners(db_path, capsys):
    code, out, _ = run(capsys, "report", "job", "2", "--db", str(db_path), "--json")
    idle = json.loads(out)
    assert code == 0 and idle["gpu_list"] == ["n1:1"]
    assert {"idle_gpu", "low_util", "memory_far_below", "fine_shared"} <= set(idle["flags"])
    busy = json.loads(run(capsys, "report", "job", "1", "--db", str(db_path), "--json")[1])
    assert busy["flags"] == [] and busy["corunners"] == []
    code, out, _ = run(capsys, "report", "job", "3", "--db", str(db_path))
    assert "Co-runners:" in out and "\n4 " in out and "beta" in out
    assert "predicted slowdown 1.25" in out


def test_users_report_sums_gpu_hours_and_sharing(db_path, capsys):
    code, out, _ = run(capsys, "report", "users", "--db", str(db_path), "--json", "--since", "1970-01-01")
    rows = {r["user"]: r for r in json.loads(out)["rows"]}
    alice, bob = rows["alice"], rows["bob"]
    assert bob["jobs"] == 1 and bob["gpu_hours"] == pytest.approx(100 / 3600, abs=1e-3)
    assert bob["mean_util"] == 0 and bob["saved_gpu_hours"] == 0
    assert alice["jobs"] == 3 and alice["shared_jobs"] == 2
    assert alice["saved_gpu_hours"] == pytest.approx(160 / 3600, abs=1e-3)  # half of 160 s, twice


def test_html_report_has_svg_plots(db_path, tmp_path, capsys):
    out_file = tmp_path / "job.html"
    code, _, _ = run(capsys, "report", "job", "3", "--db", str(db_path), "--html", str(out_file))
    html = out_file.read_text()
    assert code == 0 and html.count("<svg") == 3 and "<path d=\"M" in html and "n1:2" in html
    assert "3 (this job)" in html and "4 beta" in html  # the co-runner timeline
    code, _, _ = run(capsys, "report", "cluster", "--db", str(db_path), "--html", str(tmp_path / "c.html"))
    assert code == 0 and "<svg" in (tmp_path / "c.html").read_text()


def test_unknown_job_and_bad_date_are_one_line_errors(db_path, capsys):
    code, _, err = run(capsys, "report", "job", "99", "--db", str(db_path))
    assert code == 2 and err.strip() == "horus: job 99 is not in the history database (run `horus ingest`)"
    code, _, err = run(capsys, "report", "users", "--db", str(db_path), "--since", "yesterday")
    assert code == 2 and "--since" in err and len(err.strip().splitlines()) == 1
