"""Placement core on tiny hand-made clusters: filter, score, select and every policy's rule."""

import re

import numpy as np
import pytest

from slurm_horus.interference.base import Prediction, Predictor
from slurm_horus.placement import (JobRequest, NodeGroup, PairTable, PolicyModels, RunningJob,
                                   SchedulingContext, build_cluster, make_policy, parse_cluster_spec)
from slurm_horus.placement.policies import POLICY_NAMES
from slurm_horus.placement.policies.sjf_bsbf import pair_benefit


class TablePredictor(Predictor):
    """A stand-in model: pair values from a dict, ``default`` for the rest."""

    name = "table"

    def __init__(self, pairs=None, default=0.5):
        self.pairs = dict(pairs or {})
        self.default = default

    def fit(self, profiles, observations):
        return self

    def explain(self, target, corunners, gpu_type):
        value = 1.0
        for c in corunners:
            value = min(value, self.pairs.get((target, c), self.default))
        return Prediction(value, "table")

    def predict_pairs(self, targets, corunners, gpu_type):
        return np.array([self.pairs.get((t, c), self.default) for t, c in zip(targets, corunners)])


def cluster(nodes=1, gpus=4, mem=16000.0, partitions=("default",), classes=None):
    return build_cluster([NodeGroup(nodes, gpus, "v100", mem, partitions)], classes=classes)


def models_for(state, predictor):
    return PolicyModels(state.classes, lambda kind: predictor, truth=predictor)


def run(policy, state, req, now=0.0, n_waiting=1, waiting_gpus=None, window=None):
    ctx = SchedulingContext(now, n_waiting, req.n_gpus if waiting_gpus is None else waiting_gpus)
    if window is not None:
        ctx.extra["window"] = [state.classes.id(c) for c in window]
    decision = policy.decide(state, req, ctx, explain=True)
    if decision.placed:
        state.place(policy.running_job(req, decision, now))
    return decision


def fill(state, policy, classes, now=0.0):
    return [run(policy, state, JobRequest(f"r{i}", c, predicted_duration=100.0), now) for i, c in enumerate(classes)]


# ---- ClusterState ---------------------------------------------------------------------------------
def test_state_tracks_free_gpus_and_residents():
    state = cluster(2, 2)
    assert state.n_free == 4
    state.place(RunningJob("a", "x", (0, 1), 0.0, 10.0))
    state.place(RunningJob("b", "y", (1,), 0.0, 20.0))
    assert state.n_free == 2 and list(state.node_free) == [0, 2]
    assert state.gpu_njobs.tolist() == [1, 2, 0, 0]
    assert state.gpu_class0[1] == state.classes.id("x")
    state.release("a")
    assert state.gpu_njobs.tolist() == [0, 1, 0, 0]
    assert state.gpu_class0[1] == state.classes.id("y") and state.gpu_end0[1] == 20.0
    assert state.n_free == 3


def test_parse_cluster_spec():
    assert parse_cluster_spec("16x4:v100,2x8:A100") == [(16, 4, "v100"), (2, 8, "a100")]
    with pytest.raises(ValueError):
        parse_cluster_spec("16:v100")


# ---- filter / select ------------------------------------------------------------------------------
def test_exclusive_first_fit_and_waiting():
    state = cluster(1, 2)
    policy = make_policy("slurm-default", models_for(state, TablePredictor()))
    decisions = fill(state, policy, ["a", "b", "c"])
    assert [d.gpu_ids for d in decisions[:2]] == [(0,), (1,)]
    assert not decisions[2].placed and "not enough" in decisions[2].reason


def test_memory_filter_blocks_sharing_that_does_not_fit():
    state = cluster(1, 1, mem=10000.0)
    policy = make_policy("sjf-ffs", models_for(state, TablePredictor(default=0.9)))
    first = run(policy, state, JobRequest("a", "x", mem_mb=6000.0))
    second = run(policy, state, JobRequest("b", "y", mem_mb=6000.0))
    assert first.placed and not second.placed
    third = run(policy, state, JobRequest("c", "y", mem_mb=3000.0))
    assert third.placed and third.shared


def test_predicted_oom_is_never_a_candidate():
    state = cluster(1, 1)
    policy = make_policy("sjf-ffs", models_for(state, TablePredictor({("y", "x"): 0.0}, default=0.9)))
    run(policy, state, JobRequest("a", "x"))
    assert not run(policy, state, JobRequest("b", "y")).placed
    assert run(policy, state, JobRequest("c", "z")).placed


def test_partition_filter():
    state = build_cluster([NodeGroup(1, 2, "v100", 16000.0, ("train",)),
                           NodeGroup(1, 2, "v100", 16000.0, ("infer",))])
    policy = make_policy("slurm-default", models_for(state, TablePredictor()))
    d = run(policy, state, JobRequest("a", "x", partition="infer"))
    assert d.gpu_ids == (2,)


def test_multi_gpu_job_prefers_one_switch_group():
    # 4 GPUs, two per PCIe switch: GPU 0 busy, so a 2-GPU job takes the second switch (2, 3)
    state = cluster(1, 4)
    policy = make_policy("slurm-default", models_for(state, TablePredictor()))
    run(policy, state, JobRequest("a", "x"))
    d = run(policy, state, JobRequest("b", "x", gpus_per_node=2))
    assert sorted(d.gpu_ids) == [2, 3]
    assert d.gpus == {state.nodes[0].name: sorted(d.gpus[state.nodes[0].name])}


def test_multi_node_job_spans_nodes():
    state = cluster(3, 2)
    policy = make_policy("slurm-default", models_for(state, TablePredictor()))
    run(policy, state, JobRequest("a", "x"))
    d = run(policy, state, JobRequest("b", "x", gpus_per_node=2, nodes=2))
    assert d.placed and len(d.nodes) == 2 and state.nodes[0].name not in d.nodes


def test_explain_lists_candidates_with_scores():
    state = cluster(1, 2)
    policy = make_policy("horus", models_for(state, TablePredictor(default=0.8)))
    d = run(policy, state, JobRequest("a", "x"))
    assert d.candidates and d.candidates[0].where.endswith("gpu0")
    assert "candidates" in d.to_dict()


# ---- policies ---------------------------------------------------------------------------------------
def test_sjf_orders_by_predicted_duration():
    policy = make_policy("sjf", models_for(cluster(), TablePredictor()))
    queue = [JobRequest("long", "x", predicted_duration=500, submit_time=0),
             JobRequest("short", "x", predicted_duration=5, submit_time=9)]
    assert [r.job_id for r in policy.order(queue)] == ["short", "long"]
    fifo = make_policy("slurm-default", models_for(cluster(), TablePredictor()))
    assert [r.job_id for r in fifo.order(queue)] == ["long", "short"]


def test_sjf_ffs_takes_free_gpus_first_then_shares_the_first_that_qualifies():
    state = cluster(1, 2)
    policy = make_policy("sjf-ffs", models_for(state, TablePredictor(default=0.3)))
    decisions = fill(state, policy, ["a", "b", "c", "d", "e"])
    # free GPUs first (first fit), then sharing in GPU order whatever the interference; ≤ 2 jobs per GPU
    assert [d.gpu_ids for d in decisions[:4]] == [(0,), (1,), (0,), (1,)]
    assert [d.shared for d in decisions[:4]] == [False, False, True, True]
    assert not decisions[4].placed


def test_sjf_ffs_multi_gpu_job_prefers_a_node_of_free_gpus():
    state = cluster(2, 2)
    state.place(RunningJob("r", "a", (0,), 0.0, 100.0))
    policy = make_policy("sjf-ffs", models_for(state, TablePredictor(default=0.9)))
    d = run(policy, state, JobRequest("m", "b", gpus_per_node=2))
    assert d.gpu_ids == (2, 3) and not d.shared


def test_bsbf_formula_matches_hand_computation():
    # E_a=100, E_b=100, ξ=2 for both: Ê_a=Ê_b=200 → T_con = 50 + (1-1/4)*200 = 200; T_seq = 150
    assert pair_benefit(100.0, 100.0, 0.5, 0.5) == pytest.approx(150 - 200)
    # nearly free sharing: ξ=1.1 → T_con = 50 + (1-1/2.2)*110 = 110; T_seq = 150
    assert pair_benefit(100.0, 100.0, 1 / 1.1, 1 / 1.1) == pytest.approx(150 - (50 + (1 - 1 / 2.2) * 110))


def test_bsbf_shares_only_when_benefit_positive_and_picks_best():
    state = cluster(1, 2)
    table = TablePredictor({("n", "good"): 0.95, ("good", "n"): 0.95, ("n", "bad"): 0.4, ("bad", "n"): 0.4})
    policy = make_policy("sjf-bsbf", models_for(state, table))
    fill(state, policy, ["bad", "good"])
    d = run(policy, state, JobRequest("n1", "n", predicted_duration=100.0))
    assert d.placed and d.shared and d.gpu_ids == (1,)
    state2 = cluster(1, 1)
    policy2 = make_policy("sjf-bsbf", models_for(state2, table))
    fill(state2, policy2, ["bad"])
    assert not run(policy2, state2, JobRequest("n2", "n", predicted_duration=100.0)).placed


def test_bsbf_breaks_ties_by_lowest_t_con_as_the_reference():
    # two qualifying partners: "near" ends soon (low T_con), "far" gives the larger T_seq − T_con
    state = cluster(1, 2)
    state.place(RunningJob("near", "near", (0,), 0.0, 20.0))
    state.place(RunningJob("far", "far", (1,), 0.0, 1000.0))
    table = TablePredictor({("n", "near"): 0.8, ("near", "n"): 0.8, ("n", "far"): 0.9, ("far", "n"): 0.9})
    policy = make_policy("sjf-bsbf", models_for(state, table))
    from slurm_horus.placement.policies.sjf_bsbf import pair_times
    times = {name: pair_times(100.0, end, table.pairs[("n", name)], table.pairs[(name, "n")])
             for name, end in (("near", 20.0), ("far", 1000.0))}
    assert all(t_con < t_seq for t_con, t_seq in times.values())
    assert times["near"][0] < times["far"][0]  # lowest T_con ...
    assert times["far"][1] - times["far"][0] > times["near"][1] - times["near"][0]  # ... not largest benefit
    d = run(policy, state, JobRequest("n", "n", predicted_duration=100.0))
    assert d.shared and d.gpu_ids == (0,)


def test_bsbf_sub_batches_a_pair_that_does_not_fit_in_memory():
    state = cluster(1, 1)
    state.place(RunningJob("r", "lm-bs20", (0,), 0.0, 400.0))
    table = TablePredictor({("resnet50-bs64", "lm-bs20"): 0.0, ("lm-bs20", "resnet50-bs64"): 0.0,
                            ("resnet50-bs32", "lm-bs20"): 0.8, ("lm-bs20", "resnet50-bs32"): 0.8,
                            ("resnet50-bs16", "lm-bs20"): 0.9, ("lm-bs20", "resnet50-bs16"): 0.9}, default=0.5)
    for name in ("resnet50-bs16", "resnet50-bs32"):
        state.classes.id(name)
    solo = {("v100", "resnet50-bs64"): 4.0, ("v100", "resnet50-bs32"): 7.0, ("v100", "resnet50-bs16"): 12.0}
    models = PolicyModels(state.classes, lambda kind: table, truth=table, profiles=[])
    models.solo_tput.update(solo)
    policy = make_policy("sjf-bsbf", models)
    d = run(policy, state, JobRequest("n", "resnet50-bs64", predicted_duration=100.0))
    # the largest micro-batch that fits and still pays: 32 x 2, at 0.8 x (7*32)/(4*64) of its speed
    assert d.placed and d.shared and (d.micro_batch, d.grad_accum) == (32, 2)
    assert d.predicted_norm_tput == pytest.approx(0.8 * (7 * 32) / (4 * 64))
    assert d.to_dict()["micro_batch"] == 32 and "sub-batched" in d.reason
    assert state.jobs["n"].job_class == "resnet50-bs32"  # what runs (and interferes) is the micro-batch
    off = make_policy("sjf-bsbf/sub_batch=false", models)
    state.release("n")
    assert not run(off, state, JobRequest("n2", "resnet50-bs64", predicted_duration=100.0)).placed


def horus_util(state, table, util):
    policy = make_policy("horus-util", models_for(state, table))
    policy.utilization.update({("v100", c): u for c, u in util.items()})
    policy._per_type.clear()
    return policy


def test_horus_util_takes_free_gpus_first_then_packs_toward_full_utilization():
    state = cluster(1, 4)
    util = {"a": 60.0, "b": 30.0, "c": 90.0, "n": 40.0, "m": 10.0}
    policy = horus_util(state, TablePredictor(default=0.7), util)
    for g, c in enumerate(["a", "b", "c"]):
        state.place(RunningJob(c, c, (g,), 0.0, 100.0))
    assert run(policy, state, JobRequest("free", "n")).gpu_ids == (3,)  # a free GPU always costs least
    state.release("free")
    state.place(RunningJob("d", "m", (3,), 0.0, 100.0))
    # a+n = 100 % (cost 1.0), b+n = 70 % (1.3), c+n = 130 % (1 + 0.3 x 1.6), m+n = 50 % (1.5)
    assert run(policy, state, JobRequest("n1", "n")).gpu_ids == (0,)
    # GPU 0 now has two jobs: one more co-runner costs 1, so b (70 % + 40 %) wins over a+n+n
    assert run(policy, state, JobRequest("n2", "n")).gpu_ids == (1,)


def test_horus_util_packs_up_to_three_jobs_and_checks_every_resident():
    state = build_cluster([NodeGroup(1, 1, "v100", 16000.0)], max_jobs_per_gpu=3)
    table = TablePredictor({("z", "b"): 0.0, ("b", "z"): 0.0}, default=0.7)
    policy = horus_util(state, table, {"a": 30.0, "b": 30.0, "y": 30.0, "z": 30.0})
    state.place(RunningJob("r1", "a", (0,), 0.0, 100.0))
    state.place(RunningJob("r2", "b", (0,), 0.0, 100.0))
    assert not run(policy, state, JobRequest("z1", "z")).placed  # z cannot fit with b (second resident)
    assert run(policy, state, JobRequest("y1", "y")).gpu_ids == (0,)  # a third job
    assert not run(policy, state, JobRequest("y2", "y")).placed  # never a fourth


def test_horus_util_utilization_cap_option_shares_only_below_the_sum():
    """``max_util_sum`` (off by default, not the reference's rule): a GPU is shared only while the
    predicted utilization sum stays at or under it; a free GPU is always allowed."""
    state = cluster(1, 2)
    util = {"a": 60.0, "b": 30.0, "n": 40.0}
    state.place(RunningJob("ra", "a", (0,), 0.0, 100.0))
    state.place(RunningJob("rb", "b", (1,), 0.0, 100.0))
    default = horus_util(state, TablePredictor(default=0.7), util)
    assert run(default, state, JobRequest("n1", "n")).gpu_ids == (0,)  # a+n = 100 %: least cost
    state.release("n1")
    capped = make_policy("horus-util/max_util_sum=80", models_for(state, TablePredictor(default=0.7)))
    capped.utilization.update({("v100", c): u for c, u in util.items()})
    capped._per_type.clear()
    assert run(capped, state, JobRequest("n2", "n")).gpu_ids == (1,)  # only b+n = 70 % stays under 80 %
    state.release("n2")
    capped.max_util_sum = 60.0
    assert not run(capped, state, JobRequest("n3", "n")).placed  # both sums over 60 %: it waits


def test_horus_util_sums_follow_the_state_change_log_through_trims():
    """horus-util keeps per-GPU utilization, memory and resident classes (and their bit sets) from the
    state's change log; after random places and releases (a job re-placed under its id included, the log trimmed) they
    equal the sums a fresh policy builds from the jobs."""
    rng = np.random.default_rng(5)
    state = build_cluster([NodeGroup(2, 4, "v100", 16000.0)], max_jobs_per_gpu=3)
    state.CHANGES_KEPT = 7  # trim often
    util = {"a": 30.0, "b": 55.0, "c": 80.0}
    policy = horus_util(state, TablePredictor(default=0.7), util)
    placed = 0
    for step in range(300):
        if state.jobs and rng.random() < 0.45:
            job_id = str(rng.choice(sorted(state.jobs)))
            job = state.release(job_id)
            if rng.random() < 0.3:  # the same id placed again elsewhere
                g = int(rng.integers(8))
                if state.gpu_njobs[g] < 3:
                    state.place(RunningJob(job_id, job.job_class, (g,), 0.0, 100.0, mem_mb=job.mem_mb))
        else:
            g = int(rng.integers(8))
            if state.gpu_njobs[g] < 3:
                state.place(RunningJob(f"j{step}", str(rng.choice(list(util))), (g,), 0.0, 100.0,
                                       mem_mb=float(rng.choice([0.0, 1000.0, 2500.0]))))
                placed += 1
        if rng.random() < 0.3:
            policy._sync(state)
    policy._sync(state)
    fresh = horus_util(state, TablePredictor(default=0.7), util)
    fresh._sync(state)
    assert placed > 50 and state.changes_base > 0
    np.testing.assert_allclose(policy._util_sum, fresh._util_sum, atol=1e-9)
    np.testing.assert_allclose(policy._mem_sum, fresh._mem_sum, atol=1e-9)
    assert (np.sort(policy._residents, axis=1) == np.sort(fresh._residents, axis=1)).all()
    # each GPU's resident classes as a bit set (what the clash test reads): bit c for a class-c job there
    assert list(policy._bits) == [sum(1 << int(c) for c in set(row.tolist()) if c >= 0) for row in policy._residents]


def test_horus_util_queue_by_utilization_with_look_ahead():
    state = cluster(1, 1)
    policy = horus_util(state, TablePredictor(default=0.7), {"hi": 90.0, "lo": 10.0})
    queue = [JobRequest("h", "hi", submit_time=0.0), JobRequest("l", "lo", submit_time=5.0)]
    assert [r.job_id for r in policy.order(queue)] == ["l", "h"]
    # a class nobody measured: predicted from its model's features (no profiling)
    assert policy.util_of("resnet50-bs64", "v100") > 90.0 and policy.util_of("a3c", "v100") < 20.0
    assert policy.util_of("no-such-model", "v100") == policy.unknown_util
    # the look-ahead: after 5 jobs failed in one cycle, the rest of the queue waits for the next cycle
    for k in range(3):
        state.place(RunningJob(f"r{k}", "hi", (0,), 0.0, 100.0))
    ctx = SchedulingContext(0.0, 9, 9)
    reasons = [policy.decide(state, JobRequest(f"w{i}", "lo"), ctx).reason for i in range(7)]
    assert all("look-ahead" not in r for r in reasons[:5]) and all("look-ahead" in r for r in reasons[5:])
    assert "look-ahead" not in policy.decide(state, JobRequest("w", "lo"), SchedulingContext()).reason


def test_iasp_picks_least_similar_node_then_best_gpu():
    state = cluster(2, 2)
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    state.place(RunningJob("a2", "a", (1,), 0.0, 100.0))
    state.place(RunningJob("b", "b", (2,), 0.0, 100.0))
    state.place(RunningJob("b2", "b", (3,), 0.0, 100.0))
    table = TablePredictor({("n", "a"): 0.6, ("a", "n"): 0.9, ("n", "b"): 0.9, ("b", "n"): 0.7})
    policy = make_policy("iasp-iapp", models_for(state, table))
    d = run(policy, state, JobRequest("n", "n"))
    assert state.gpu_node[d.gpu_ids[0]] == 1


def test_iasp_equal_similarity_goes_to_the_first_node():
    """Nodes of equal similarity (here: the idle ones, 0) are taken in node order, for one node or
    several."""
    state = cluster(4, 2)
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))  # node 0: similar to n (0.4)
    table = TablePredictor({("n", "a"): 0.6, ("a", "n"): 0.9}, default=0.9)
    policy = make_policy("iasp-iapp", models_for(state, table))
    d = run(policy, state, JobRequest("n", "n"))
    assert state.gpu_node[d.gpu_ids[0]] == 1
    state.release("n")
    d = run(policy, state, JobRequest("m", "n", gpus_per_node=2, nodes=2))
    assert sorted({int(state.gpu_node[g]) for g in d.gpu_ids}) == [1, 2]


def test_iasp_two_stages_node_by_similarity_then_gpus_by_performance_and_communication():
    state = cluster(2, 4)  # GPUs 0,1 | 2,3 share a switch on each node
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))  # node 0: a (similar to n), node 1: b (not)
    state.place(RunningJob("b", "b", (5,), 0.0, 100.0))
    table = TablePredictor({("n", "a"): 0.5, ("a", "n"): 0.9, ("n", "b"): 0.95, ("b", "n"): 0.9}, default=0.9)
    policy = make_policy("iasp-iapp", models_for(state, table))
    # node 1 is the least similar even though node 0 has three free GPUs; there, the two free GPUs of one
    # switch (6, 7) beat free GPU 4 + another switch, and GPU 5 (shared: 0.95 < 1)
    d = run(policy, state, JobRequest("n", "n", gpus_per_node=2))
    assert d.gpu_ids == (6, 7) and not d.shared
    with pytest.raises(ValueError):
        make_policy("iasp-iapp/similarity=mlp", models_for(state, table))


def test_deepboot_lends_and_reclaims():
    state = build_cluster([NodeGroup(1, 1, "v100", 16000.0, ("train",)),
                           NodeGroup(1, 1, "v100", 16000.0, ("infer",))])
    policy = make_policy("deepboot", models_for(state, TablePredictor()))
    run(policy, state, JobRequest("t1", "x", partition="train", extra_partitions=("infer",)))
    lent = run(policy, state, JobRequest("t2", "x", partition="train", extra_partitions=("infer",)), now=5.0)
    assert lent.gpu_ids == (1,)
    inference = JobRequest("i1", "infer-bert", partition="infer")
    assert not policy.decide(state, inference).placed
    assert policy.reclaim(state, inference, SchedulingContext()) == ["t2"]
    nolend = make_policy("deepboot-nolend", models_for(state, TablePredictor()))
    state2 = build_cluster([NodeGroup(1, 1, "v100", 16000.0, ("train",)),
                            NodeGroup(1, 1, "v100", 16000.0, ("infer",))])
    run(nolend, state2, JobRequest("t1", "x", partition="train", extra_partitions=("infer",)))
    assert not run(nolend, state2, JobRequest("t2", "x", partition="train", extra_partitions=("infer",))).placed


def test_horus_exclusive_without_pressure_pairs_under_pressure():
    state = cluster(1, 2)
    table = TablePredictor({("n", "a"): 0.9, ("a", "n"): 0.9, ("n", "b"): 0.5, ("b", "n"): 0.5})
    policy = make_policy("horus", models_for(state, table))
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    calm = policy.decide(state, JobRequest("n", "n"), SchedulingContext(0.0, 1, 1))
    assert calm.placed and not calm.shared
    busy = policy.decide(state, JobRequest("n", "n"), SchedulingContext(0.0, 5, 5))
    assert busy.shared and busy.gpu_ids == (0,) and busy.corunner_norm_tput == {"a": 0.9}


def test_horus_keeps_a_slot_for_a_better_waiting_partner():
    state = cluster(1, 1)
    table = TablePredictor({("n", "a"): 0.6, ("a", "n"): 0.6, ("m", "a"): 0.95, ("a", "m"): 0.95})
    policy = make_policy("horus", models_for(state, table))
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    assert run(policy, state, JobRequest("n", "n"), n_waiting=5, waiting_gpus=5, window=["n", "m"]).placed is False
    assert run(policy, state, JobRequest("m", "m"), n_waiting=5, waiting_gpus=5, window=["n", "m"]).shared


def test_horus_learns_from_observations():
    state = cluster(1, 1)
    policy = make_policy("horus", models_for(state, TablePredictor(default=0.9)))
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    assert run(policy, state, JobRequest("n", "n"), n_waiting=3, waiting_gpus=3).shared
    state.release("n")
    policy.observe("v100", "n", "a", 0.3)
    policy.observe("v100", "a", "n", 0.3)
    assert not run(policy, state, JobRequest("n2", "n"), n_waiting=3, waiting_gpus=3).placed


def test_oracle_ignores_observations():
    state = cluster(1, 1)
    policy = make_policy("oracle", models_for(state, TablePredictor(default=0.9)))
    policy.observe("v100", "n", "a", 0.1)
    assert policy.pairs.tput("v100", "n", "a") == pytest.approx(0.9)


def test_oracle_options_tell_any_policy_the_truth_in_the_simulator_only():
    """``oracle_pairs`` / ``oracle_durations``: explicit, per policy, refused without the truth."""
    from slurm_horus.placement.policies import reads_truth

    state = cluster(1, 1)
    truth, predicted = TablePredictor({("n", "a"): 0.2}, default=0.9), TablePredictor(default=0.9)
    models = PolicyModels(state.classes, lambda kind: predicted, truth=truth)
    told = make_policy("horus-risk/oracle_pairs=true/risk=0.5", models)
    assert told.risk == 0.5 and told.pairs.tput("v100", "n", "a") == pytest.approx(0.2)  # the truth's value
    assert not told.perfect_knowledge  # durations still estimated
    told.observe("v100", "n", "a", 0.8)  # the truth is not learned over
    assert told.pairs.tput("v100", "n", "a") == pytest.approx(0.2) and told.pairs.sigma("v100").max() == 0
    plain = make_policy("horus-risk", models)
    assert plain.pairs.tput("v100", "n", "a") == pytest.approx(0.9)  # the prediction
    both = make_policy("sjf-bsbf/oracle_pairs=yes/oracle_durations=true", models)
    assert both.perfect_knowledge and both.pairs.tput("v100", "n", "a") == pytest.approx(0.2)
    assert not make_policy("sjf/oracle_durations=false", models).perfect_knowledge
    live = PolicyModels(state.classes, lambda kind: predicted)  # horusd's: no truth
    for spec in ("horus-risk/oracle_pairs=true", "sjf/oracle_durations=1"):
        with pytest.raises(ValueError, match="truth; horusd cannot run it live"):
            make_policy(spec, live)
        assert reads_truth(spec)
    with pytest.raises(ValueError, match="oracle_pairs: 'maybe' is not true or false"):
        make_policy("horus/oracle_pairs=maybe", models)
    with pytest.raises(ValueError, match="option require_benefit: 'maybe' is not true or false"):
        make_policy("horus/require_benefit=maybe", models)  # every yes/no option is read the same way
    assert make_policy("sjf/oracle_durations=off", live).name == "sjf"
    assert not reads_truth("horus-risk/oracle_pairs=false") and reads_truth("oracle/guard=0")


def test_pair_table_grows_with_new_classes():
    state = cluster()
    table = PairTable(TablePredictor({("a", "b"): 0.7}), state.classes)
    assert table.tput("v100", "a", "b") == pytest.approx(0.7)
    assert table.matrix("v100").shape == (2, 2)
    assert table.tput("v100", "c", "a") == pytest.approx(0.5)
    table.observe("v100", "a", "b", 0.2)
    table.observe("v100", "a", "b", 0.4)
    assert table.tput("v100", "a", "b") == pytest.approx(0.3)


class SourcedPredictor(TablePredictor):
    """TablePredictor that says where each answer came from: ``sure`` pairs from memory (σ 0)."""

    def __init__(self, pairs=None, default=0.5, sure=()):
        super().__init__(pairs, default)
        self.sure = set(sure)

    def sources_pairs(self, targets, corunners, gpu_type):
        return ["memory" if (t, c) in self.sure else "cf" for t, c in zip(targets, corunners)]


def test_pair_table_calibration_moves_unmeasured_pairs_by_the_measured_residuals():
    state = cluster()
    predictor = SourcedPredictor(default=0.5, sure={("a", "d")})
    plain, table = PairTable(predictor, state.classes), PairTable(predictor, state.classes, calibrate=2.0)
    for t in (plain, table):
        for name in "abcd":
            t.tput("v100", name, "a")
        t.observe("v100", "a", "b", 0.2)  # class a as the target runs 0.3 below the prediction
        t.observe("v100", "a", "c", 0.2)
    # residuals -0.3, -0.3; shrinkage 2: μ = -0.6 / 4, β_a = 2 × -0.15 / 4, γ_b = γ_c = -0.075 / 3
    assert table.tput("v100", "a", "b") == pytest.approx(0.2)  # measured: the measurement
    assert table.tput("v100", "a", "a") == pytest.approx(0.5 - 0.15 - 0.075)
    assert table.tput("v100", "d", "b") == pytest.approx(0.5 - 0.15 - 0.025)
    assert table.tput("v100", "a", "d") == pytest.approx(0.5)  # the predictor is sure (σ 0): left alone
    assert table.tput("v100", "a", "e") == pytest.approx(0.5 - 0.15 - 0.075)  # a class seen later too
    assert plain.tput("v100", "a", "a") == pytest.approx(0.5)  # without calibration one pair at a time
    a, c = state.classes.ids["a"], state.classes.ids["c"]
    assert plain.changes_since(plain.n_observations - 1) == [("v100", a, c)]
    assert table.changes_since(table.n_observations - 1) is None  # every unmeasured value moved
    assert table.changes_since(table.n_observations) == []
    assert make_policy("horus-risk/calibrate=2", models_for(state, predictor)).pairs.calibrate == 2.0
    assert make_policy("horus-risk", models_for(state, predictor)).pairs.calibrate == 3.0  # its default
    assert make_policy("horus", models_for(state, predictor)).pairs.calibrate == 0  # off: thresholds set without


def test_calibrated_values_carry_the_spread_the_measured_pairs_showed():
    """calibrate_spread: the source's σ (cf: 0.10) counts as ``calibrate`` pairs; the measured pairs'
    errors left after the offsets, scaled by their leverage, are the rest of the evidence."""
    state = cluster()
    predictor = SourcedPredictor(default=0.5, sure={("a", "d")})
    names = "abcdef"

    def table_after(values):
        table = PairTable(predictor, state.classes, calibrate=2.0)
        table.calibrate_spread = True
        for name in names:
            table.tput("v100", name, "a")
        for (t, c), value in values.items():
            table.observe("v100", t, c, value)
        ids = state.classes.ids
        return table, lambda t, c: float(table.sigma("v100")[ids[t], ids[c]])

    # every measured pair 0.1 above its prediction: the offsets explain them all, the spread narrows
    pairs = [(t, c) for t in "abc" for c in "abc" if (t, c) != ("a", "a")]
    even, sigma = table_after({pair: 0.6 for pair in pairs})
    n = len(pairs)
    assert sigma("a", "a") == pytest.approx(np.sqrt(2.0 * 0.1 ** 2 / (2.0 + n)), rel=0.05)
    assert sigma("a", "d") == 0.0  # the predictor is sure: left alone
    assert sigma("b", "c") == pytest.approx(0.05)  # measured: the measurement's own σ
    # measured pairs the offsets cannot explain (a checkerboard): the spread grows past the source's
    checker, sigma = table_after({(t, c): (0.9 if (ord(t) + ord(c)) % 2 else 0.1) for t, c in pairs})
    assert sigma("a", "a") > 0.2 and sigma("d", "e") == sigma("a", "a")  # one spread for the GPU type
    plain = PairTable(predictor, state.classes, calibrate=2.0)
    for name in names:
        plain.tput("v100", name, "a")
    plain.observe("v100", "b", "c", 0.9)
    assert float(plain.sigma("v100")[state.classes.ids["a"], state.classes.ids["a"]]) == 0.1  # option off
    assert make_policy("horus-risk/calibrate_spread=true", models_for(state, predictor)).pairs.calibrate_spread
    assert not make_policy("horus-risk", models_for(state, predictor)).pairs.calibrate_spread


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_places_on_an_empty_cluster(name):
    state = build_cluster([NodeGroup(1, 2, "v100", 16000.0, ("train", "infer", "default"))])
    policy = make_policy(name, models_for(state, TablePredictor()))
    d = policy.decide(state, JobRequest("j", "x", predicted_duration=10.0))
    assert d.placed and not d.shared and d.policy == policy.name


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", models_for(cluster(), TablePredictor()))


def test_policy_options_are_parsed():
    policy = make_policy("horus/order_rule=fifo/min_combined=1.3", models_for(cluster(), TablePredictor()))
    assert policy.order_rule == "fifo" and policy.min_combined == 1.3
    with pytest.raises(ValueError):
        make_policy("horus/bogus=1", models_for(cluster(), TablePredictor()))
    with pytest.raises(ValueError, match="explore_budget"):  # horus's rule, which horus-risk would not apply
        make_policy("horus-risk/probe_once=true", models_for(cluster(), TablePredictor()))
    assert not make_policy("horus/probe_once=false", models_for(cluster(), TablePredictor())).probe_once


def test_horus_bar_is_higher_for_pairs_already_measured():
    state = cluster(1, 1)
    policy = make_policy("horus", models_for(state, TablePredictor(default=0.55)))  # predicted 1.1 combined
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    assert run(policy, state, JobRequest("n", "n", predicted_duration=50.0), n_waiting=3, waiting_gpus=3).shared  # explored
    state.release("n")
    policy.observe("v100", "n", "a", 0.55)
    policy.observe("v100", "a", "n", 0.55)  # measured: 1.1 < min_combined_known
    assert not run(policy, state, JobRequest("n2", "n", predicted_duration=50.0), n_waiting=3, waiting_gpus=3).placed
    policy.observe("v100", "n", "a", 0.85)  # running mean 0.7 → 1.25 combined
    assert run(policy, state, JobRequest("n3", "n", predicted_duration=50.0), n_waiting=3, waiting_gpus=3).shared


def test_horus_risk_explores_unknown_pairs_within_its_budget_then_weighs_risk():
    """An unknown pair (default prior: widest spread) is formed on its expected benefit alone while the
    GPU type's exploration budget lasts; then the same pair must clear risk × its spread."""
    state = cluster(1, 1)
    policy = make_policy("horus-risk/explore_budget=1/risk=3", models_for(state, TablePredictor(default=0.6)))
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    first = run(policy, state, JobRequest("n", "n", predicted_duration=20.0, duration_sigma=0.5),
                n_waiting=3, waiting_gpus=3)
    assert first.shared and "explores an unknown pair" in first.reason
    assert policy.explored == {"v100": 1}
    # the risk it did not count is still shown (computed for the explanation only)
    shown = [re.search(r"risk (\d+)s \(explored: risk not counted\)", c.note) for c in first.candidates]
    assert any(m and int(m.group(1)) > 0 for m in shown), [c.note for c in first.candidates]
    state.release("n")
    # budget spent: the same pair now needs B − 3·R > 0, which its wide spread does not allow
    second = run(policy, state, JobRequest("n2", "n", predicted_duration=20.0, duration_sigma=0.5),
                 n_waiting=3, waiting_gpus=3)
    assert not second.placed and "risk" in second.reason
    # measured on this cluster (narrow spread) and durations known: the pair clears the same risk
    for _ in range(4):
        policy.observe("v100", "n", "a", 0.6)
        policy.observe("v100", "a", "n", 0.6)
    third = run(policy, state, JobRequest("n3", "n", predicted_duration=20.0), n_waiting=3, waiting_gpus=3)
    assert third.shared and "explores" not in third.reason
    assert policy.explored == {"v100": 1}


@pytest.mark.parametrize("once", [True, False])
def test_horus_risk_explores_a_pair_once_until_it_is_measured(once):
    """horusd learns a pair at its next model refit: until then, another job of an explored pair would
    spend the budget to learn nothing new. With explore_once it is weighed with its risk instead, and
    the pair leaves the pending set once both directions are measured."""
    state = cluster(1, 2)
    policy = make_policy(f"horus-risk/explore_budget=10/risk=3/explore_once={'yes' if once else 'no'}",
                         models_for(state, TablePredictor(default=0.6)))
    state.place(RunningJob("a1", "a", (0,), 0.0, 100.0))
    state.place(RunningJob("a2", "a", (1,), 0.0, 100.0))
    first = run(policy, state, JobRequest("n1", "n", predicted_duration=20.0, duration_sigma=0.5),
                n_waiting=3, waiting_gpus=3)
    assert first.shared and "explores an unknown pair" in first.reason and policy.explored == {"v100": 1}
    # the pair runs, not measured yet (no refit): a second job of the same pair on the other GPU
    second = run(policy, state, JobRequest("n2", "n", predicted_duration=20.0, duration_sigma=0.5),
                 n_waiting=3, waiting_gpus=3)
    if once:
        assert not second.placed and "risk" in second.reason and policy.explored == {"v100": 1}
        assert policy._pending == {"v100": {tuple(sorted((state.classes.id("n"), state.classes.id("a"))))}}
    else:
        assert second.shared and "explores" in second.reason and policy.explored == {"v100": 2}
    for _ in range(4):  # the refit learned it, narrow: no longer an exploration, and no longer pending
        policy.observe("v100", "n", "a", 0.6)
        policy.observe("v100", "a", "n", 0.6)
    state.release("n1")
    if second.placed:
        state.release("n2")
    third = run(policy, state, JobRequest("n3", "n", predicted_duration=20.0), n_waiting=3, waiting_gpus=3)
    assert third.shared and "explores" not in third.reason
    assert not policy._pending.get("v100")


def test_horus_risk_forgets_exploring_answers_that_never_ran():
    """horusd asks for offers every second and most are never taken: their exploring answers must not
    pile up (only the newest EXPLORING_KEPT are remembered until their job runs)."""
    state = cluster(1, 1)
    policy = make_policy("horus-risk/explore_budget=100", models_for(state, TablePredictor(default=0.6)))
    policy.EXPLORING_KEPT = 8
    state.place(RunningJob("a", "a", (0,), 0.0, 100.0))
    for i in range(30):  # decided, never run
        ctx = SchedulingContext(0.0, 3, 3)
        assert "explores" in policy.decide(state, JobRequest(f"o{i}", "n", predicted_duration=20.0), ctx).reason
    assert list(policy._exploring) == [f"o{i}" for i in range(22, 30)]
    run(policy, state, JobRequest("o29", "n", predicted_duration=20.0), n_waiting=3, waiting_gpus=3)
    assert policy.explored == {"v100": 1} and "o29" not in policy._exploring


def test_horus_risk_counts_the_duration_spread():
    """The same measured pair: taken when the durations are known, refused under a wide duration spread
    once its benefit must clear it."""
    state = cluster(1, 1)
    policy = make_policy("horus-risk/explore_budget=0/risk=1", models_for(state, TablePredictor(default=0.6)))
    for _ in range(4):
        policy.observe("v100", "n", "a", 0.6)
        policy.observe("v100", "a", "n", 0.6)
    state.place(RunningJob("a", "a", (0,), 0.0, 1000.0))
    sure = policy.decide(state, JobRequest("n", "n", predicted_duration=400.0), SchedulingContext(0.0, 3, 3))
    unsure = policy.decide(state, JobRequest("n", "n", predicted_duration=400.0, duration_sigma=2.0),
                           SchedulingContext(0.0, 3, 3))
    assert sure.shared and not unsure.placed


@pytest.mark.parametrize("rule", ["horus", "horus-risk"])
def test_horus_never_pairs_two_long_jobs_that_lose_on_completion_time(rule):
    """Two long jobs at 0.6 each: their mean completion time is worse shared. horus-risk also counts the
    jobs queued behind (``queue``): with none behind, it refuses the pair too (with some it may not:
    the GPU is free sooner for them, tests/test_placement.py's queue tests)."""
    state = cluster(1, 1)
    policy = make_policy(rule, models_for(state, TablePredictor(default=0.6)))  # combined 1.2, ξ=1.67
    state.place(RunningJob("a", "a", (0,), 0.0, 10000.0))
    waiting = 3 if rule == "horus" else 1
    assert not run(policy, state, JobRequest("long", "n", predicted_duration=10000.0),
                   n_waiting=waiting, waiting_gpus=waiting).placed
    assert run(policy, state, JobRequest("short", "n", predicted_duration=100.0), n_waiting=waiting,
               waiting_gpus=waiting).shared


@pytest.mark.parametrize("options", [{}, {"require_benefit": False}, {"bsbf_gain": 0.0},
                                     {"require_benefit": False, "bsbf_gain": 0.0}, {"score_rule": "combined"}])
def test_horus_per_class_scoring_is_the_per_gpu_rule(options):
    """On one GPU type horus scores by resident class (fast path); it must equal the per-GPU rule."""
    from slurm_horus.placement.framework import Cycle
    from slurm_horus.placement.policies.horus import Horus

    rng = np.random.default_rng(4)
    classes = [f"k{i}" for i in range(6)]
    values = {(a, b): float(rng.uniform(0.2, 1.0)) for a in classes for b in classes}
    state = cluster(8, 4)
    policy = Horus(PairTable(TablePredictor(values), state.classes), min_combined_known=1.05, **options)
    for g in range(0, 30):  # residents with expected ends from soon to much later
        state.place(RunningJob(f"r{g}", classes[g % 6], (g,), 0.0, float(rng.uniform(10, 5000))))
    ctx = SchedulingContext(100.0, 40, 40)
    ctx.extra["window"] = [state.classes.id(c) for c in classes[:3]]
    outcomes = set()
    for c in classes:
        for duration in (50.0, 500.0, 50000.0):
            cycle = Cycle(state, JobRequest("n", c, predicted_duration=duration), ctx, state.classes.id(c))
            cycle.idx = np.flatnonzero(policy.filter_gpus(cycle))
            policy._fill_predictions(cycle)
            fast, fast_ok = policy._score_by_class(cycle)
            slow, slow_ok = policy._score_per_gpu(cycle)
            assert np.array_equal(fast, slow), (c, duration)
            shared = ~cycle.free
            assert np.array_equal(fast_ok[shared], slow_ok[shared])
            outcomes |= set(np.isfinite(fast[shared]).tolist())
    assert outcomes == {True, False}  # some pairs qualified, some did not: the comparison tested both


@pytest.mark.parametrize("rule,options", [("horus", {}), ("horus", {"require_benefit": False}),
                                          ("horus", {"bsbf_gain": 0.0}), ("horus", {"free_score": 1.3}),
                                          ("horus", {"score_rule": "combined"}),
                                          ("horus", {"min_combined_known": 1.05}), ("horus-risk", {}),
                                          ("horus-risk", {"risk": 0.0}), ("horus-risk", {"explore_budget": 0}),
                                          ("horus-risk", {"queue": 1.0}), ("horus-risk", {"explore_once": True})])
def test_horus_quick_decision_is_the_pipelines(rule, options):
    """horus's (and horus-risk's) 1-GPU shortcut (decide_quickly) must give exactly the pipeline's
    decision: random loaded clusters, with and without free GPUs, pressure, a window, measured pairs, ties."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus import Horus
    from slurm_horus.placement.policies.horus_risk import HorusRisk

    Horus = HorusRisk if rule == "horus-risk" else Horus  # noqa: N806

    rng = np.random.default_rng(7)
    classes = [f"k{i}" for i in range(8)]
    # few distinct binary fractions, so that classes tie on their score and pairs tie with a free GPU
    # (0.75 + 0.5 * 0.5 == 1.0 exactly)
    values = {(a, b): float(rng.choice([0.375, 0.5, 0.625, 0.75, 0.875])) for a in classes for b in classes}
    # poor pairs too (horus-risk: most fail its test, a free GPU or a wait is then the answer)
    poor = {(a, b): float(v) for (a, b), v in zip(values, np.random.default_rng(8).choice([0.1, 0.25, 0.5, 0.6], 64))}
    seen = set()
    for trial in range(60):
        state = cluster(6, 4, partitions=("p",) if trial % 5 else ("p", "q"))
        table = poor if rule == "horus-risk" and trial % 3 == 2 else values
        policy = Horus(PairTable(TablePredictor(table), state.classes), **options)
        for k in range(int(rng.integers(0, 3))):
            policy.observe("v100", classes[k], classes[k + 1], 0.75)
        busy = rng.permutation(24)[:int(rng.integers(14, 25))]
        for g in busy:
            exclusive = bool(rng.random() < 0.1)
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (int(g),), 0.0, float(rng.uniform(50, 9000)),
                                   exclusive=exclusive))
        ctx = SchedulingContext(100.0, int(rng.integers(1, 60)), int(rng.integers(1, 60)))
        if trial % 2:
            ctx.extra["window"] = [state.classes.id(str(c)) for c in rng.choice(classes, 4)]
        for k in range(6):
            req = JobRequest(f"n{k}", str(rng.choice(classes)), predicted_duration=float(rng.choice([30, 600, 20000])),
                             partition=str(rng.choice(["", "p", "q"])))
            if rule == "horus-risk":
                req.duration_sigma = float(rng.choice([0.0, 0.5, 1.5]))  # the risk of the durations too
                weighed = []
                policy._best_pair = lambda cycle, _o=policy._best_pair: (lambda d: (weighed.append(d), d)[1])(_o(cycle))
            quick = policy.decide(state, req, ctx)
            full = Policy.decide(policy, state, req, ctx, explain=True)  # explain: never the shortcut
            full.candidates = []
            assert quick.to_dict() == full.to_dict(), (trial, k, options)
            seen.add((quick.placed, quick.shared))
            if rule == "horus-risk":
                del policy._best_pair
                seen.update(("weighed", None if d is None else d.shared) for d in weighed)
                if quick.placed and rng.random() < 0.5:  # it starts: the next decisions see it
                    policy.running_job(req, quick, 100.0)  # (an explored pair is pending from now on)
                    state.place(RunningJob(req.job_id, req.job_class, quick.gpu_ids, 100.0,
                                           100.0 + req.predicted_duration))
                    seen.add("started")
                    if policy._pending:
                        seen.add("pending")
    assert seen >= {(True, True), (True, False), (False, False)}  # every kind of answer was compared
    if rule == "horus-risk":  # horus-risk's weighing without weighing every GPU: a pair, a free GPU, a wait
        # (with the queue term, its default, a pair or a free GPU is always found on these clusters: the
        # waits are compared with queue=0)
        expected = {("weighed", True), ("weighed", False), "started"} | (set() if policy.queue
                                                                          else {("weighed", None)})
        if policy.explore_once and policy.explore_budget:
            expected.add("pending")  # decisions were compared with explored pairs not measured yet
        assert expected <= seen, seen


def test_horus_risk_weighs_the_risk_its_docstring_defines():
    """R, the standard deviation of the pair's benefit B: B's change for a step of 0.01 on each input
    (the two pair values, the log of both durations) times that input's spread, written here one pair
    at a time; with no spread on the durations their terms are 0."""
    import math

    from slurm_horus.placement.policies.horus_risk import _risk
    from slurm_horus.placement.policies.sjf_bsbf import pair_benefit

    def plain(e_a, e_b, jt, rt, sj, sr, s_d):
        b = float(pair_benefit(e_a, e_b, jt, rt))
        steps = [(float(pair_benefit(e_a, e_b, jt + 0.01, rt)) - b) / 0.01 * sj,
                 (float(pair_benefit(e_a, e_b, jt, rt + 0.01)) - b) / 0.01 * sr,
                 (float(pair_benefit(e_a * math.exp(0.01), e_b, jt, rt)) - b) / 0.01 * s_d,
                 (float(pair_benefit(e_a, e_b * math.exp(0.01), jt, rt)) - b) / 0.01 * s_d]
        return math.sqrt(sum(x * x for x in steps))

    e_b = np.array([30.0, 600.0, 5000.0, 20000.0])
    jt, rt = np.array([0.9, 0.5, 0.75, 0.6]), np.array([0.8, 0.95, 0.4, 0.7])
    sj, sr = np.array([0.05, 0.2, 0.1, 0.3]), np.array([0.1, 0.05, 0.25, 0.3])
    for e_a in (60.0, 3000.0):
        for s_d in (0.0, 0.8):
            got = _risk(e_a, e_b, jt, rt, sj, sr, s_d, pair_benefit(e_a, e_b, jt, rt))
            want = [plain(e_a, *args, s_d) for args in zip(e_b, jt, rt, sj, sr)]
            assert np.allclose(got, want, rtol=1e-9, atol=1e-9), (e_a, s_d, got, want)
    with_spread = _risk(600.0, e_b, jt, rt, sj, sr, 0.8, pair_benefit(600.0, e_b, jt, rt))
    assert (with_spread > _risk(600.0, e_b, jt, rt, sj, sr, 0.0, pair_benefit(600.0, e_b, jt, rt))).all()


def test_horus_risk_queue_benefit_counts_the_jobs_behind():
    """_benefit with q jobs queued per GPU: SJF-BSBF's T_seq − T_con plus ½·q·D, D how much sooner the
    GPU is free when the two share (values worked out by hand: the job ends first, the resident ends
    first, a pair doing less than one job's work)."""
    from slurm_horus.placement.policies.horus_risk import _benefit
    from slurm_horus.placement.policies.sjf_bsbf import pair_times

    cases = [  # E_a, e_b, jt, rt, q, B, B with q
        (100.0, 300.0, 0.8, 0.6, 2.0, 112.5, 112.5 + 50.0),  # a ends at 125, b at 350 (alone: 400)
        (400.0, 100.0, 0.8, 0.5, 4.0, -20.0, -20.0 + 2.0 * 60.0),  # b ends at 200, a at 440 (alone: 500)
        (100.0, 300.0, 0.4, 0.3, 2.0, -12.5, -12.5 - 75.0),  # 475 against 400: a cost to the queue
    ]
    for e_a, e_b, jt, rt, q, plain, queued in cases:
        b0, t_con = _benefit(e_a, np.array([e_b]), np.array([jt]), np.array([rt]))
        bq, t_con_q = _benefit(e_a, np.array([e_b]), np.array([jt]), np.array([rt]), q)
        assert abs(float(b0[0]) - plain) < 1e-9 and abs(float(bq[0]) - queued) < 1e-9, (e_a, e_b, b0, bq)
        assert float(t_con[0]) == float(t_con_q[0])
    rng = np.random.default_rng(3)  # the queue's T_con is pair_times's, to the bit
    e_b, jt, rt = rng.uniform(1, 1e5, 500), rng.uniform(0, 1.5, 500), rng.uniform(0, 1.5, 500)
    for e_a in (10.0, 3000.0, 5e5):
        assert np.array_equal(_benefit(e_a, e_b, jt, rt, 2.5)[1], pair_times(e_a, e_b, jt, rt)[0])


def test_horus_risk_with_queue_shares_a_pair_that_frees_the_gpu_sooner():
    """A pair SJF-BSBF refuses (the two jobs' mean completion time is 20 s worse sharing) frees the
    GPU 60 s sooner: with four GPUs' worth of jobs queued behind, horus-risk/queue=1 shares it, and
    without the queue term (or without a queue) it waits."""
    from slurm_horus.placement.policies.horus_risk import HorusRisk

    def decide(queue, waiting):
        state = cluster(1, 1)
        state.place(RunningJob("r0", "b", (0,), 0.0, 200.0))
        policy = HorusRisk(PairTable(TablePredictor({("x", "b"): 0.8, ("b", "x"): 0.5}), state.classes),
                           queue=queue)
        return policy.decide(state, JobRequest("x1", "x", predicted_duration=400.0),
                             SchedulingContext(100.0, waiting, waiting))

    assert decide(1.0, 5).placed and decide(1.0, 5).shared
    assert not decide(0.0, 5).placed
    assert not decide(1.0, 1).placed  # no one behind it: the pair's own benefit only


def test_horus_risk_equal_pairs_go_to_the_first_gpu():
    """Two residents of different classes, equal pair values, equal ends: horus-risk's weighing in the
    order of its classes' bounds must still take the first GPU, as the pipeline's select does."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus_risk import HorusRisk

    state = cluster(1, 2)
    state.place(RunningJob("r1", "a", (1,), 0.0, 5000.0))  # class a is known first: its bound sorts first
    state.place(RunningJob("r0", "b", (0,), 0.0, 5000.0))
    policy = HorusRisk(PairTable(TablePredictor({}, default=0.75), state.classes))
    ctx = SchedulingContext(100.0, 5, 5)  # pressure: the queue asks for more GPUs than are free
    req = JobRequest("x1", "x", predicted_duration=600.0)
    quick = policy.decide(state, req, ctx)
    full = Policy.decide(policy, state, req, ctx, explain=True)
    full.candidates = []
    assert quick.to_dict() == full.to_dict() and quick.gpu_ids == (0,) and quick.shared


def test_horus_risk_sees_a_resident_started_since_its_last_decision():
    """horus-risk keeps its per-class bound on the residents' ends from decision to decision: a job
    started meanwhile (class a, ending soon) must count, or its GPU, the best pair, would be passed over."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus_risk import HorusRisk

    state = cluster(1, 4)
    state.place(RunningJob("r0", "a", (0,), 0.0, 5100.0))
    state.place(RunningJob("r1", "b", (1,), 0.0, 2100.0))
    policy = HorusRisk(PairTable(TablePredictor({}, default=0.75), state.classes))
    ctx = SchedulingContext(100.0, 9, 9)  # pressure
    first = policy.decide(state, JobRequest("x1", "x", predicted_duration=600.0), ctx)
    assert first.gpu_ids == (1,)  # b's resident ends first: the best pair then
    state.place(RunningJob("r2", "a", (2,), 100.0, 110.0))  # a resident of class a ending in 10 s
    req = JobRequest("x2", "x", predicted_duration=600.0)
    quick = policy.decide(state, req, ctx)
    full = Policy.decide(policy, state, req, ctx, explain=True)
    full.candidates = []
    assert quick.to_dict() == full.to_dict() and quick.gpu_ids == (2,)


@pytest.mark.parametrize("options", [{}, {"min_combined_known": 1.05}, {"bsbf_gain": 0.0}])
def test_horus_class_tests_are_the_rule_pair_by_pair(options):
    """horus's class tests, read at once by the kept waits' filters (``_all_class_tests``) and per
    class by decisions (``_class_tests``), are the rule evaluated pair by pair: combined ≥ the bar
    (``min_combined_known`` for a pair measured both ways), both ≥ ``min_tput``, and combined ≥ the
    window's best partner − ``partner_slack``; the short-next-to-long part: combined ≥ 1 and both ≥
    ``min_tput``. Checked as windows change from cycle to cycle and as pairs are measured (the kept
    values must follow both), the free-GPU entry included."""
    from slurm_horus.placement.framework import Cycle
    from slurm_horus.placement.policies.horus import Horus

    rng = np.random.default_rng(11)
    classes = [f"k{i}" for i in range(7)]
    values = {(a, b): float(rng.choice([0.3, 0.45, 0.5, 0.6, 0.75, 0.9])) for a in classes for b in classes}
    state = cluster(2, 4)
    policy = Horus(PairTable(TablePredictor(values), state.classes), **options)
    for c in classes:
        state.classes.id(c)
    n = len(classes)

    def expected(window):
        mat, known = policy.pairs.matrix("v100"), policy.pairs.known("v100")
        ok, bsbf = np.zeros((n, n), dtype=bool), np.zeros((n, n), dtype=bool)
        for c in range(n):
            for r in range(n):
                jt, rt = float(mat[c, r]), float(mat[r, c])
                both = jt >= policy.min_tput and rt >= policy.min_tput
                bar = policy.min_combined_known if known[c, r] and known[r, c] else policy.min_combined
                ok[c, r] = jt + rt >= bar and both
                if window:
                    ok[c, r] &= jt + rt >= max(float(mat[w, r] + mat[r, w]) for w in window) - policy.partner_slack
                bsbf[c, r] = policy.bsbf_gain > 0 and jt + rt >= 1.0 and both
        return ok, bsbf

    compared = 0
    for step in range(40):
        window = [state.classes.id(str(c)) for c in rng.choice(classes, int(rng.integers(1, 5)))] if step % 4 else None
        for measured in (False, True):
            if measured:  # a pair measured between two cycles of the same window
                a, b = rng.choice(classes, 2)
                policy.observe("v100", str(a), str(b), float(rng.choice([0.2, 0.55, 0.95])))
            ctx = SchedulingContext(100.0, 5, 5)
            if window is not None:
                ctx.extra["window"] = list(window)
            ok, bsbf = expected(window)
            ok_all, bsbf_all = policy._all_class_tests(state, ctx)
            assert (ok_all == ok).all() and (bsbf_all == bsbf).all(), step
            for c in range(n):
                tests = policy._class_tests(Cycle(state, None, ctx, c))
                assert (tests[2][:-1] == ok[c]).all() and (tests[3][:-1] == bsbf[c]).all(), (step, c)
                assert tests[2][-1] and not tests[3][-1]  # a free GPU: passes, no short-next-to-long
                compared += 1
    assert compared == 80 * n and 0 < ok.sum() < ok.size


def test_sjf_bsbf_quick_decision_is_the_pipelines():
    """sjf-bsbf's shortcut (a 1-GPU job takes the first free GPU) gives exactly the pipeline's
    decision: random loaded clusters with and without free GPUs, 1- and 2-GPU jobs, partitions."""
    from slurm_horus.placement.policies.sjf_bsbf import SJFBSBF

    rng = np.random.default_rng(11)
    classes = [f"k{i}" for i in range(6)]
    values = {(a, b): float(rng.choice([0.0, 0.4, 0.6, 0.8, 0.95])) for a in classes for b in classes}
    seen = set()
    for trial in range(40):
        state = cluster(4, 4, partitions=("p",) if trial % 3 else ("p", "q"))
        policy = SJFBSBF(PairTable(TablePredictor(values), state.classes))
        for g in rng.permutation(16)[:int(rng.integers(10, 17))]:
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (int(g),), 0.0, float(rng.uniform(50, 9000)),
                                   exclusive=bool(rng.random() < 0.1)))
        ctx = SchedulingContext(100.0, 20, 20)
        for k in range(6):
            req = JobRequest(f"n{k}", str(rng.choice(classes)), gpus_per_node=int(rng.choice([1, 1, 2])),
                             predicted_duration=float(rng.choice([30, 600, 20000])),
                             partition=str(rng.choice(["", "p", "q"])))
            quick = policy.decide(state, req, ctx)
            full = policy.decide(state, req, ctx, explain=True)  # explain: never the shortcut
            full.candidates = []
            assert quick.to_dict() == full.to_dict(), (trial, k)
            seen.add((quick.placed, quick.shared, req.n_gpus == 1 and quick.placed and not quick.shared))
    assert {(True, False, True), (True, True, False), (False, False, False)} <= seen


@pytest.mark.parametrize("rule,options", [("horus", {}), ("horus", {"require_benefit": False}),
                                          ("horus", {"bsbf_gain": 0.0}), ("horus", {"bsbf_gain": 0.6}),
                                          ("sjf-bsbf", {}), ("sjf-bsbf", {"sub_batch": False})])
def test_wait_at_once_is_the_pipelines(rule, options):
    """The shortcut that answers 'wait' without scoring GPUs (horus: no free GPU and no resident class
    whose least or greatest expected end passes the benefit test; sjf-bsbf: likewise, sub-batched
    variants included) gives exactly the pipeline's decision: full or nearly full random clusters,
    1- and 2-GPU jobs, expected ends from far past to far future, predicted OOM pairs, ties."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus import Horus
    from slurm_horus.placement.policies.sjf_bsbf import SJFBSBF

    rng = np.random.default_rng(13)
    classes = ["m-bs64", "m-bs32", "m-bs16", "n-bs8", "n-bs4", "k0", "k1"]
    solo = {("v100", c): t for c, t in (("m-bs64", 2.0), ("m-bs32", 3.5), ("m-bs16", 6.0), ("n-bs8", 4.0),
                                         ("n-bs4", 7.0))}
    answered = {"quick": 0, "pipeline": 0}
    seen = set()
    for trial in range(50):
        values = {(a, b): float(rng.choice([0.0, 0.375, 0.5, 0.625, 0.75, 0.875]))
                  for a in classes for b in classes}
        for a in ("m-bs64", "n-bs8"):  # the largest batches mostly do not fit next to anything
            values.update({(a, b): 0.0 for b in classes if rng.random() < 0.8})
        state = cluster(4, 4, partitions=("p",) if trial % 4 else ("p", "q"))
        table = PairTable(TablePredictor(values), state.classes)
        policy = Horus(table, **options) if rule == "horus" else SJFBSBF(table, solo_tput=solo, **options)
        for g in rng.permutation(16)[:int(rng.integers(13, 17))]:
            end = float(rng.choice([50.0, 99.0, 100.0, 101.0, 400.0, 3000.0, 9000.0, 1e6]))
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (int(g),), 0.0, end))
        for g in rng.permutation(16)[:int(rng.integers(0, 6))]:  # a second resident: a full GPU
            if state.gpu_njobs[g] == 1:
                state.place(RunningJob(f"s{g}", str(rng.choice(classes)), (int(g),), 0.0, 500.0))
        ctx = SchedulingContext(100.0, 30, int(rng.integers(20, 60)))
        if trial % 2:
            ctx.extra["window"] = [state.classes.id(str(c)) for c in rng.choice(classes, 3)]
        for k in range(8):
            req = JobRequest(f"n{k}", str(rng.choice(classes)), gpus_per_node=int(rng.choice([1, 1, 1, 2])),
                             predicted_duration=float(rng.choice([1.0, 30.0, 100.0, 600.0, 20000.0, 1e6])),
                             partition=str(rng.choice(["", "p", "q"])))
            before = policy.pairs.n_observations
            calls = []  # the per-GPU test ran (horus: _pair_ok; both: the pipeline's predictions)
            spied = ("_fill_predictions", "_pair_ok") if rule == "horus" else ("_fill_predictions",)
            for name in spied:
                setattr(policy, name, lambda *a, _o=getattr(policy, name): (calls.append(1), _o(*a))[1])
            quick = policy.decide(state, req, ctx)
            for name in spied:
                delattr(policy, name)
            full = Policy.decide(policy, state, req, ctx, explain=True) if rule == "horus" \
                else policy.decide(state, req, ctx, explain=True)
            full.candidates = []
            assert quick.to_dict() == full.to_dict(), (trial, k, options)
            assert policy.pairs.n_observations == before
            if calls:
                answered["pipeline"] += 1
            elif not quick.placed:
                answered["quick"] += 1
            seen.add((quick.placed, quick.shared, req.n_gpus))
    # waits answered at once, and decisions that ran the per-GPU test, both compared
    assert answered["quick"] > 0 and answered["pipeline"] > 0, answered
    assert {(True, True, 1), (False, False, 1), (False, False, 2)} <= seen, seen


def test_share_ratio_is_the_threshold_of_the_pair_test():
    """share_ratio's ρ: T_seq − T_con > gain·(E_a + e_b) (pair_times, the job sub-batched at ``speed``
    in T_con; gain 0: T_con < T_seq) holds exactly for the partner's remaining times e_b > ρ·E_a, over
    random throughputs, speeds, gains and durations, on both sides of the threshold and both pieces
    of the benefit."""
    from slurm_horus.placement.policies.sjf_bsbf import pair_times, share_ratio

    rng = np.random.default_rng(29)
    sides = set()
    for _ in range(4000):
        t_a, t_b = float(rng.uniform(0.05, 1.5)), float(rng.uniform(0.05, 1.5))
        speed = 1.0 if rng.random() < 0.5 else float(rng.uniform(0.2, 1.0))
        gain = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.0, 0.45))
        e_a = float(10 ** rng.uniform(0, 5))
        rho = share_ratio(t_a, t_b, speed, gain)
        for e_b in (float(10 ** rng.uniform(-1, 6)), abs(rho) * e_a * (1 + 1e-4), abs(rho) * e_a * (1 - 1e-4)):
            if e_b <= 0 or abs(e_b - rho * e_a) <= 1e-6 * (e_b + e_a):
                continue
            t_con, _ = pair_times(e_a / speed, e_b, t_a, t_b)
            # T_seq: waiting, then running as submitted
            beats = bool((e_b + 0.5 * e_a) - t_con > gain * (e_a + e_b))
            assert beats == (e_b > rho * e_a), (t_a, t_b, speed, e_a, e_b, rho)
            sides.add((beats, e_b < e_a * t_b / (speed * t_a)))
    assert sides == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.parametrize("rule,options", [("sjf-bsbf", {}), ("horus", {}), ("horus", {"require_benefit": False}),
                                          ("horus", {"bsbf_gain": 0.0}), ("horus", {"bsbf_gain": 0.6}),
                                          ("horus", {"score_rule": "combined"})])
def test_quick_waits_of_multi_gpu_jobs_are_the_pipelines(rule, options):
    """sjf-bsbf and horus answer a multi-GPU job 'wait' at once when fewer nodes than it asks have
    ``gpus_per_node`` GPUs it may take (free, or a lone resident it may join by the share limits; horus
    without pressure: free ones only): the same decision and reason as the pipeline, and the cycle's
    ``wait_reason`` the same reason, over random clusters with and without free GPUs, with and
    without pressure and a window, geometries of one to three nodes, OOM pairs and expected ends
    around the thresholds."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus import Horus
    from slurm_horus.placement.policies.sjf_bsbf import SJFBSBF

    rng = np.random.default_rng(31)
    classes = [f"k{i}" for i in range(5)]
    quick = {"wait": 0, "pipeline": 0}  # answered at once / by the pipeline (it places, or waits)
    seen = set()
    for trial in range(60):
        values = {(a, b): float(rng.choice([0.0, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0])) for a in classes for b in classes}
        state = cluster(5, 4, partitions=("p",))
        table = PairTable(TablePredictor(values), state.classes)
        policy = SJFBSBF(table, **options) if rule == "sjf-bsbf" else Horus(table, **options)
        for g in rng.permutation(20)[:int(rng.integers(12, 21))]:
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (int(g),), 0.0,
                                   float(rng.choice([50.0, 100.0, 140.0, 400.0, 3000.0, 9000.0]))))
        for g in rng.permutation(20)[:int(rng.integers(0, 4))]:
            if state.gpu_njobs[g] == 1:
                state.place(RunningJob(f"s{g}", str(rng.choice(classes)), (int(g),), 0.0, 500.0))
        ctx = SchedulingContext(100.0, 30, int(rng.choice([1, 30])))  # horus: without and with pressure
        if trial % 2:
            ctx.extra["window"] = [state.classes.id(str(c)) for c in rng.choice(classes, 2)]
        for k in range(10):
            per_node, nodes = [(2, 1), (3, 1), (4, 1), (2, 2), (4, 2), (1, 3)][int(rng.integers(0, 6))]
            req = JobRequest(f"n{k}", str(rng.choice(classes)), gpus_per_node=per_node, nodes=nodes,
                             predicted_duration=float(rng.choice([1.0, 40.0, 100.0, 300.0, 2000.0, 1e5])))
            calls = []
            policy._fill_predictions = lambda *a, _o=policy._fill_predictions: (calls.append(1), _o(*a))[1]
            answer = policy.decide(state, req, ctx)
            del policy._fill_predictions
            known = policy.wait_reason(state, req, ctx)  # the cycle's question, after a decision built the GPUs
            full = (policy.decide(state, req, ctx, explain=True) if rule == "sjf-bsbf"
                    else Policy.decide(policy, state, req, ctx, explain=True))
            full.candidates = []
            assert answer.to_dict() == full.to_dict(), (trial, k)
            assert known is None or (not full.placed and known == full.reason), (trial, k, known, full.reason)
            if not calls:
                quick["wait"] += 1
            else:
                quick["pipeline"] += 1
            seen.add((answer.placed, answer.reason, known is not None))
    assert quick["wait"] > 50 and quick["pipeline"] > 20, quick
    waits = {reason.split(";")[0] for placed, reason, _known in seen if not placed}  # (less the probes named)
    assert "no GPU qualifies under this policy" in waits and len(waits) == 2, seen
    assert any(p for p, _, _ in seen) and any(k for _, _, k in seen), seen


def test_iasp_iapp_quick_waits_are_the_pipelines():
    """iasp-iapp answers 'wait' at once when fewer nodes than the job asks have ``gpus_per_node``
    GPUs it may use (free, or one resident next to which its predicted performance is at least
    ``min_tput``), and places a 1-GPU job scoring only the chosen node's GPUs: the same decision as
    the pipeline, and the cycle's ``wait_reason`` the same reason, over random clusters, geometries,
    partitions and measured pairs (some measured between decisions)."""
    from slurm_horus.placement.policies.iasp_iapp import IaspIapp

    rng = np.random.default_rng(43)
    classes = [f"k{i}" for i in range(5)]
    answered = {"quick wait": 0, "quick placed": 0, "pipeline": 0}
    seen = set()
    for trial in range(60):
        values = {(a, b): float(rng.choice([0.0, 0.3, 0.45, 0.5, 0.6, 0.8, 0.95])) for a in classes for b in classes}
        state = cluster(5, 4, partitions=("p",) if trial % 3 else ("p", "q"))
        policy = IaspIapp(PairTable(TablePredictor(values), state.classes))
        if trial % 4 == 0:
            policy.observe("v100", "k0", "k1", 0.55)
        for g in rng.permutation(20)[:int(rng.integers(8, 21))]:
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (int(g),), 0.0, 500.0,
                                   exclusive=bool(rng.random() < 0.1)))
        ctx = SchedulingContext(100.0, 30, 30)
        for k in range(10):
            per_node, nodes = [(1, 1), (1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (4, 2)][int(rng.integers(0, 7))]
            req = JobRequest(f"n{k}", str(rng.choice(classes)), gpus_per_node=per_node, nodes=nodes,
                             partition=str(rng.choice(["", "p", "q"])))
            calls = []
            policy.score_gpus = lambda *a, _o=policy.score_gpus: (calls.append(1), _o(*a))[1]
            answer = policy.decide(state, req, ctx)
            del policy.score_gpus
            known = policy.wait_reason(state, req, ctx)
            full = policy.decide(state, req, ctx, explain=True)
            full.candidates = []
            assert answer.to_dict() == full.to_dict(), (trial, k)
            assert known is None or (not full.placed and known == full.reason), (trial, k, known, full.reason)
            answered["pipeline" if calls else "quick placed" if answer.placed else "quick wait"] += 1
            seen.add((answer.placed, nodes > 1, known is not None))
            if k % 3 == 2:  # a pair measured between decisions: what the shortcut keeps must follow it
                policy.observe("v100", req.job_class, str(rng.choice(classes)), float(rng.choice([0.3, 0.95])))
    assert answered["quick wait"] > 50 and answered["quick placed"] > 50 and answered["pipeline"] > 50, answered
    assert {(True, False, False), (False, False, True), (False, True, True), (True, True, False)} <= seen, seen


def test_sjf_bsbf_share_ratios_follow_the_pairs_it_measures():
    """The ratio matrix sjf-bsbf keeps is refreshed cell by cell as pairs are measured (and the
    sub-batched variants' cells with them) and grows by the new rows and columns as classes join: it
    always equals one computed afresh, also after more measurements than the table's log keeps and
    after a new class that is an old class's sub-batched variant."""
    from slurm_horus.placement.policies.sjf_bsbf import SJFBSBF

    rng = np.random.default_rng(37)
    classes = ["m-bs64", "m-bs32", "m-bs16", "k0", "k1", "k2"]
    solo = {("v100", c): t for c, t in (("m-bs64", 2.0), ("m-bs32", 3.5), ("m-bs16", 6.0), ("m-bs8", 9.0))}
    later = {10: "k3", 20: "m-bs8", 30: "k4"}  # classes that join the table mid-run (m-bs8: a new variant)
    values = {(a, b): float(rng.choice([0.0, 0.4, 0.7, 0.9])) for a in classes + list(later.values())
              for b in classes + list(later.values())}
    for k in classes:  # m-bs16 fits next to nothing until its variant m-bs8 joins, which fits everywhere
        values.update({("m-bs16", k): 0.0, ("m-bs8", k): 0.9, (k, "m-bs8"): 0.9})
    state = cluster(1, 4)
    for c in classes:
        state.classes.id(c)
    table = PairTable(TablePredictor(values), state.classes)
    policy = SJFBSBF(table, solo_tput=solo)
    table._log = type(table._log)(maxlen=8)  # a short log: more measurements than it keeps, at times
    for step in range(40):
        if step in later:
            state.classes.id(later[step])
            classes.append(later[step])
        for sub in (False, True):
            kept = policy._ratio_matrix("v100", sub, state.classes).copy()
            fresh = SJFBSBF(table, solo_tput=solo)._ratio_matrix("v100", sub, state.classes)
            assert np.array_equal(kept, fresh), (step, sub)
        # sometimes more than the log keeps (not just before a class joins: the growth is what is tested
        # there); m-bs16's pairs stay unmeasured, so only its new variant makes it fit
        for _ in range(1 if step + 1 in later else int(rng.choice([1, 2, 3, 12]))):
            a, b = rng.choice([c for c in classes if c != "m-bs16"], 2)
            policy.observe("v100", str(a), str(b), float(rng.choice([0.0, 0.35, 0.6, 0.95])))
    assert table.changes_since(table.n_observations - 9) is None
    assert len(table.changes_since(table.n_observations - 3)) == 3


def test_horus_class_tests_kept_across_measurements_are_computed_afresh_ones():
    """horus keeps its per-class tests across cycles and measured pairs (a measurement drops the two
    classes' entries; the window's best partners are in the key): they always equal the tests of a
    policy that never kept any, with and without a window, the known-pair threshold included."""
    from slurm_horus.placement.framework import Cycle
    from slurm_horus.placement.policies.horus import Horus

    rng = np.random.default_rng(41)
    classes = [f"k{i}" for i in range(6)]
    values = {(a, b): float(rng.choice([0.3, 0.5, 0.6, 0.7, 0.9])) for a in classes for b in classes}
    state = cluster(1, 4)
    for c in classes:
        state.classes.id(c)
    table = PairTable(TablePredictor(values), state.classes)
    policy = Horus(table, partner_slack=0.0)  # every change of a best partner shows in the tests
    compared = 0
    for step in range(60):
        ctx = SchedulingContext(100.0 + step, 10, 10)
        if step % 3:  # mostly one window: its best partners change as its classes' pairs are measured
            ctx.extra["window"] = [state.classes.id(str(c)) for c in (("k0", "k1") if step % 5 else rng.choice(classes, 2))]
        fresh_ctx = SchedulingContext(ctx.now, 10, 10)
        fresh_ctx.extra.update({k: v for k, v in ctx.extra.items() if k == "window"})
        fresh = Horus(table, partner_slack=0.0)
        for c in classes:
            req = JobRequest("n", c, predicted_duration=100.0)
            kept = policy._class_tests(Cycle(state, req, ctx, state.classes.id(c)))
            again = fresh._class_tests(Cycle(state, req, fresh_ctx, state.classes.id(c)))
            assert all(np.array_equal(x, y) for x, y in zip(kept, again)), (step, c)
            compared += 1
        for _ in range(int(rng.choice([0, 1, 2]))):
            a, b = rng.choice(classes[:2], 1)[0], rng.choice(classes)
            a, b = (a, b) if rng.random() < 0.5 else (b, a)
            policy.observe("v100", str(a), str(b), float(rng.choice([0.2, 0.55, 0.8, 1.0])))
    assert compared == 360 and table.n_observations > 20


@pytest.mark.parametrize("options", [{}, {"require_benefit": False}, {"bsbf_gain": 0.0}, {"score_rule": "combined"}])
def test_horus_longer_jobs_of_a_class_that_waited_wait_like_the_pipeline(options):
    """Within a cycle (one cluster version) horus keeps, per class, the least expected duration that
    had to wait, and answers 'wait' at once for longer jobs of the class: every job of every class,
    shortest first and longest first, must still get exactly the pipeline's decision."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus import Horus

    rng = np.random.default_rng(17)
    classes = [f"k{i}" for i in range(5)]
    durations = [1.0, 20.0, 60.0, 150.0, 400.0, 1000.0, 3000.0, 8000.0, 30000.0, 1e6]
    outcomes, remembered = set(), 0
    for trial in range(30):
        values = {(a, b): float(rng.choice([0.375, 0.5, 0.625, 0.75, 0.875, 1.0])) for a in classes for b in classes}
        state = cluster(4, 4)
        policy = Horus(PairTable(TablePredictor(values), state.classes), **options)
        for g in range(16):
            end = float(rng.choice([50.0, 101.0, 300.0, 1200.0, 5000.0, 20000.0]))
            state.place(RunningJob(f"r{g}", str(rng.choice(classes)), (g,), 0.0, end))
        for order in (durations, durations[::-1]):
            ctx = SchedulingContext(100.0, 40, 40)
            if trial % 2:
                ctx.extra["window"] = [state.classes.id(str(c)) for c in rng.choice(classes, 2)]
            for c in classes:
                for k, duration in enumerate(order):
                    req = JobRequest(f"n{k}", c, predicted_duration=duration, gpus_per_node=1 + (k % 4 == 3))
                    quick = policy.decide(state, req, ctx)
                    full = Policy.decide(policy, state, req, ctx, explain=True)
                    full.candidates = []
                    assert quick.to_dict() == full.to_dict(), (trial, c, duration, options)
                    outcomes.add(quick.placed)
            remembered += sum(len(f.memo) for f in ctx.extra["_feasible"][1].values())
    assert outcomes == {True, False} and remembered > 0


def test_horus_quick_decision_breaks_a_tie_with_a_free_gpu_like_the_pipeline():
    """A pair scoring exactly a free GPU's 1.0 on a lower GPU wins (first of the highest), both ways."""
    from slurm_horus.placement.framework import Policy
    from slurm_horus.placement.policies.horus import Horus

    values = {("b", "a"): 0.75, ("a", "b"): 0.5}  # value = 0.75 + 0.5 * 0.5 = 1.0 exactly
    for resident_gpu, expected_shared in ((0, True), (1, False)):
        state = cluster(1, 2)
        policy = Horus(PairTable(TablePredictor(values, default=0.5), state.classes))
        state.place(RunningJob("r", "a", (resident_gpu,), 0.0, 5000.0))
        ctx = SchedulingContext(100.0, 5, 5)  # pressure: 5 GPUs asked, 1 free
        req = JobRequest("n", "b", predicted_duration=100.0)
        quick = policy.decide(state, req, ctx)
        full = Policy.decide(policy, state, req, ctx, explain=True)
        assert quick.placed and quick.shared == full.shared == expected_shared
        assert quick.gpu_ids == full.gpu_ids == (0,)


def test_a_rebuilt_horus_goes_on_counting_what_probing_cost():
    """horusd rebuilds its policy at every reload: the jobs horus placed next to pairs only predicted
    (``explored:<GPU type>``, shown by ping) and the probes decided but not started yet carry over."""
    models = models_for(cluster(), TablePredictor())
    old = make_policy("horus", models)
    old.explored, old._probes = {"v100": 3}, {"j1": "v100"}
    new = make_policy("horus", models)
    new.carry_over(old)
    assert new.counters() == {"explored:v100": 3} and new._probes == {"j1": "v100"}
    new.explored["v100"] += 1
    assert old.explored == {"v100": 3}  # a copy


def test_a_rebuilt_horus_keeps_the_pairs_it_holds_for_their_measurement():
    """``probe_hold``: a reload builds a new table whose class ids may differ; the pairs held (until
    their probe's measurement is due) are carried over under the new ids and still hold."""
    old_state = cluster(1, 2)
    old = make_policy("horus/probe_hold=true", models_for(old_state, TablePredictor(default=0.6)))
    a, b = old.pairs.classes.id("lm-bs20"), old.pairs.classes.id("a3c")
    old._hold([(0, min(a, b), max(a, b))], 100.0)
    state = cluster(1, 2)
    for name in ("zz", "a3c", "lm-bs20"):  # another order: other ids
        state.classes.id(name)
    new = make_policy("horus/probe_hold=true", models_for(state, TablePredictor(default=0.6)))
    new.carry_over(old)
    x, y = state.classes.ids["a3c"], state.classes.ids["lm-bs20"]
    assert (x, y) != (b, a) and new._held == {(0, min(x, y), max(x, y)): 100.0 + new.probe_hold_s}
    state.place(RunningJob("r0", "a3c", (0,), 0.0, 9000.0))
    state.place(RunningJob("r1", "zz", (1,), 0.0, 9000.0))
    ctx = SchedulingContext(200.0, 3, 3, 900.0)
    held = new.decide(state, JobRequest("j", "lm-bs20", predicted_duration=50.0), ctx)
    assert held.gpu_ids == (1,)  # not next to a3c: that pair is held
    later = SchedulingContext(100.0 + new.probe_hold_s, 3, 3, 900.0)
    assert new.decide(state, JobRequest("j2", "lm-bs20", predicted_duration=50.0), later).gpu_ids == (0,)  # its hold ended
