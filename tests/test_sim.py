"""Simulator: sanity properties, metrics, CLI and bad input (tiny made-up traces only)."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_horus.interference.base import Observation
from slurm_horus.placement import NodeGroup
from slurm_horus.sim.cli import simulate
from slurm_horus.sim.engine import SimOptions
from slurm_horus.sim.metrics import summarize
from slurm_horus.sim.run import parse_cluster, run_policies
from slurm_horus.sim.traces import TraceJob
from slurm_horus.sim.truth import Truth, TruthPredictor

CLASSES = ["a", "b", "c", "d"]
EXCLUSIVE_TWIN = {"sjf-ffs": "sjf", "sjf-bsbf": "sjf", "horus": "sjf", "oracle": "sjf",
                  "horus-util": "slurm-default", "iasp-iapp": "slurm-default"}


def make_trace(n=60, seed=1, span=400.0):
    rng = np.random.default_rng(seed)
    return [TraceJob(f"j{i}", float(t), float(d), 1, job_class=CLASSES[i % 4])
            for i, (t, d) in enumerate(zip(np.sort(rng.uniform(0, span, n)), rng.uniform(50, 400, n)))]


def random_truth(seed=3):
    rng = np.random.default_rng(seed)
    obs = [Observation("v100", a, b, float(rng.uniform(0.3, 0.95))) for a in CLASSES for b in CLASSES]
    return Truth(obs, classes=CLASSES)


def constant_truth(value):
    return Truth([], classes=CLASSES, constant=value, name=str(value))


def simulate_all(truth, policies, trace=None, groups=None, knows_truth=True, seed=0, options=None):
    groups = groups or [NodeGroup(2, 2, "v100", 16384.0)]
    factory = (lambda kind: TruthPredictor(truth)) if knows_truth else None
    results = run_policies(trace or make_trace(), groups, truth, policies, seed=seed, holdout=False,
                           predictor_factory=factory, options=options)
    return {r.policy: (r, summarize(r)) for r in results}


def test_no_interference_sharing_never_loses_to_exclusive():
    out = simulate_all(constant_truth(1.0), list(EXCLUSIVE_TWIN) + ["sjf", "slurm-default"])
    for sharing, exclusive in EXCLUSIVE_TWIN.items():
        assert out[sharing][1]["mean_jct"] <= out[exclusive][1]["mean_jct"] + 1e-6, sharing
        assert out[sharing][1]["makespan"] <= out[exclusive][1]["makespan"] + 1e-6, sharing
    assert out["horus"][1]["mean_jct"] < out["sjf"][1]["mean_jct"]  # and it does share


def test_all_infeasible_truth_makes_sharing_policies_exclusive():
    # horus's makespan guard reorders the queue, so its exclusive twin is itself without the guard
    # (the oracle knows the true durations: its twin is sjf told them too)
    twins = {k: v for k, v in EXCLUSIVE_TWIN.items() if k not in ("horus", "oracle")}
    twins.update({"horus/guard=0": "sjf"})
    out = simulate_all(constant_truth(0.0), list(twins) + ["sjf", "slurm-default", "horus"])
    told = simulate_all(constant_truth(0.0), ["oracle/guard=0", "sjf"], options=SimOptions(durations="oracle"))
    out["oracle/guard=0"], out["sjf (oracle durations)"] = told["oracle/guard=0"], told["sjf"]
    twins["oracle/guard=0"] = "sjf (oracle durations)"
    assert all(j.shared_time == 0 for j in out["horus"][0].jobs)
    for sharing, exclusive in twins.items():
        mine = sorted((j.req.job_id, j.first_start, j.end) for j in out[sharing][0].jobs)
        twin = sorted((j.req.job_id, j.first_start, j.end) for j in out[exclusive][0].jobs)
        assert mine == twin, sharing
        assert out[sharing][1]["oom_events"] == 0
        assert all(j.shared_time == 0 for j in out[sharing][0].jobs)


def test_infeasible_pairs_cause_oom_and_requeue_when_the_model_is_wrong():
    truth = constant_truth(0.0)
    trace = make_trace(12, span=10.0)
    results = run_policies(trace, [NodeGroup(1, 2, "v100", 16384.0)], truth, ["sjf-ffs"], holdout=False,
                           predictor_factory=lambda kind: TruthPredictor(constant_truth(0.9)),
                           options=SimOptions(oom_penalty=30.0))
    s = summarize(results[0])
    assert s["oom_events"] >= 1 and s["unfinished"] == 0
    assert s["bad_pair_share"] == 0.0  # nothing ever ran shared


def test_same_seed_same_result_and_seed_matters_for_classes():
    trace = [TraceJob(f"j{i}", float(i * 5), 100.0 + i, 1) for i in range(40)]  # no classes: drawn by seed
    truth = random_truth()
    first = simulate_all(truth, ["horus", "sjf-bsbf"], trace=trace, seed=7)
    again = simulate_all(truth, ["horus", "sjf-bsbf"], trace=trace, seed=7)
    for name in first:
        assert first[name][1] == again[name][1]
    other = simulate_all(truth, ["horus"], trace=trace, seed=8)
    classes = [j.req.job_class for j in first["horus"][0].jobs]
    assert classes != [j.req.job_class for j in other["horus"][0].jobs]


def test_oracle_not_beaten_beyond_noise():
    trace = make_trace(120, span=200.0)
    out = simulate_all(random_truth(), ["oracle", "horus", "sjf-bsbf", "sjf-ffs"], trace=trace, knows_truth=False)
    oracle = out["oracle"][1]
    for name in ("horus", "sjf-bsbf", "sjf-ffs"):
        assert oracle["makespan"] <= out[name][1]["makespan"] * 1.05, name


def test_work_is_conserved_and_metrics_are_consistent():
    out = simulate_all(random_truth(), ["slurm-default", "horus"])
    for name, (result, s) in out.items():
        assert s["unfinished"] == 0
        for job in result.jobs:
            assert job.end >= job.first_start >= job.trace.submit_time
            assert job.run_time >= job.trace.duration - 1e-6  # never faster than alone
        assert 0 < s["gpu_allocation_ratio"] <= 1.0 + 1e-9
    exclusive = out["slurm-default"][1]
    assert exclusive["effective_utilization"] == pytest.approx(exclusive["gpu_allocation_ratio"], rel=1e-6)


def test_true_rate_of_a_shared_pair_is_used():
    truth = Truth([Observation("v100", "a", "b", 0.5), Observation("v100", "b", "a", 0.8)], classes=["a", "b"])
    trace = [TraceJob("x", 0.0, 100.0, 1, job_class="a"), TraceJob("y", 0.0, 100.0, 1, job_class="b")]
    results = run_policies(trace, [NodeGroup(1, 1, "v100", 16384.0)], truth, ["sjf-ffs"], holdout=False,
                           predictor_factory=lambda kind: TruthPredictor(truth))
    ends = {j.req.job_id: j.end for j in results[0].jobs}
    # together: a at 0.5, b at 0.8 → b ends at 125 s having let a do 62.5 s; a finishes alone at 162.5 s
    assert ends["y"] == pytest.approx(125.0)
    assert ends["x"] == pytest.approx(162.5)


def test_multi_gpu_job_runs_at_its_slowest_gpu():
    truth = Truth([Observation("v100", "a", "b", 0.5), Observation("v100", "b", "a", 0.9)], classes=["a", "b"])
    trace = [TraceJob("small", 0.0, 1000.0, 1, job_class="b"), TraceJob("big", 1.0, 100.0, 2, job_class="a")]
    results = run_policies(trace, [NodeGroup(1, 2, "v100", 16384.0)], truth, ["sjf-ffs"], holdout=False,
                           predictor_factory=lambda kind: TruthPredictor(truth))
    big = [j for j in results[0].jobs if j.req.job_id == "big"][0]
    assert big.end == pytest.approx(1.0 + 200.0)


def test_deepboot_lending_helps_training(tmp_path):
    groups = [NodeGroup(1, 2, "v100", 16384.0, ("train",)), NodeGroup(1, 2, "v100", 16384.0, ("infer",))]
    trace = [TraceJob(f"t{i}", float(i), 300.0, 1, job_class="a", partition="train") for i in range(8)]
    trace += [TraceJob(f"i{i}", 100.0 + 50 * i, 20.0, 1, job_class="infer-x", partition="infer", kind="infer")
              for i in range(5)]
    out = simulate_all(random_truth(), ["deepboot", "deepboot-nolend"], trace=trace, groups=groups)
    from slurm_horus.sim.metrics import jct_by_kind
    assert jct_by_kind(out["deepboot"][0], "train") < jct_by_kind(out["deepboot-nolend"][0], "train")
    assert out["deepboot"][1]["preemptions"] >= 1
    assert out["deepboot"][1]["unfinished"] == 0


def test_cluster_spec_groups_and_partitions(tmp_path):
    groups = parse_cluster("2x4:v100@train,1x8:p100@infer+default")
    assert [(g.nodes, g.gpus_per_node, g.gpu_type, g.partitions) for g in groups] == [
        (2, 4, "v100", ("train",)), (1, 8, "p100", ("infer", "default"))]
    yaml = tmp_path / "c.yaml"
    yaml.write_text("groups:\n  - nodes: 3\n    gpus_per_node: 2\n    gpu_type: v100\n    partitions: [a, b]\n")
    assert [(g.nodes, g.partitions) for g in parse_cluster(str(yaml))] == [(3, ("a", "b"))]
    from slurm_horus.errors import InputError
    with pytest.raises(InputError):
        parse_cluster("4:v100")


def _generic(tmp_path, rows, header="job_id,submit_time,duration,num_gpus,job_class"):
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


def test_cli_compares_policies_and_writes_outputs(tmp_path):
    rows = [f"j{i},{i * 10},{100 + 7 * i},1,{['resnet18-bs64', 'lm-bs20', 'a3c'][i % 3]}" for i in range(30)]
    trace = _generic(tmp_path, rows)
    out_json, out_csv, out_html = tmp_path / "s.json", tmp_path / "jobs.csv", tmp_path / "r.html"
    result = CliRunner().invoke(simulate, ["--trace", trace, "--cluster", "2x2:v100", "--policy",
                                           "slurm-default,horus,sjf-bsbf", "--json", str(out_json),
                                           "--jobs-csv", str(out_csv), "--report", str(out_html),
                                           "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "slurm-default" in result.output and "x)" in result.output
    data = json.loads(out_json.read_text())
    assert set(data["policies"]) == {"slurm-default", "horus", "sjf-bsbf"}
    assert data["policies"]["horus"]["makespan"] > 0 and "mean_queueing_delay" in data["policies"]["horus"]
    assert len(out_csv.read_text().splitlines()) == 1 + 3 * 30
    html = out_html.read_text()
    assert "<svg" in html and "horus" in html


def test_cli_time_unit_ms(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                     + "".join(f"{k},1,{k * 1000},1,m,{7200000 + k * 1000},0\n" for k in range(4)))
    args = ["--trace", str(trace), "--cluster", "1x2:v100", "--policy", "slurm-default", "--no-progress",
            "--json", str(tmp_path / "s.json")]
    read_as_s = CliRunner().invoke(simulate, args)
    assert read_as_s.exit_code == 0, read_as_s.output
    assert "look like milliseconds" in read_as_s.output
    makespan_s = json.loads((tmp_path / "s.json").read_text())["policies"]["slurm-default"]["makespan"]
    read_as_ms = CliRunner().invoke(simulate, args + ["--time-unit", "ms"])
    assert read_as_ms.exit_code == 0 and "milliseconds" not in read_as_ms.output
    makespan_ms = json.loads((tmp_path / "s.json").read_text())["policies"]["slurm-default"]["makespan"]
    assert makespan_ms == pytest.approx(makespan_s / 1000)


@pytest.mark.parametrize("rows,message", [
    (["j1,0,100,1,a3c", "j2,5,-3,1,a3c"], ":3: duration='-3' must be >= 0.0"),
    (["j1,0,100,1,nosuchclass"], ":2: unknown class 'nosuchclass'"),
    (["j1,zero,100,1,a3c"], ":2: submit_time='zero' is not a number"),
])
def test_cli_bad_trace_names_file_and_line(tmp_path, rows, message):
    from slurm_horus.cli import main
    trace = _generic(tmp_path, rows)
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--trace", trace, "--cluster", "1x2:v100", "--policy", "slurm-default", "--no-progress"])
    assert exit_info.value.code == 2


def test_cli_bad_trace_message(tmp_path, capsys):
    from slurm_horus.cli import main
    trace = _generic(tmp_path, ["j1,0,100,1"], header="job_id,submit_time,num_gpus,job_class")
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", trace, "--policy", "slurm-default", "--no-progress"])
    err = capsys.readouterr().err
    assert "t.csv:1: missing column(s) duration" in err


def test_sjf_ffs_never_shares_while_a_gpu_is_free():
    from slurm_horus.placement import ClassIndex, build_cluster, make_policy
    from slurm_horus.sim.engine import Simulator
    from slurm_horus.sim.run import policy_models, prepare_trace

    truth = random_truth()
    groups = [NodeGroup(2, 2, "v100", 16384.0)]
    for span in (4000.0, 400.0, 40.0):  # light, medium and heavy load
        jobs = prepare_trace(make_trace(80, seed=5, span=span), truth, 0, 1.0, 4)
        classes = ClassIndex(truth.classes)
        policy = make_policy("sjf-ffs", policy_models(truth, classes, holdout=False,
                                                      predictor_factory=lambda kind: TruthPredictor(truth)))
        free_when_shared, shared = [], [0]
        decide = policy.decide

        def watched(state, req, ctx=None, explain=False):
            decision = decide(state, req, ctx, explain)
            if decision.shared:
                shared[0] += 1
                free_when_shared.append(state.n_free)
            return decision

        policy.decide = watched
        state = build_cluster(groups, classes=classes)
        Simulator(state, truth, policy, jobs).run()
        assert free_when_shared == [0] * shared[0], span
    assert shared[0] > 0  # at the heaviest load it does share


def test_spreading_a_multi_gpu_job_costs_what_gavel_measured():
    from slurm_horus.interference.priors import builtin_scaling
    from slurm_horus.sim.truth import load_truth

    truth = load_truth("gavel:v100")
    together, spread = builtin_scaling()[("v100", "lm-bs20", 4)]
    assert spread / together == pytest.approx(0.301, abs=0.001)  # Gavel: 33.4 vs 111.0 steps/s
    groups = [NodeGroup(2, 4, "v100", 16384.0)]
    packed = TraceJob("packed", 0.0, 1000.0, 4, job_class="lm-bs20")  # 1 node x 4 GPUs
    apart = TraceJob("apart", 0.0, 1000.0, 4, job_class="lm-bs20", gpus_per_node=2)  # 2 nodes x 2 GPUs
    ends = {}
    for job in (packed, apart):
        result = run_policies([job], groups, truth, ["slurm-default"], holdout=False)[0]
        ends[job.job_id] = result.jobs[0].end
    assert ends["packed"] == pytest.approx(1000.0)
    assert ends["apart"] == pytest.approx(1000.0 * together / spread)
    # a size Gavel did not measure takes the nearest measured size below it; an unmeasured class the median
    assert truth.spread_factor("lm-bs20", "v100", 6) == truth.spread_factor("lm-bs20", "v100", 4)
    ratios = [min(1.0, s / t) for (g, _, n), (t, s) in builtin_scaling().items() if g == "v100" and n == 2]
    assert truth.spread_factor("a3c", "v100", 2) == pytest.approx(float(np.median(ratios)))


def test_a_sub_batched_job_runs_at_the_speed_of_the_smaller_batch():
    from slurm_horus.sim.truth import load_truth

    base = load_truth("gavel:v100")
    # make resnet50-bs64 unable to share with lm-bs20 (and its micro-batch able to): sjf-bsbf sub-batches
    obs = [Observation("v100", a, b, v) for (g, a, b), v in base.pairs.items()]
    obs += [Observation("v100", "resnet50-bs64", "lm-bs20", 0.0), Observation("v100", "lm-bs20", "resnet50-bs64", 0.0),
            Observation("v100", "resnet50-bs32", "lm-bs20", 0.9), Observation("v100", "lm-bs20", "resnet50-bs32", 0.9)]
    truth = Truth(obs, name="t")
    truth.solo = dict(base.solo)
    trace = [TraceJob("long", 0.0, 10000.0, 1, job_class="lm-bs20"),
             TraceJob("new", 1.0, 100.0, 1, job_class="resnet50-bs64")]
    result = run_policies(trace, [NodeGroup(1, 1, "v100", 16384.0)], truth, ["sjf-bsbf"], holdout=False,
                          predictor_factory=lambda kind: TruthPredictor(truth))[0]
    new = [j for j in result.jobs if j.req.job_id == "new"][0]
    speed = (base.solo[("v100", "resnet50-bs32")] * 32) / (base.solo[("v100", "resnet50-bs64")] * 64)
    assert new.run_class == "resnet50-bs32" and new.ooms == 0
    assert new.end == pytest.approx(1.0 + 100.0 / (0.9 * speed))


def test_live_cadence_delays_the_cycle_after_an_end_and_holds_gpus_for_the_launch():
    """One GPU, three jobs: the second waits for the first; an arrival is decided at once."""
    trace = [TraceJob("a", 0.0, 100.0, 1, job_class="a"), TraceJob("b", 10.0, 50.0, 1, job_class="a"),
             TraceJob("c", 500.0, 40.0, 1, job_class="a")]

    def run(**options):
        result = run_policies([TraceJob(t.job_id, t.submit_time, t.duration, 1, job_class="a") for t in trace],
                              [NodeGroup(1, 1, "v100", 16384.0)], constant_truth(1.0), ["slurm-default"],
                              holdout=False, options=SimOptions(**options))[0]
        return {j.req.job_id: (j.first_start, j.end) for j in result.jobs}

    assert run() == {"a": (0.0, 100.0), "b": (100.0, 150.0), "c": (500.0, 540.0)}
    # b starts when the cycle after a's end runs; c arrives on a free GPU and starts at once
    assert run(end_to_cycle_s=30.0) == {"a": (0.0, 100.0), "b": (130.0, 180.0), "c": (500.0, 540.0)}
    # every job holds its GPU 5 s longer than its work
    assert run(launch_s=5.0, end_to_cycle_s=30.0) == {"a": (0.0, 105.0), "b": (135.0, 190.0),
                                                      "c": (500.0, 545.0)}


def test_the_slowdown_limit_is_a_run_option_of_the_simulator(capsys):
    """horusd's slowdown_limit, applied by the one cycle: at 1.0 no pair is predicted fast enough, so
    nothing shares; without it the same run shares; below 1 it is one clear error."""
    from slurm_horus.cli import main

    truth = random_truth()
    groups = [NodeGroup(2, 2, "v100", 16384.0)]
    jobs = make_trace(60, seed=5, span=40.0)
    shared = {}
    for limit in (None, 1.0):
        results = run_policies(jobs, groups, truth, ["horus"], holdout=False, seed=0,
                               options=SimOptions(max_slowdown=limit))
        shared[limit] = sum(j.ever_shared for j in results[0].jobs)
    assert shared[None] > 0 and shared[1.0] == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--trace", "nope.csv", "--slowdown-limit", "0.5", "--no-progress"])
    assert exit_info.value.code == 2 and "--slowdown-limit must be at least 1" in capsys.readouterr().err


def test_what_ended_jobs_tell_reaches_the_policy_at_the_live_cadence(monkeypatch):
    """horusd learns run times at its estimator's feeds (every 300 s) and pairs at its model refits
    (refit_s): with those intervals (the defaults) the simulator holds what ended jobs told until the
    next multiple, so a job that starts sooner is estimated without it; 0 is at once (an ideal
    learner), inf never during the run."""
    from slurm_horus.placement.framework import Policy

    trace = [TraceJob("a", 0.0, 100.0, 1, job_class="a", user="u"), TraceJob("b", 10.0, 50.0, 1, job_class="a", user="u"),
             TraceJob("c", 500.0, 40.0, 1, job_class="a", user="u")]

    def estimates(**options):
        result = run_policies(list(trace), [NodeGroup(1, 1, "v100", 16384.0)], constant_truth(1.0), ["slurm-default"],
                              holdout=False, options=SimOptions(**options))[0]
        return {j.req.job_id: round(j.estimate.seconds) for j in result.jobs}

    # at once: b knows a's run; c the median of a's and b's
    assert estimates(learn_durations_every_s=0.0) == {"a": 3600, "b": 100, "c": 75}
    # horusd's feed every 300 s: a's run (at 100 s) and b's (150 s) are learned at the feed at 300 s,
    # handed over at c's arrival
    assert SimOptions().learn_durations_every_s == 300.0 and SimOptions().learn_pairs_every_s == 300.0
    assert estimates() == {"a": 3600, "b": 3600, "c": 75}
    assert estimates(learn_durations_every_s=math.inf) == {"a": 3600, "b": 3600, "c": 3600}

    learned = []
    monkeypatch.setattr(Policy, "observe", lambda self, *args: learned.append(args))
    jobs = make_trace(60, seed=5, span=40.0)  # a burst on 4 GPUs: sjf-ffs shares, pairs are measured
    told = {}

    def run(every):
        learned.clear()
        result = run_policies(jobs, [NodeGroup(2, 2, "v100", 16384.0)], random_truth(), ["sjf-ffs"], holdout=False,
                              options=SimOptions(learn_pairs_every_s=every))[0]
        told[every] = (result.observations, len(learned))
        return summarize(result)["makespan"]

    makespan = run(0.0)
    assert told[0.0][0] > 0 and told[0.0][1] == told[0.0][0]  # every pair measured is learned at once
    run(0.6 * makespan)  # one refit, at 60 % of the run: the pairs measured after it are never learned
    assert 0 < told[0.6 * makespan][1] < told[0.6 * makespan][0]
    run(math.inf)
    assert told[math.inf][1] == 0
    with pytest.raises(ValueError):
        run_policies(jobs, [NodeGroup(2, 2, "v100", 16384.0)], random_truth(), ["sjf-ffs"],
                     options=SimOptions(learn_pairs_every_s=-1.0))


def test_a_sites_history_is_learned_as_the_runs_own_are():
    """SimOptions.history: the site's other runs reach the duration estimator as the run's own do.
    What ended before the first arrival is known from the start; a run that ends during the run is
    learned at the first feed after its end (never before it), at once with interval 0, never during
    a run that learns nothing; a run that learns nothing at all (``limit``) learns no history either."""
    from slurm_horus.sim.engine import HistoryRun
    from slurm_horus.sim.run import history_from_trace

    trace = [TraceJob("a", 0.0, 100.0, 1, job_class="a", user="u"), TraceJob("b", 400.0, 50.0, 1, job_class="a", user="u"),
             TraceJob("c", 700.0, 40.0, 1, job_class="a", user="u")]

    def estimates(history, **options):
        result = run_policies(list(trace), [NodeGroup(1, 1, "v100", 16384.0)], constant_truth(1.0), ["slurm-default"],
                              holdout=False, options=SimOptions(history=history, **options))[0]
        return {j.req.job_id: round(j.estimate.seconds) for j in result.jobs}

    cold = estimates(())
    assert cold == {"a": 3600, "b": 100, "c": 75}
    # ended before the first arrival: the store held it when the run began (a's estimate is its run)
    assert estimates([HistoryRun(-10.0, "u", "a", 20.0)]) == {"a": 20, "b": 60, "c": 50}
    # another user's run says nothing of u's jobs once u has runs of its own (the same levels apply)
    assert estimates([HistoryRun(-10.0, "v", "other", 20.0)])["b"] == 100
    # ends at 350 s: learned at the feed at 600 s with the run's own (not by b at 400 s), c knows it
    late = [HistoryRun(350.0, "u", "a", 1000.0)]
    assert estimates(late) == {"a": 3600, "b": 100, "c": 100}  # median of 100 (a), 1000 and 50 (b)
    assert estimates(late, learn_durations_every_s=0.0) == {"a": 3600, "b": 550, "c": 100}
    assert estimates(late, learn_durations_every_s=math.inf) == {"a": 3600, "b": 3600, "c": 3600}
    assert estimates([HistoryRun(-10.0, "u", "a", 20.0)], durations="limit") == {"a": 3600, "b": 3600, "c": 3600}
    # a run with no usable end or run time is left out, the others are learned
    assert estimates([HistoryRun(math.nan, "u", "a", 5.0), HistoryRun(-20.0, "u", "a", 0.0),
                      HistoryRun(-10.0, "u", "a", 20.0)]) == {"a": 20, "b": 60, "c": 50}

    # from a trace's other jobs: arrivals scaled by the load as the simulated jobs', run time added;
    # the simulated jobs' class draws are left as they were
    others = [TraceJob("x", 100.0, 30.0, 1, user="u"), TraceJob("y", -50.0, 40.0, 1, user="w", job_class="a")]
    truth = constant_truth(1.0)
    runs = history_from_trace(others, truth, seed=0, load=2.0)
    assert [(r.end, r.user, r.run_time) for r in runs] == [(80.0, "u", 30.0), (15.0, "w", 40.0)]
    assert runs[0].job_class in truth.classes and runs[1].job_class == "a" and others[0].job_class is None
    plain = [TraceJob(f"j{i}", float(i), 10.0, 1, user="u") for i in range(20)]
    drawn = [j.req.job_class for j in run_policies(plain, [NodeGroup(1, 1, "v100", 16384.0)], truth, ["sjf"],
                                                    options=SimOptions())[0].jobs]
    with_history = [j.req.job_class for j in run_policies(plain, [NodeGroup(1, 1, "v100", 16384.0)], truth, ["sjf"],
                                                           options=SimOptions(history=runs))[0].jobs]
    assert drawn == with_history


def test_cli_learning_intervals_are_checked(capsys):
    from slurm_horus.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--trace", "nope.csv", "--learn-pairs-every", "-5", "--no-progress"])
    assert exit_info.value.code == 2 and "--learn-pairs-every must be 0" in capsys.readouterr().err


def test_a_start_that_runs_out_of_memory_counts_as_run_and_probe_hold_keeps_it_from_repeating():
    """Live, a placement that runs out of memory was applied (Slurm started the job, which failed at
    once): the simulator tells the policy it ran, so horus counts the probe (``explored``). Without
    ``probe_hold`` the same pair only predicted is probed again as soon as the failed probe is gone;
    with it, each pair waits for its measurement (the next feed): at most one failed start per pair."""
    truth = constant_truth(0.0)  # every pair runs out of memory
    trace = make_trace(40, span=60.0)
    results = run_policies(trace, [NodeGroup(1, 2, "v100", 16384.0)], truth, ["horus", "horus/probe_hold=true"],
                           holdout=False, predictor_factory=lambda kind: TruthPredictor(constant_truth(0.6)),
                           options=SimOptions(oom_penalty=30.0))
    free_for_all, held = results
    assert free_for_all.runtime["explored:v100"] == free_for_all.oom_events  # every probe failed, each counted
    pairs = len({tuple(sorted((a, b))) for a in CLASSES for b in CLASSES})
    assert held.runtime["explored:v100"] == held.oom_events <= pairs < free_for_all.oom_events
    assert summarize(held)["unfinished"] == summarize(free_for_all)["unfinished"] == 0


def test_a_run_collects_garbage_rarely_and_puts_the_thresholds_back(monkeypatch):
    """During a run the cyclic collector runs at the run's thresholds (its young generation every
    50,000 net allocations, not every 700); before and after, at the caller's, also when the run fails."""
    import gc

    from slurm_horus.sim import engine
    from slurm_horus.sim.truth import load_truth

    seen = []
    original = engine.Simulator._run

    def watched(self):
        seen.append(gc.get_threshold())
        return original(self)

    before = gc.get_threshold()
    monkeypatch.setattr(engine.Simulator, "_run", watched)
    trace = [TraceJob(f"j{k}", float(k), 100.0, job_class=sorted(load_truth("gavel:v100").classes)[0]) for k in range(4)]
    result, = run_policies(trace, parse_cluster("1x2:v100"), load_truth("gavel:v100"), ["slurm-default"])
    assert summarize(result)["unfinished"] == 0
    assert seen and seen[0][0] >= engine.RUN_GC_THRESHOLDS[0] and seen[0][2] >= engine.RUN_GC_THRESHOLDS[2]
    assert gc.get_threshold() == before

    def failing(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.Simulator, "_run", failing)
    with pytest.raises(RuntimeError):
        run_policies(trace, parse_cluster("1x2:v100"), load_truth("gavel:v100"), ["slurm-default"])
    assert gc.get_threshold() == before


def test_bench_robust_window_takes_consecutive_jobs_and_the_history_before_them(monkeypatch):
    """bench_robust.py --philly-sample window: n consecutive jobs of the pool (1-GPU, 1 min to 4 h,
    in submit order) from a start drawn by the seed, and as history only the pool's jobs submitted
    before them; random: a draw over the whole pool, the rest its history."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_robust.py"
    spec = importlib.util.spec_from_file_location("bench_robust_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    pool = [TraceJob(f"p{i}", float(1000 - i), 600.0, 1) for i in range(50)]  # listed newest first
    pool.append(TraceJob("short", 5.0, 30.0, 1))  # under a minute: never in the pool
    pool.append(TraceJob("wide", 6.0, 600.0, 3))  # 3 GPUs: not 1-GPU, nor a Philly-mix size
    monkeypatch.setattr(bench, "_PHILLY", pool)
    monkeypatch.setattr(bench, "_SAMPLE", ["window"])
    for seed in (0, 1, 2):
        jobs, history = bench._philly(10, seed, False)
        times = [j.submit_time for j in jobs]
        assert len(jobs) == 10 and times == sorted(times)
        ranks = [int(j.job_id[1:]) for j in jobs]
        assert ranks == list(range(ranks[0], ranks[0] - 10, -1))  # consecutive in submit order
        assert sorted(int(j.job_id[1:]) for j in history) == list(range(ranks[0] + 1, 50))
        assert all(h.submit_time < times[0] for h in history)
    starts = {bench._philly(10, seed, False)[0][0].job_id for seed in range(8)}
    assert len(starts) > 1  # the seed draws the start
    monkeypatch.setattr(bench, "_SAMPLE", ["random"])
    jobs, history = bench._philly(10, 0, False)
    assert len(jobs) == 10 and len(history) == 40
    assert {j.job_id for j in jobs} | {j.job_id for j in history} == {f"p{i}" for i in range(50)}


def test_cli_simulates_a_later_stretch_with_the_earlier_jobs_as_history(tmp_path, capsys):
    """horus simulate --skip-jobs N leaves out the first N jobs (submit order); --history skipped
    gives their run times to the duration estimator (each once it ended), as horusd's store holds a
    site's earlier runs: no job of the stretch then starts on the default estimate. Bad combinations
    are one error line."""
    from slurm_horus.cli import main

    rows = [f"j{i},{i * 50},{300 + (i % 4) * 600},1,{['resnet18-bs64', 'lm-bs20'][i % 2]},u{i % 3}"
            for i in reversed(range(40))]  # listed newest first: skipping goes by submit time
    trace = _generic(tmp_path, rows, header="job_id,submit_time,duration,num_gpus,job_class,user")
    out = {}
    for history in ("none", "skipped"):
        path = tmp_path / f"{history}.json"
        result = CliRunner().invoke(simulate, ["--trace", trace, "--cluster", "1x2:v100", "--policy", "sjf",
                                               "--skip-jobs", "20", "--max-jobs", "15", "--history", history,
                                               "--no-progress", "--json", str(path)])
        assert result.exit_code == 0, result.output
        out[history] = json.loads(path.read_text())
        assert (out[history]["jobs"], out[history]["skipped_jobs"]) == (15, 20)
        assert out[history]["policies"]["sjf"]["jobs"] == 15
    assert out["none"]["history_runs"] == 0 and out["skipped"]["history_runs"] == 20
    cold = out["none"]["durations"]["estimator_error"]["sources"]
    told = out["skipped"]["durations"]["estimator_error"]["sources"]
    assert cold.get("default", 0) > 0 and "default" not in told
    assert "20 earlier runs" in out["skipped"]["durations"]["line"]
    for args, words in ((["--history", "skipped"], ["--skip-jobs"]),
                        (["--skip-jobs", "-1"], ["--skip-jobs"]),
                        (["--skip-jobs", "40"], ["no jobs to simulate", "--skip-jobs"])):
        with pytest.raises(SystemExit) as exit_info:
            main(["simulate", "--trace", trace, "--cluster", "1x2:v100", "--policy", "sjf", "--no-progress"] + args)
        err = capsys.readouterr().err
        assert exit_info.value.code not in (0, None)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert all(word in err for word in words), err
