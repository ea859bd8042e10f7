"""What the history believes (issue 15, item 4): only what Slurm vouches for.

A user once wrote ``horus:<id> slowdown=0.20 class=resnet50-bs64 gpus=n1:0`` into ``--comment`` of a
CPU-only job: the ingest stored it on GPU n1:0 with another user's decision, and four such jobs and a
refit moved ``resnet18-bs32`` with itself from 1.00 to 0.625, which flipped live answers. Decision
tokens count only from AdminComment (users cannot set it) and only when the decision is in the
history; GPU positions come from sacct's allocation, a verified decision or the collector; the
refit learns only from jobs that held a GPU and were sampled on it, and rejects outliers.
"""

import copy
import json
from pathlib import Path

import pytest

from slurm_horus.cli import main
from slurm_horus.collect.ingest import FileSource, ingest, write_rows
from slurm_horus.collect.records import job_rows_from_json
from slurm_horus.collect.sampler import store_batches
from slurm_horus.learn.loop import active_model, refit
from slurm_horus.store.db import open_db
from slurm_horus.store.decisions import record_decision

from history_data import job, samples

DATA = Path(__file__).parent / "data"
FORGED = "horus:h0123456789 slowdown=0.20 class=resnet50-bs64 gpus=n1:0"


def sacct_doc(**changes):
    """The captured 22.05 sacct --json with its first job changed (comments, a CPU-only allocation)."""
    doc = json.loads((DATA / "sacct-22.05.json").read_text())
    first = doc["jobs"][0]
    first["comment"].update(changes.get("comment", {}))
    if changes.get("cpu_only"):
        first["tres"]["allocated"] = [t for t in first["tres"]["allocated"] if t["type"] != "gres"]
    doc["jobs"] = [first]
    return doc


def test_a_token_in_the_users_comment_is_not_read():
    (row,), _ = job_rows_from_json(sacct_doc(comment={"job": FORGED}, cpu_only=True))
    assert row["horus_id"] is None and row["horus_tokens"] is None
    assert row["gpu_indices"] is None and row["n_gpus"] == 0


def ingested(tmp_path, doc, decisions=()):
    db = open_db(tmp_path / "h.db")
    for decision_id in decisions:
        record_decision(db, decision_id, job_class="lm-bs20", mode="shared", nodes=["n3"], gpus={"n3": [1]},
                        predicted_slowdown=1.1)
    path = tmp_path / "sacct.json"
    path.write_text(json.dumps(doc))
    ingest(db, FileSource(path), since=0, window_s=10 ** 10)
    return db, db.execute("SELECT horus_id, horus_tokens, gpu_indices, job_class FROM jobs").fetchone()


def test_an_admin_token_counts_only_when_its_decision_is_in_the_history(tmp_path):
    token = "horus:hfeedbeef01 mode=shared slowdown=1.100 class=lm-bs20 gpus=n3:1"
    shard_job = sacct_doc(comment={"administrator": token})
    for entry in shard_job["jobs"][0]["tres"]["allocated"]:  # a shard job: sacct records no index
        if entry["type"] == "gres":
            entry["name"] = "shard"
    _db, (horus_id, tokens, gpus, job_class) = ingested(tmp_path / "a", shard_job)
    assert (horus_id, tokens, gpus, job_class) == (None, None, None, None)  # unverified: nothing of the token, class unknown
    _db, (horus_id, tokens, gpus, job_class) = ingested(tmp_path / "b", shard_job, decisions=["hfeedbeef01"])
    assert horus_id == "hfeedbeef01" and json.loads(tokens)["slowdown"] == "1.100"
    assert gpus == "1" and job_class == "lm-bs20"


def history_with(tmp_path, jobs, sampled=True):
    db = open_db(tmp_path / "h.db")
    write_rows(db, jobs, [])
    if sampled:
        batches = []
        for row in jobs:
            if row["n_gpus"]:
                batches += samples(row["job_id"], int(row["gpu_indices"]), row["start_time"], row["elapsed_s"], 60,
                                   2000, shared=int(row.get("_shared", 0)), node=row["nodes"])
        store_batches(db, batches)
    return db


def predicted(db, job_class, corunner):
    model = active_model(db)
    return model.predict(job_class, [corunner], "v100")


def test_refit_ignores_jobs_that_held_no_gpu(tmp_path):
    """The attack of item 4 on a history an older ingest had filled: CPU-only jobs 'on' GPU n1:0."""
    jobs = [job(1, "resnet18-bs32", 1000, 100, 0), job(2, "resnet18-bs32", 1000, 100, 1)]
    for k in range(4):
        victim = job(10 + k, "resnet18-bs32", 2000 + 500 * k, 160, 0)
        forged = job(20 + k, "resnet18-bs32", 2000 + 500 * k, 160, 0)
        forged.update(n_gpus=0, gres_alloc=None, user="mallory", comment=FORGED)  # a CPU-only job
        jobs += [victim, forged]
    db = history_with(tmp_path, jobs)
    result = refit(db, predictor="measured")
    assert result["n_observations"] == 0
    assert predicted(db, "resnet18-bs32", "resnet18-bs32") == pytest.approx(1.0, abs=0.01)


def test_refit_ignores_jobs_the_collector_never_saw(tmp_path):
    jobs = [job(1, "alpha", 1000, 100, 0), job(2, "beta", 1000, 50, 1),
            job(3, "alpha", 2000, 160, 2), job(4, "beta", 2000, 160, 2)]
    assert refit(history_with(tmp_path, jobs, sampled=False), predictor="measured")["n_observations"] == 0


def pair_runs(first_id, user, job_class, corunner_class, elapsed, count, start=10_000, gpu=2):
    """``count`` runs of ``job_class`` sharing GPU ``gpu`` with ``corunner_class`` (100 s solo: norm
    = 1 - (elapsed - 100) / elapsed)."""
    jobs = []
    for k in range(count):
        at = start + 1000 * k
        mine, other = job(first_id + 2 * k, job_class, at, elapsed, gpu), job(first_id + 2 * k + 1, corunner_class,
                                                                                at, elapsed, gpu)
        mine["user"] = other["user"] = user
        mine["_shared"] = other["_shared"] = 1
        jobs += [mine, other]
    return jobs


SOLO = [job(1, "resnet18-bs32", 1000, 100, 0), job(2, "resnet18-bs32", 1200, 100, 1),
        job(3, "alpha", 1000, 100, 3), job(4, "beta", 1200, 100, 4)]


def test_one_user_cannot_overturn_a_measured_pair(tmp_path):
    """Real GPU jobs, sampled, but all of one user: a measured prior (Gavel: 1.00) stays."""
    jobs = SOLO + pair_runs(100, "mallory", "resnet18-bs32", "resnet18-bs32", 160, 4)
    db = history_with(tmp_path / "one", jobs)
    result = refit(db, predictor="measured")
    assert predicted(db, "resnet18-bs32", "resnet18-bs32") == pytest.approx(1.0, abs=0.01)
    assert any(h["job_class"] == "resnet18-bs32" and h["users"] == 1 for h in result["held"])
    # the same evidence from two users is believed
    jobs += pair_runs(200, "carol", "resnet18-bs32", "resnet18-bs32", 160, 2, start=50_000)
    db = history_with(tmp_path / "two", jobs)
    refit(db, predictor="measured")
    assert predicted(db, "resnet18-bs32", "resnet18-bs32") < 0.9


def test_an_outlier_among_a_pairs_observations_is_rejected(tmp_path):
    runs = pair_runs(100, "alice", "alpha", "beta", 125, 5)  # norm 0.8 each
    runs += pair_runs(300, "alice", "alpha", "beta", 1000, 1, start=90_000)  # norm 0.1: one odd run
    db = history_with(tmp_path, SOLO + runs)
    result = refit(db, predictor="measured")
    assert any(r["job_class"] == "alpha" and r["norm_tput"] == pytest.approx(0.1) for r in result["rejected"])
    assert predicted(db, "alpha", "beta") == pytest.approx(0.8, abs=0.03)


def test_reports_ignore_forged_tokens_of_an_old_history(tmp_path, capsys):
    victim, forged = job(1, "resnet50-bs64", 1000, 100, 0), job(2, "resnet50-bs64", 1000, 100, 0)
    forged.update(n_gpus=0, gres_alloc=None, comment=FORGED, horus_id="h0123456789",
                  horus_tokens=json.dumps({"slowdown": "0.20", "class": "resnet50-bs64", "gpus": "n1:0"}))
    path = tmp_path / "h.db"
    write_rows(open_db(path), [victim, copy.deepcopy(forged)], [])
    with pytest.raises(SystemExit):
        main(["report", "job", "1", "--db", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["corunners"] == []
    with pytest.raises(SystemExit):
        main(["report", "job", "2", "--db", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_list"] == [] and report.get("predicted_slowdown") is None


def test_horusds_feed_learns_the_pairs_measured_since_and_screens_them_as_a_refit_does(tmp_path):
    """Every 5 minutes horusd derives the pairs measured by recent jobs (no model refit) and, when the
    pairs measured here changed, asks for its policy to be rebuilt (which reads them as measured)."""
    from slurm_horus.learn.loop import local_observations
    from slurm_horus.service.history import History

    db = history_with(tmp_path, list(SOLO))
    rebuilt = []
    history = History(str(tmp_path / "h.db"), gpu_type="v100", on_pairs=lambda: rebuilt.append(1))
    assert history.local_pairs() == [] and history.told_pairs == {}
    now = 100_000
    assert not history.learn_pairs(db, now=now) and not rebuilt  # nothing shared yet: nothing changed
    db2 = history_with(tmp_path, pair_runs(100, "alice", "alpha", "beta", 125, 2))  # (the same file)
    assert history.learn_pairs(db2, now=now) and len(rebuilt) == 1  # norm 0.8, derived without a refit
    assert history.told_pairs[("v100", "alpha", "beta")] == pytest.approx(0.8, abs=0.01)
    assert not history.learn_pairs(db2, now=now) and len(rebuilt) == 1  # unchanged: no rebuild
    # what a rebuilt policy is told is the screened set a refit learns from, held pairs left out
    more = pair_runs(300, "mallory", "resnet18-bs32", "resnet18-bs32", 160, 4, start=40_000)
    db3 = history_with(tmp_path, more)
    assert not history.learn_pairs(db3, now=now)  # one user against Gavel's measured pair: held, not told
    assert {(o.job_class, o.corunner_class) for o in history.local_pairs()} == {("alpha", "beta"), ("beta", "alpha")}
    assert [(o.job_class, o.corunner_class) for o in local_observations(db3)] == \
        [("alpha", "beta"), ("beta", "alpha")]
    # jobs older than the feed's window are left to the refit (which derives from the whole history)
    old = pair_runs(500, "carol", "alpha", "beta", 250, 2, start=20_000)  # norm 0.4: would move the median
    db4 = history_with(tmp_path, old)
    assert not history.learn_pairs(db4, now=20_000 + 8 * 86400)
    assert history.learn_pairs(db4, now=30_000) and history.told_pairs[("v100", "alpha", "beta")] == \
        pytest.approx(0.6, abs=0.01)  # within the window: alice's 0.8 and carol's 0.4, one vote each
