"""DeepBoot as published: ATS (group knapsack over goodput with a restart penalty), reclaim by
shrinking, AFE costs and the inference pods' lifecycle, on a small synthetic workload written here
(never DeepBoot's data)."""

import itertools
import math

import numpy as np
import pytest

from slurm_horus.placement import JobRequest, NodeGroup, PendingQueue, RunningJob, SchedulingContext, build_cluster
from slurm_horus.placement.cycle import run_cycle
from slurm_horus.placement.elastic import ElasticJob, ElasticSpec, Shrink, group_knapsack, restart_factor
from slurm_horus.placement.policies.deepboot import DeepBoot
from slurm_horus.sim.elastic import DeepBootOptions
from slurm_horus.sim.engine import SimOptions
from slurm_horus.sim.metrics import jct_by_kind, summarize
from slurm_horus.sim.run import run_policies
from slurm_horus.sim.traces import PolluxApplications, read_trace
from slurm_horus.sim.truth import Truth

# ---- the group knapsack ----------------------------------------------------------------------------


def brute_force(choices, capacity):
    best = 0.0
    for pick in itertools.product(*[[(0, 0.0)] + list(group) for group in choices]):
        if sum(w for w, _ in pick) <= capacity:
            best = max(best, sum(v for _, v in pick))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_group_knapsack_is_optimal(seed):
    rng = np.random.default_rng(seed)
    choices = [[(w, float(rng.uniform(0, 3))) for w in sorted(rng.choice(range(1, 6), size=rng.integers(1, 4),
                                                                            replace=False))]
               for _ in range(rng.integers(1, 5))]
    capacity = int(rng.integers(0, 10))
    picked = group_knapsack(choices, capacity)
    assert sum(picked) <= capacity
    value = sum(dict(group)[w] for group, w in zip(choices, picked) if w)
    assert value == pytest.approx(brute_force(choices, capacity))


def test_restart_penalty_as_published():
    assert restart_factor(0.0, 0) == 0.0  # a job just submitted: nothing is worth moving it for yet
    assert restart_factor(90.0, 0) == pytest.approx(0.9)
    assert restart_factor(90.0, 3) == pytest.approx(60 / 100)
    assert restart_factor(20.0, 5) == 0.0


# ---- the policy -------------------------------------------------------------------------------------

LINEAR = ElasticSpec(tuple(float(r) for r in range(1, 9)))  # perfect scaling
FLAT = ElasticSpec((1.0, 1.05, 1.08, 1.1))  # barely scales


def two_partitions(train=1, infer=1, gpus=4):
    return build_cluster([NodeGroup(train, gpus, "v100", 16000.0, ("train",)),
                          NodeGroup(infer, gpus, "v100", 16000.0, ("infer",))])


def test_ats_gives_gpus_to_the_job_that_scales():
    state = two_partitions()
    policy = DeepBoot(explore=False)
    jobs = [ElasticJob("lin", LINEAR, 0, 0.0), ElasticJob("flat", FLAT, 0, 0.0)]
    counts = policy.allocate(state, jobs, now=1000.0)
    assert counts == {"lin": 7, "flat": 1}
    nolend = DeepBoot(explore=False, lend=False)
    assert nolend.allocate(state, jobs, now=1000.0) == {"lin": 3, "flat": 1}


def test_ats_restart_penalty_keeps_a_running_job_where_it_is():
    state = two_partitions(1, 0)
    state.place(RunningJob("a", "x", (0, 1), 0.0, 1e9, partition="train", elastic=LINEAR))
    policy = DeepBoot(explore=False)
    job = ElasticJob("a", ElasticSpec((1.0, 2.0, 2.05, 2.1)), 2, submit_time=0.0, restarts=3)
    # young and often restarted: +5 % is not worth a restart
    assert policy.allocate(state, [job], now=60.0) == {"a": 2}
    # old and rarely restarted: it is
    job.restarts = 0
    assert policy.allocate(state, [job], now=1e5) == {"a": 4}


def test_ats_explores_by_doubling_the_profiled_replicas():
    state = two_partitions()
    policy = DeepBoot()
    job = ElasticJob("a", LINEAR, 0, 0.0)
    assert policy.allocate(state, [job], 100.0, profiled={"a": 0}) == {"a": 1}
    assert policy.allocate(state, [job], 100.0, profiled={"a": 2}) == {"a": 4}
    assert policy.allocate(state, [job], 100.0, profiled={"a": 8}) == {"a": 8}


def test_protected_pods_are_kept_from_training_sleeping_ones_are_not():
    state = two_partitions()
    state.place(RunningJob("pod#1", "infer-a", (4,), 0.0, 50.0, pod_app="app-a", protect_until=50.0, partition="infer"))
    policy = DeepBoot()
    assert int(policy.training_gpus(state, now=10.0).sum()) == 7
    assert int(policy.training_gpus(state, now=60.0).sum()) == 8
    # a grow takes free GPUs before a sleeping pod, training GPUs before borrowed ones
    assert policy.resize_gpus(state, "t", (), 4, now=60.0) == (0, 1, 2, 3)
    assert policy.resize_gpus(state, "t", (), 7, now=60.0) == (0, 1, 2, 3, 5, 6, 7)
    assert policy.resize_gpus(state, "t", (), 8, now=60.0) == tuple(range(8))
    assert policy.resize_gpus(state, "t", (), 8, now=10.0) is None
    # a shrink gives borrowed GPUs back first
    assert policy.resize_gpus(state, "t", (0, 1, 5, 6), 2, now=60.0) == (0, 1)


def test_inference_takes_its_warm_pod_then_a_free_gpu_and_never_a_protected_one():
    state = two_partitions(1, 1, gpus=2)
    state.place(RunningJob("pod#1", "infer-a", (2,), 0.0, 100.0, pod_app="app-a", protect_until=100.0,
                           partition="infer"))
    policy = DeepBoot()
    own = policy.decide(state, JobRequest("r1", "infer-a", partition="infer", application="app-a"),
                        SchedulingContext(now=10.0))
    assert own.placed and own.gpu_ids == (2,) and not own.shared
    other = policy.decide(state, JobRequest("r2", "infer-b", partition="infer", application="app-b"),
                          SchedulingContext(now=10.0))
    assert other.gpu_ids == (3,)
    state.place(RunningJob("busy", "infer-c", (3,), 0.0, 100.0, partition="infer"))
    blocked = policy.decide(state, JobRequest("r3", "infer-b", partition="infer", application="app-b"),
                            SchedulingContext(now=10.0))
    assert not blocked.placed
    asleep = policy.decide(state, JobRequest("r3", "infer-b", partition="infer", application="app-b"),
                           SchedulingContext(now=100.0))
    assert asleep.gpu_ids == (2,)


def test_reclaim_shrinks_the_borrower_that_loses_least():
    state = two_partitions(1, 1, gpus=2)
    # both borrow one inference GPU; "flat" loses far less by giving it back
    state.place(RunningJob("lin", "x", (0, 2), 0.0, 1e9, partition="train", elastic=LINEAR))
    state.place(RunningJob("flat", "x", (1, 3), 5.0, 1e9, partition="train", elastic=FLAT))
    policy = DeepBoot()
    req = JobRequest("inf", "infer-a", partition="infer", application="app-a")
    assert policy.reclaim(state, req, SchedulingContext(now=10.0)) == [Shrink("flat", (3,))]
    two = JobRequest("inf2", "infer-a", gpus_per_node=2, partition="infer", application="app-a")
    assert sorted(policy.reclaim(state, two, SchedulingContext(now=10.0)), key=lambda s: s.job_id) == [
        Shrink("flat", (3,)), Shrink("lin", (2,))]
    # no lending, nothing to reclaim
    assert DeepBoot(lend=False).reclaim(state, req, SchedulingContext(now=10.0)) == []


def test_cycle_shrinks_through_its_callback_and_preempts_without_one():
    def setup():
        state = two_partitions(1, 1, gpus=1)
        state.place(RunningJob("own", "x", (0,), 0.0, 1e9, partition="train", elastic=LINEAR))
        state.place(RunningJob("big", "x", (1,), 0.0, 1e9, partition="train", elastic=LINEAR))
        queue = PendingQueue(DeepBoot())
        queue.add(JobRequest("inf", "infer-a", partition="infer", application="app-a", submit_time=1.0))
        return state, queue

    def starter(state, policy):
        def start(req, decision):
            state.place(policy.running_job(req, decision, 1.0))
            return True
        return start

    shrunk, preempted = [], []
    state, queue = setup()
    policy = queue.policy

    def shrink(s):
        shrunk.append(s)
        state.release(s.job_id)

    result = run_cycle(state, policy, queue, 1.0, starter(state, policy),
                       preempt=lambda j: pytest.fail("shrinks, does not preempt"), shrink=shrink)
    assert shrunk == [Shrink("big", (1,))] == result.shrunk and [r.job_id for r, _ in result.started] == ["inf"]
    state, queue = setup()
    policy = queue.policy

    def preempt(job_id):
        preempted.append(job_id)
        state.release(job_id)

    result = run_cycle(state, policy, queue, 1.0, starter(state, policy), preempt=preempt)
    assert preempted == ["big"] == result.preempted


# ---- the simulator: a synthetic Pollux-format application ------------------------------------------

SYNC = {1: 0.1, 2: 0.3}  # seconds per step to synchronize within one node / across two


def step_time(local, nodes, replicas):
    return 0.01 * local + (SYNC[nodes] if replicas > 1 else 0.0)


def write_app(root, app="toy"):
    folder = root / "traces" / app
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "validation-64.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n1,500,1,1,1\n2,1000,2,1,1\n")
    (folder / "validation-256.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n1,300,2,1,1\n")
    rows = ["placement,local_bsz,step_time,sync_time"]
    keys = {"".join(map(str, sorted(c for c in counts if c))) for counts in itertools.product(range(5), repeat=2)}
    for key in sorted(k for k in keys if k):
        nodes, replicas = len(key), sum(map(int, key))
        for local in (16, 32, 64):
            sync = SYNC[nodes] if replicas > 1 else 0.0
            rows.append(f"{key},{local},{step_time(local, nodes, replicas)},{sync}")
    (folder / "placements.csv").write_text("\n".join(rows) + "\n")
    return PolluxApplications(root / "traces")


def expected_time(replicas_per_node):
    """Seconds to target by the rule of :meth:`PolluxApplications.time_to_target`, by hand."""
    nodes, replicas = len(replicas_per_node), sum(replicas_per_node)
    best = math.inf
    for bsz, steps in ((64, 1000), (256, 300)):
        local = math.ceil(bsz / replicas)
        if local < 16:
            continue
        accum = math.ceil(local / 64) - 1
        atomic = math.ceil(local / (accum + 1))
        step, sync = step_time(atomic, nodes, replicas), (SYNC[nodes] if replicas > 1 else 0.0)
        best = min(best, steps * (step + accum * (step - sync)))
    return best


def test_time_to_target_reads_goodput_off_the_traces(tmp_path):
    apps = write_app(tmp_path)
    for counts in ([1], [2], [4], [4, 4], [3, 1], [2, 2]):
        assert apps.time_to_target("toy", counts) == pytest.approx(expected_time(counts)), counts
    assert apps.time_to_target("toy", [4, 4]) < apps.time_to_target("toy", [4]) < apps.time_to_target("toy", [1])
    assert apps.time_to_target("toy", [4, 4, 4, 4, 4]) == math.inf  # 20 replicas: no batch size splits that far


def test_wider_placements_come_from_scalability_csv(tmp_path):
    apps = write_app(tmp_path)
    (tmp_path / "traces" / "toy" / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,16,2.0,1.0\n6,6,64,3.0,1.0\n"
        "16,16,16,9.0,8.0\n")
    assert apps.step_rows("toy", [1, 1, 1, 1, 1]) == [(16.0, 2.0, 1.0), (64.0, 3.0, 1.0)]  # nearest: 6 × 1
    assert apps.step_rows("toy", [1] * 15) == [(16.0, 9.0, 8.0)]
    assert apps.step_rows("toy", [2, 4]) == apps.step_rows("toy", [4, 2])  # placements.csv, by its key
    # 5 replicas, batch 256: 52 per GPU, step time interpolated between 16 and 64
    assert apps.time_to_target("toy", [1] * 5) == pytest.approx(300 * (2.0 + (52 - 16) / 48 * 1.0))


def workload(tmp_path, rows):
    write_app(tmp_path)
    path = tmp_path / "workloads" / "w.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("name,time,application,num_replicas,batch_size,duration,num_task\n" + "\n".join(rows) + "\n")
    return read_trace(str(path))


TRUTH = Truth([], classes=["c"], constant=1.0)
COSTS = DeepBootOptions(start=20.0, rescale=2.0, inference_start=5.0, interval=60.0)


def simulate(trace, policies, costs=COSTS, groups=None):
    groups = groups or [NodeGroup(1, 4, "v100", 16000.0, ("train",)), NodeGroup(1, 4, "v100", 16000.0, ("infer",))]
    results = run_policies(trace, groups, TRUTH, policies, holdout=False, options=SimOptions(deepboot=costs))
    return {r.policy: r for r in results}


def ends(result):
    return {j.req.job_id: j.end for j in result.jobs}


def test_an_elastic_job_spreads_over_both_partitions_at_the_next_round(tmp_path):
    trace = workload(tmp_path, ["toy-0,0,toy,1,64,4.0,-1"])
    out = simulate(trace, ["deepboot/explore=false", "deepboot-nolend"])
    # round at t=60: all 8 GPUs (4 + 4 borrowed, placement "44"), a 20 s start, then time to target
    assert ends(out["deepboot/explore=false"])["toy-0"] == pytest.approx(60 + 20 + expected_time([4, 4]))
    # the rigid baseline: its requested replica at its batch size (the duration rule), after its start
    assert ends(out["deepboot-nolend"])["toy-0"] == pytest.approx(20 + 1000 * step_time(64, 1, 1))


def test_an_inference_burst_shrinks_the_borrower_and_warm_pods_start_at_once(tmp_path):
    trace = workload(tmp_path, ["toy-0,0,toy,1,64,4.0,-1",
                                "inference-a-1,200,infer-a-1,1,1,10.0,5",  # no free GPU: shrink, cold start
                                "inference-a-2,230,infer-a-1,1,1,10.0,5",  # its pod, protected: warm
                                "inference-b-3,232,infer-b-1,1,1,10.0,5"])  # another app: shrink again
    result = simulate(trace, ["deepboot/explore=false"])["deepboot/explore=false"]
    jct = {j.req.job_id: j.end - j.trace.submit_time for j in result.jobs}
    assert jct["inference-a-1"] == pytest.approx(5 + 10)
    assert jct["inference-a-2"] == pytest.approx(10)
    assert jct["inference-b-3"] == pytest.approx(5 + 10)
    assert result.runtime["shrinks_for_inference"] == 2 and result.preemptions == 0
    assert result.runtime["inference_warm_starts"] == 1 and result.runtime["inference_cold_starts"] == 2
    # the training job lost 2 s per shrink and ran slower on fewer GPUs, but kept running
    toy = [j for j in result.jobs if j.req.job_id == "toy-0"][0]
    assert toy.end > 60 + 20 + expected_time([4, 4]) + 2 * 2
    assert summarize(result)["unfinished"] == 0


def synthetic_mix(tmp_path, n_train=24, n_infer=120, seed=1):
    rng = np.random.default_rng(seed)
    rows = [f"toy-{i},{int(i * 150)},toy,{int(rng.choice([1, 2, 4]))},{int(rng.choice([64, 256]))},4.0,-1"
            for i in range(n_train)]
    rows += [f"inference-a-{k},{int(t)},infer-{'ab'[k % 2]}-1,1,1,{float(rng.uniform(2, 9)):.1f},10"
             for k, t in enumerate(np.sort(rng.uniform(0, 4000, n_infer)))]
    return workload(tmp_path, rows)


def test_elastic_lending_beats_the_baseline_and_loses_no_job(tmp_path):
    trace = synthetic_mix(tmp_path)
    out = simulate(trace, ["deepboot", "deepboot-nolend", "deepboot-nolend/elastic=true", "deepboot/elastic=false"])
    for result in out.values():
        assert summarize(result)["unfinished"] == 0
        assert all(j.end >= j.first_start >= j.trace.submit_time for j in result.jobs)
    train = {name: jct_by_kind(r, "train") for name, r in out.items()}
    assert train["deepboot"] < train["deepboot-nolend/elastic=true"] < train["deepboot-nolend"]
    assert train["deepboot/elastic=false"] < train["deepboot-nolend"]
    # inference never waits for training: at most a cold start and a shrink's worth over its duration
    for r in out.values():
        for j in r.jobs:
            if j.trace.kind == "infer":
                assert j.end - j.trace.submit_time <= j.trace.duration + COSTS.inference_start + 1e-6


def test_afe_costs_less_than_restarting_on_every_change(tmp_path):
    trace = synthetic_mix(tmp_path, seed=2)
    afe = simulate(trace, ["deepboot"])["deepboot"]
    restarts = simulate(trace, ["deepboot"], costs=DeepBootOptions(start=20.0, restart=60.0))["deepboot"]
    assert afe.runtime["resizes"] > 0
    assert jct_by_kind(afe, "train") < jct_by_kind(restarts, "train")


def test_change_costs_as_deepboot_charges_them():
    costs = DeepBootOptions(start_costs={"bert": 103}, rescale_costs={"bert": 5})
    assert costs.change_cost("bert", 0, 4) == 103  # first start
    assert costs.change_cost("bert", 4, 2) == 5  # shrink
    assert costs.change_cost("bert", 2, 4) == 5 + (103 - 5) * 2 // 4  # grow: the new replicas start
    assert costs.change_cost("bert", 4, 4) == 103  # moved at the same count
    assert DeepBootOptions(start_costs={"bert": 103}, afe=False).change_cost("bert", 4, 2) == 103
    assert DeepBootOptions(restart=30.0).change_cost("bert", 4, 2) == 30.0
    assert [costs.protect_time(h) for h in (0, 1, 6, 9)] == [30, 45, 120, 120]
