"""Learning loop on a store filled with a small made-up history (two classes, some co-runs)."""

import pytest

from slurm_horus.collect.ingest import write_rows
from slurm_horus.collect.sampler import store_batches
from slurm_horus.learn.loop import active_model, derive_observations, gpu_type_from_name, refit
from slurm_horus.store.db import open_db
from history_data import job, samples


@pytest.fixture
def history(tmp_path):
    db = open_db(tmp_path / "h.db")
    jobs = [
        job(1, "alpha", 1000, 100, 0), job(2, "alpha", 1000, 100, 1),   # solo alpha: 100 s
        job(3, "beta", 1000, 50, 2),                                     # solo beta: 50 s
        # alpha and beta share GPU 3 for their whole run: alpha takes 160 s (norm 100/160 = 0.625)
        job(4, "alpha", 2000, 160, 3), job(5, "beta", 2000, 160, 3),
    ]
    write_rows(db, jobs, [])
    # the collector saw each on its GPU (the refit learns only from jobs it saw)
    store_batches(db, [batch for j in jobs for batch in samples(j["job_id"], int(j["gpu_indices"]), j["start_time"],
                                                                j["elapsed_s"], 50, 1000)])
    return db


def test_observations_from_elapsed_while_sharing_vs_solo(history):
    rows = {(r["job_id"], r["corunner_job_id"]): r for r in derive_observations(history)}
    alpha = rows[(4, 5)]
    assert alpha["job_class"] == "alpha" and alpha["corunner_class"] == "beta"
    # shared 160 s of 160: x = 1 - (160 - 100) / 160
    assert alpha["norm_tput"] == pytest.approx(0.625)
    assert rows[(5, 4)]["norm_tput"] == pytest.approx(1 - (160 - 50) / 160)
    assert set(rows) == {(4, 5), (5, 4)}  # solo jobs give no observation
    derive_observations(history)
    assert history.execute("SELECT count(*) FROM observations").fetchone()[0] == 2


def test_refit_moves_predictions_toward_observed(history):
    result = refit(history)
    assert result["n_observations"] == 2
    assert result["after"]["mae"] < result["before"]["mae"]
    for pair in result["pairs"]:
        assert abs(pair["after"] - pair["observed"]) < abs(pair["before"] - pair["observed"])
    stored = active_model(history)
    assert stored.predict("alpha", ["beta"], "v100") == pytest.approx(0.625, abs=0.01)
    again = refit(history)  # the refitted model is now "before": nothing left to gain
    assert again["before"]["mae"] == pytest.approx(again["after"]["mae"])


def test_gpu_type_from_nvml_name():
    assert gpu_type_from_name("Tesla V100-SXM2-16GB", "x") == "v100"
    assert gpu_type_from_name("NVIDIA H100 80GB HBM3", "x") == "h100"
    assert gpu_type_from_name("Stand-in GPU", "v100") == "v100"
