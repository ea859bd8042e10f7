"""The shipped Gavel priors load and give the default model working answers."""

import pytest

from slurm_horus.interference import build_model, builtin_priors, predict_set


@pytest.fixture(scope="module")
def chain():
    return build_model()


def test_priors_cover_both_gpu_types_and_every_pair():
    profiles, observations = builtin_priors()
    assert {p.gpu_type for p in profiles} == {"v100", "p100"}
    assert len({p.job_class for p in profiles}) == 26
    assert len(observations) == 2 * 26 * 26
    assert all(p.gpu_util is None and p.gmem_mb is None and p.solo_tput > 0 for p in profiles)


def test_chain_answers_a_known_pair_with_its_measurement(chain):
    _, observations = builtin_priors()
    seen = next(o for o in observations if o.gpu_type == "p100" and o.norm_tput > 0)
    answer = chain.explain(seen.job_class, [seen.corunner_class], "p100")
    assert answer.source == "measured"
    assert answer.norm_tput == pytest.approx(min(1.0, seen.norm_tput))


def test_observed_out_of_memory_pair_is_infeasible_both_ways(chain):
    for target, corunner in [("resnet50-bs128", "lm-bs20"), ("lm-bs20", "resnet50-bs128")]:
        answer = chain.explain(target, [corunner], "v100")
        assert answer.norm_tput == 0.0 and answer.source == "memory"


def test_unknown_class_gets_the_conservative_default(chain):
    answer = chain.explain("never-seen-bs1", ["a3c"], "v100")
    assert (answer.norm_tput, answer.source) == (0.5, "default")


def test_three_jobs_compose_below_each_pair(chain):
    jobs = ["resnet18-bs32", "a3c", "lm-bs5"]
    together = predict_set(chain, jobs, "v100")
    for i, job in enumerate(jobs):
        pairs = [chain.predict(job, [other], "v100") for other in jobs if other != job]
        assert 0 < together[i] <= min(pairs)
