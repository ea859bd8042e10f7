"""Each predictor on small hand-made data where the right answer is known."""

import json

import numpy as np
import pytest

from interference_data import additive_world, observations_of
from slurm_horus.interference import (
    PREDICTORS, Observation, SoloProfile, build_model, compose_norm_tputs, explain_set, model_from_dict,
    predict_set,
)

HIDDEN = {("job1-bs32", "job6-bs32"), ("job6-bs32", "job1-bs32"), ("job3-bs32", "job4-bs32"),
          ("job4-bs32", "job3-bs32"), ("job7-bs32", "job2-bs32"), ("job2-bs32", "job7-bs32")}


@pytest.fixture(scope="module")
def world():
    names, profiles, truth = additive_world()
    return names, profiles, truth, observations_of(truth, skip=HIDDEN)


def test_measured_returns_the_mean_of_repeated_observations_and_nothing_else():
    observations = [Observation("v100", "a", "b", 0.6), Observation("v100", "a", "b", 0.8)]
    model = build_model("measured", [], observations)
    assert model.explain("a", ["b"], "v100").norm_tput == pytest.approx(0.7)
    assert model.explain("a", ["b"], "v100").source == "measured"
    assert model.explain("b", ["a"], "v100").source == "default"  # the other direction was never seen
    assert model.explain("a", ["b"], "p100").source == "default"


def test_measured_min_count_requires_enough_observations():
    observations = [Observation("v100", "a", "b", 0.6)]
    model = build_model("measured", [], observations, min_count=2)
    assert model.explain("a", ["b"], "v100").source == "default"


def test_cf_recovers_hidden_cells_of_an_additive_matrix(world):
    names, profiles, truth, observations = world
    model = build_model("cf", profiles, observations)
    for t, c in HIDDEN:
        answer = model.explain(t, [c], "v100")
        assert answer.source == "cf"
        assert answer.norm_tput == pytest.approx(truth[t, c], abs=0.03)


def test_cf_uses_other_gpu_types_for_a_sparse_one():
    """A P100 that behaves like the V100, uniformly 0.1 slower, seen on a fifth of its pairs: cf
    must borrow the V100's structure (not explained by any profile feature)."""
    rng = np.random.default_rng(3)
    names = [f"c{i}" for i in range(10)]
    sensitivity, aggressiveness = rng.uniform(0, 0.3, 10), rng.uniform(0, 0.3, 10)
    v100 = {(t, c): 0.95 - sensitivity[i] - aggressiveness[j] for i, t in enumerate(names) for j, c in enumerate(names)}
    p100 = {key: value - 0.1 for key, value in v100.items()}
    keys = list(p100)
    seen = [keys[i] for i in rng.permutation(len(keys))[:20]]
    sparse = [Observation("p100", t, c, p100[t, c]) for t, c in seen]
    helped = build_model("cf", [], observations_of(v100) + sparse)
    alone = build_model("cf", [], sparse)
    error = lambda model: np.mean([abs(model.predict(t, [c], "p100") - p100[t, c]) for t, c in keys])  # noqa: E731
    assert error(helped) < 0.03
    assert error(helped) < error(alone)


def _utilization_world(law):
    utils = [10, 30, 50, 70, 90, 60]
    profiles = [SoloProfile(f"u{u}", "rtx3090", gpu_util=u, mem_util=u / 2, gmem_mb=1000) for u in utils]
    observations = [Observation("rtx3090", f"u{a}", f"u{b}", law(a / 100, b / 100))
                    for a in utils[:5] for b in utils[:5]]
    return profiles, observations


def test_utilization_fits_the_time_slicing_law_and_predicts_an_unseen_class():
    law = lambda a, b: 1.0 / max(1.0, a + b)  # noqa: E731
    profiles, observations = _utilization_world(law)
    model = build_model("utilization", profiles, observations)
    answer = model.explain("u60", ["u90"], "rtx3090")  # u60 never observed co-located
    assert answer.source == "utilization"
    assert answer.norm_tput == pytest.approx(law(0.6, 0.9), abs=0.03)


def test_utilization_without_enough_observations_answers_with_the_baseline():
    profiles, _ = _utilization_world(lambda a, b: 1.0)
    model = build_model("utilization", profiles, [])
    assert model.predict("u70", ["u60"], "rtx3090") == pytest.approx(1 / 1.3)
    assert model.predict("u10", ["u30"], "rtx3090") == pytest.approx(1.0)


def test_utilization_does_not_cover_classes_without_utilization(world):
    names, profiles, truth, observations = world
    model = build_model("utilization", profiles, observations)
    assert model.explain(names[0], [names[1]], "v100").source == "default"


def test_mlp_learns_the_additive_world_better_than_a_constant(world):
    names, profiles, truth, observations = world
    model = build_model("mlp", profiles, observations)
    errors = [abs(model.predict(t, [c], "v100") - truth[t, c]) for t, c in HIDDEN]
    constant = np.mean([o.norm_tput for o in observations])
    baseline = [abs(constant - truth[t, c]) for t, c in HIDDEN]
    assert np.mean(errors) < 0.06
    assert np.mean(errors) < np.mean(baseline)


def test_chain_asks_measured_then_cf_then_utilization_then_default(world):
    names, profiles, truth, observations = world
    extra = [SoloProfile("fresh-bs8", "v100", gpu_util=40, mem_util=20, gmem_mb=500)]
    model = build_model("chain", profiles + extra, observations)
    assert model.explain("job0-bs32", ["job1-bs32"], "v100").source == "measured"
    assert model.explain("job1-bs32", ["job6-bs32"], "v100").source == "cf"
    assert model.explain("fresh-bs8", ["fresh-bs8"], "v100").source == "utilization"
    assert model.explain("fresh-bs8", ["job0-bs32"], "v100").source == "default"
    assert model.explain("unknown", ["job0-bs32"], "v100").source == "default"


def test_alone_is_full_speed(world):
    model = build_model("measured", world[1], world[3])
    assert predict_set(model, ["job0-bs32"], "v100") == [1.0]
    assert explain_set(model, ["job0-bs32"], "v100")[0].source == "solo"


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_predict_pairs_agrees_with_predict(world, name):
    names, profiles, truth, observations = world
    model = build_model(name, profiles, observations)
    targets = np.array(names * len(names))
    corunners = np.repeat(names, len(names))
    batch = model.predict_pairs(targets, corunners, "v100")
    single = [model.predict(t, [c], "v100") for t, c in zip(targets, corunners)]
    assert np.allclose(batch, single)


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_to_dict_from_dict_round_trip(world, name):
    names, profiles, truth, observations = world
    model = build_model(name, profiles, observations)
    restored = model_from_dict(json.loads(json.dumps(model.to_dict())))
    for t in names:
        for c in names:
            assert restored.explain(t, [c], "v100") == model.explain(t, [c], "v100")
    # a GPU type the stored tables do not hold is computed after restoring too
    assert restored.predict(names[0], [names[1]], "a100") == pytest.approx(model.predict(names[0], [names[1]], "a100"))


def test_compose_rule_examples():
    assert compose_norm_tputs([0.7]) == pytest.approx(0.7)
    assert compose_norm_tputs([0.5, 0.5]) == pytest.approx(1 / 3)  # three jobs time-sliced evenly
    assert compose_norm_tputs([0.8, 0.0, 0.9]) == 0.0
    assert compose_norm_tputs([1.0, 1.0]) == 1.0
    assert compose_norm_tputs([1.3, 0.5]) == pytest.approx(0.5)  # values above 1 count as 1


def test_predict_set_composes_the_pair_predictions(world):
    names, profiles, truth, observations = world
    model = build_model("measured", profiles, observations)
    jobs = ["job0-bs32", "job2-bs32", "job5-bs32"]
    values = predict_set(model, jobs, "v100")
    answers = explain_set(model, jobs, "v100")
    for i, job in enumerate(jobs):
        pairs = [truth[job, other] for other in jobs if other != job]
        assert values[i] == answers[i].norm_tput == pytest.approx(compose_norm_tputs(pairs))
        assert answers[i].source == "measured"


def test_score_figures_on_known_values():
    from slurm_horus.interference.evaluate import score

    result = score([0.0, 0.5, 1.0, 0.0], [0.2, 0.5, 0.9, 0.0], ["cf", "measured", "default", "memory"])
    assert result["mae"] == pytest.approx(0.3 / 4)
    assert result["rmse"] == pytest.approx(np.sqrt(0.05 / 4))
    assert result["spearman"] == pytest.approx(0.9486833, abs=1e-6)
    assert result["infeasible_predicted_feasible"] == 0.5
    assert result["coverage"] == 0.75


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_no_data_at_all_gives_the_default(name):
    answer = build_model(name, [], []).explain("a", ["b"], "v100")
    assert (answer.norm_tput, answer.source) == (0.5, "default")


def test_chain_order_is_an_option(world):
    names, profiles, truth, observations = world
    extra = [SoloProfile("solo-only-bs4", "v100", solo_tput=12.0)]  # no utilization, never co-located
    default = build_model("chain", profiles + extra, observations)
    longer = build_model("chain", profiles + extra, observations, order=("measured", "cf", "utilization", "mlp"))
    assert default.explain("solo-only-bs4", ["job0-bs32"], "v100").source == "default"
    assert longer.explain("solo-only-bs4", ["job0-bs32"], "v100").source == "mlp"
