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
    # a busy GPU: no GPU flag; 100 s of a 60 min limit: time_limit_far (with its note and advice)
    assert busy["flags"] == ["time_limit_far"] and busy["corunners"] == []
    assert busy["notes"][0]["advice"] == "A shorter --time=0:05:00 lets the backfill scheduler start it sooner."
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


# ---- issue 18: job ids as Slurm writes them, job lists, efficiencies, notes, mail line --------------

@pytest.fixture
def arrays_db(tmp_path):
    path = tmp_path / "a.db"
    db = open_db(path)
    task0, task1 = job(8, "sweep", 3000, 60, 0), job(7, "sweep", 3000, 90, 1)  # raw ids as Slurm gives them
    task0.update(array_job_id=7, array_task_id=0)
    task1.update(array_job_id=7, array_task_id=1)
    ten, seventy = job(10, "ten", 4000, 50, 2), job(70, "seventy", 4000, 50, 3)
    greedy = job(11, "greedy", 5000, 100, 0)
    greedy.update(user="carol", n_cpus=2, cpu_time_s=30.0, mem_mb=4096.0, max_rss_mb=512.0, time_limit_min=120)
    write_rows(db, [task0, task1, ten, seventy, greedy], [])
    return path


def test_job_ids_are_read_as_slurm_writes_them(arrays_db, capsys):
    code, out, _ = run(capsys, "report", "job", "7_0", "--db", str(arrays_db), "--json")
    assert code == 0 and json.loads(out)["job"]["job_id"] == 8 and json.loads(out)["job_name"] == "7_0"
    code, out, _ = run(capsys, "report", "job", "7", "--db", str(arrays_db), "--json")
    array = json.loads(out)
    assert code == 0 and [t["job"] for t in array["tasks"]] == ["7_0", "7_1"]  # the base id: every task
    code, out, _ = run(capsys, "report", "job", "7", "--db", str(arrays_db))
    assert out.startswith("Array 7: 2 tasks (2 COMPLETED)")
    for missing in ("1_0", "7_5"):  # 1_0 is not job 10, 7_5 is no task
        code, _, err = run(capsys, "report", "job", missing, "--db", str(arrays_db))
        assert code == 2 and err.strip() == f"horus: job {missing} is not in the history database (run `horus ingest`)"
    assert json.loads(run(capsys, "report", "job", "70", "--db", str(arrays_db), "--json")[1])["job"]["name"] == "seventy"
    code, _, err = run(capsys, "report", "job", "7_x", "--db", str(arrays_db))
    assert code == 2 and "expected N or N_T" in err and len(err.strip().splitlines()) == 1


def test_job_list_per_user_with_efficiencies(arrays_db, capsys):
    code, out, _ = run(capsys, "report", "jobs", "--user", "carol", "--db", str(arrays_db), "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["job"] for r in rows] == ["11"]
    assert (rows[0]["cpu_eff"], rows[0]["mem_eff"]) == (15.0, 12.5)
    code, out, _ = run(capsys, "report", "jobs", "--db", str(arrays_db))
    assert out.splitlines()[0] == "5 of 5 jobs (newest first)" and "\n7_1 " in out and "\n11 " in out
    code, out, _ = run(capsys, "report", "users", "--user", "carol", "--db", str(arrays_db), "--json")
    assert [r["user"] for r in json.loads(out)["rows"]] == ["carol"]


def test_efficiencies_and_plain_language_notes(arrays_db, capsys):
    code, out, _ = run(capsys, "report", "job", "11", "--db", str(arrays_db))
    assert "CPU efficiency     15.0 % of 0:03:20 core-walltime (2 cores; CPU time used 0:00:30)" in out
    assert "Memory efficiency  12.5 % of 4096 MiB, peak 512 MiB" in out
    assert "Time efficiency    1.4 % of 2:00:00" in out
    assert "  low_cpu_eff: It used 15 % of its 2 CPU cores.\n" in out
    assert "    advice: Ask for less memory next time: --mem=1G leaves a 25 % margin.\n" in out
    code, line, _ = run(capsys, "report", "job", "11", "--db", str(arrays_db), "--mail-line")
    assert code == 0 and len(line.strip().splitlines()) == 1
    assert line.startswith("slurm-horus: job 11 (greedy) COMPLETED after 0:01:40; CPU 15 % of 2 cores; "
                           "memory 12 % of 4.0 GiB; 1 % of its 2:00:00 time limit. Advice: Ask for fewer cores")
    code, line, _ = run(capsys, "report", "job", "7", "--db", str(arrays_db), "--mail-line")
    assert line.startswith("slurm-horus: array 7: 2 tasks (2 COMPLETED)")


def test_a_reader_never_creates_a_database_or_its_directory(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "dir" / "h.db"
    for command in (["users"], ["jobs"], ["job", "1"], ["cluster"]):
        code, _, err = run(capsys, "report", *command, "--db", str(missing))
        assert code == 2 and err.startswith(f"horus: no history database at {missing}")
    assert not (tmp_path / "nonexistent").exists()


def test_job_samples_after_its_end_are_not_its_own(db_path, capsys):
    db = open_db(db_path)
    store_batches(db, samples(1, 0, 1101, 30, 0, 0))  # job 1 ended at 1100 (to the second): seen late
    code, out, _ = run(capsys, "report", "job", "1", "--db", str(db_path), "--json")
    gpu = json.loads(out)["gpus"][0]
    assert gpu["mean_sm_util"] == 90 and max(p[0] for p in gpu["series"]) < 1101
