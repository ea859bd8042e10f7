"""Memory safety: no predictor ever calls a set feasible whose summed peak memory exceeds the GPU."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_horus.interference import PREDICTORS, Observation, SoloProfile, build_model, compose_norm_tputs, predict_set


def _profiles():
    sizes = {"small-bs8": 4000, "mid-bs32": 9000, "big-bs64": 14000}
    return [SoloProfile(name, "v100", gpu_util=50, mem_util=30, gmem_mb=mb, solo_tput=10) for name, mb in sizes.items()]


def _observations():
    names = ["small-bs8", "mid-bs32", "big-bs64"]
    return [Observation("v100", a, b, 0.6) for a in names for b in names]


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_pair_over_memory_is_zero_even_if_observed_feasible(name):
    model = build_model(name, _profiles(), _observations())  # V100: 16384 MB
    answer = model.explain("mid-bs32", ["big-bs64"], "v100")
    assert (answer.norm_tput, answer.source) == (0.0, "memory")
    assert model.predict("small-bs8", ["mid-bs32"], "v100") > 0
    assert model.predict_pairs(["big-bs64"], ["mid-bs32"], "v100")[0] == 0.0


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_three_jobs_over_memory_are_zero_although_every_pair_fits(name):
    profiles = [SoloProfile(f"j{i}-bs1", "v100", gpu_util=30, gmem_mb=6000) for i in range(3)]
    model = build_model(name, profiles, [])
    assert model.predict("j0-bs1", ["j1-bs1"], "v100") > 0
    assert predict_set(model, ["j0-bs1", "j1-bs1", "j2-bs1"], "v100") == [0.0] * 3


def test_gpu_memory_override_makes_a_pair_fit():
    model = build_model("chain", _profiles(), _observations(), gpu_memory_mb={"v100": 32768})
    assert model.predict("mid-bs32", ["big-bs64"], "v100") == pytest.approx(0.6)


def test_observed_failure_counts_for_both_directions_and_larger_batches():
    names = ["net-bs16", "net-bs32", "net-bs64", "other", "tiny"]
    observations = [Observation("p100", a, b, 0.5) for a in names for b in names
                    if a != b and {a, b} not in ({"net-bs32", "other"}, {"net-bs64", "other"})]
    observations.append(Observation("p100", "net-bs32", "other", 0.0))  # one direction, out of memory
    model = build_model("chain", [], observations)
    assert model.explain("other", ["net-bs32"], "p100").source == "memory"
    # never observed: net-bs64 needs at least the memory of net-bs32, so it fails with "other" too
    assert model.explain("net-bs64", ["other"], "p100").norm_tput == 0.0
    assert model.predict("net-bs16", ["other"], "p100") > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=6))
def test_composition_never_beats_the_worst_pair_and_adding_a_job_never_helps(values):
    together = compose_norm_tputs(values)
    assert 0.0 <= together <= min(values) + 1e-12
    assert compose_norm_tputs(values + [0.9]) <= together + 1e-12


def test_a_class_without_any_evidence_is_not_declared_out_of_memory():
    from slurm_horus.interference import builtin_priors

    profiles, observations = builtin_priors()
    model = build_model("chain", profiles + [SoloProfile("newcomer-bs8", "v100", solo_tput=5.0)], observations)
    for other in ["a3c", "resnet50-bs128", "newcomer-bs8"]:
        assert model.explain("newcomer-bs8", [other], "v100").source == "default"
