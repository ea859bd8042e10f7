"""The duration estimator of the placement core (placement/duration.py), and the simulator's use of it."""

import json
import math
import re

import pytest
from click.testing import CliRunner

from slurm_horus.placement import JobRequest
from slurm_horus.placement.duration import (LEVELS, DurationEstimate, DurationEstimator, DurationSettings,
                                            estimate_errors, estimator_from_records, replay_errors)
from slurm_horus.resources import package_data_path
from slurm_horus.sim.cli import simulate
from slurm_horus.sim.traces import read_trace


def test_most_specific_history_first_then_class_user_site():
    est = DurationEstimator()
    est.observe("alice", "resnet", 100.0)
    est.observe("alice", "resnet", 300.0)
    est.observe("alice", "resnet", 200.0)
    est.observe("bob", "bert", 5000.0)
    assert est.estimate("alice", "resnet").seconds == 200.0  # median of alice's resnet runs
    assert est.estimate("alice", "resnet").source == "user+class"
    assert est.estimate("carol", "resnet").source == "class"  # nobody else's class: any user's
    assert est.estimate("carol", "resnet").seconds == 200.0
    found = est.estimate("alice", "bert")
    assert found.source == "class" and found.seconds == 5000.0  # class before user
    assert est.estimate("alice", "gpt").source == "user"
    assert est.estimate("alice", "gpt").seconds == 200.0
    site = est.estimate("dave", "gpt")
    assert site.source == "site" and site.seconds == pytest.approx(250.0)  # median of all four
    assert est.estimate("", "").source == "site"


def test_capped_by_the_time_limit_and_fallbacks_without_history():
    est = DurationEstimator(DurationSettings(default_duration=1800.0))
    assert est.estimate("u", "c").source == "default" and est.estimate("u", "c").seconds == 1800.0
    cold = est.estimate("u", "c", time_limit=600.0)
    assert cold.source == "limit" and cold.seconds == 600.0 and cold.high <= 600.0
    est.observe("u", "c", 900.0)
    capped = est.estimate("u", "c", time_limit=600.0)
    assert capped.seconds == 600.0 and capped.source == "user+class" and capped.high <= 600.0
    assert est.estimate("u", "c", time_limit=3600.0).seconds == 900.0
    assert est.estimate_request(JobRequest("1", "c", user="u", time_limit=300.0)).seconds == 300.0


def test_levels_are_tried_in_the_order_of_their_measured_error():
    """A class that says nothing of run times (drawn at random, as the simulator's classes of a
    Philly job) falls behind the user once each has estimated ``min_scored`` finished jobs; where the
    class decides the run time it stays first. Without ``adaptive`` the order never moves."""
    import numpy as np

    def feed(settings, class_decides):
        rng = np.random.default_rng(3)
        est = DurationEstimator(settings)
        for _ in range(300):
            user, cls = f"u{rng.integers(4)}", f"c{rng.integers(6)}"
            base = 100.0 * 3 ** int((cls if class_decides else user)[1:])
            est.observe(user, cls, float(base * rng.lognormal(0.0, 0.3)))
        return est

    assert DurationSettings().adaptive  # the default since issue 13 (tuning family: docs/placement.md)
    noisy = feed(DurationSettings(adaptive=True), class_decides=False)
    assert noisy.order.index("user") < noisy.order.index("class") and noisy.order[0] == "user"
    scores = noisy.level_scores()
    assert scores["user"] > scores["user+class"] > scores["class"] and scores["order"].startswith("user >")
    assert noisy.estimate("u2", "c5").source == "user" and noisy.reorders >= 1
    assert noisy.estimate("u2", "c5").seconds == pytest.approx(900.0, rel=0.4)  # the user's, not the class's
    informative = feed(DurationSettings(adaptive=True), class_decides=True)
    assert informative.order.index("class") < informative.order.index("user")
    fixed = feed(DurationSettings(adaptive=False), class_decides=False)
    assert fixed.order == LEVELS and fixed.reorders == 0 and fixed.estimate("u2", "c5").source == "user+class"
    late = feed(DurationSettings(adaptive=True, min_scored=10_000), class_decides=False)
    assert late.order == LEVELS  # too few estimates scored to move anything
    with pytest.raises(ValueError):
        DurationSettings(min_scored=0)


def test_recent_runs_only_and_min_runs():
    est = DurationEstimator(DurationSettings(recent=3, min_runs=2))
    est.observe("u", "c", 10.0)
    assert est.estimate("u", "c").source == "default"  # one run is not enough here
    for value in (20.0, 1000.0, 1100.0, 1200.0):
        est.observe("u", "c", value)
    assert est.estimate("u", "c").seconds == 1100.0  # the last three: 1000, 1100, 1200
    with pytest.raises(ValueError):
        DurationSettings(levels=("user", "team"))
    with pytest.raises(ValueError):
        DurationSettings(recent=2, min_runs=3)


def test_recent_by_start_keeps_the_runs_that_started_last():
    """``recent_by="start"``: the median of the runs that started last. A long run that ends after
    shorter ones that started later changes nothing once they fill the window (in end order it would
    displace one of them); a run whose start is unknown counts as the latest; by end (the default)
    the same feed is read in end order."""
    feed = [(60.0, 0.0), (70.0, 100.0), (80.0, 200.0), (90.0, 300.0), (12000.0, 50.0), (13000.0, 60.0)]
    by_start, by_end = (DurationEstimator(DurationSettings(recent=3, recent_by=by)) for by in ("start", "end"))
    for run, start in feed:  # the two long ones started early and end last
        by_start.observe("u", "c", run, start)
        by_end.observe("u", "c", run, start)
    assert by_start.estimate("u", "c").seconds == 80.0  # 70, 80, 90: the three latest starts
    assert by_end.estimate("u", "c").seconds == 12000.0  # 90, 12000, 13000: the three latest ends
    by_start.observe("u", "c", 10.0)  # no start known: the latest
    assert by_start.estimate("u", "c").seconds == 80.0  # 80, 90, 10
    by_start.observe("u", "c", 5.0, 250.0)  # between the kept starts 200 and 300
    assert by_start.estimate("u", "c").seconds == 10.0  # 90, 5, 10 (200 dropped)
    with pytest.raises(ValueError, match="recent_by"):
        DurationSettings(recent_by="submit")


def test_the_simulator_tells_the_estimator_when_each_run_started():
    """The simulator hands the estimator each ended run's start (its end less its run time), as horusd
    reads sacct's Start: on 4 GPUs, two long jobs and six short ones start at 0, 60 and 120; the long
    ones end last. A job arriving after all of them is estimated from the two runs that started last
    (short) with ``recent_by="start"``, from the two that ended last (long) by end."""
    from slurm_horus.sim.engine import SimOptions
    from slurm_horus.sim.run import parse_cluster, run_policies
    from slurm_horus.sim.traces import TraceJob
    from slurm_horus.sim.truth import load_truth

    cls = sorted(load_truth("gavel:v100").classes)[0]
    trace = [TraceJob(f"j{k}", float(k) * 1e-3, 10000.0 if k < 2 else 60.0, job_class=cls, user="u") for k in range(8)]
    trace.append(TraceJob("late", 30000.0, 60.0, job_class=cls, user="u"))
    seen = {}
    for by in ("start", "end"):
        settings = DurationSettings(recent=2, recent_by=by, adaptive=False)
        result, = run_policies(trace, parse_cluster("1x4:v100"), load_truth("gavel:v100"), ["slurm-default"],
                               options=SimOptions(duration_settings=settings, learn_durations_every_s=0))
        seen[by] = next(j for j in result.jobs if j.req.job_id == "late").estimate.seconds
    assert seen == {"start": pytest.approx(60.0), "end": pytest.approx(10000.0)}


def test_records_adapter_reads_start_times_when_the_runs_are_taken_by_start():
    rows = [{"user": "u", "job_class": "c", "elapsed_s": run, "state": "COMPLETED", "n_gpus": 1,
             "start_time": start, "end_time": start + run}
            for run, start in ((100, 1000), (110, 1100), (50000, 0), (120, 1200))]
    assert estimator_from_records(rows, DurationSettings(recent=2, recent_by="start")).estimate("u", "c").seconds == 115.0
    assert estimator_from_records(rows, DurationSettings(recent=2)).estimate("u", "c").seconds == 25060.0


def test_spread_is_narrow_for_steady_jobs_and_wide_for_erratic_or_unknown_ones():
    steady, erratic = DurationEstimator(), DurationEstimator()
    for k in range(10):
        steady.observe("u", "c", 1000.0 + k)
        erratic.observe("u", "c", 10.0 * 3 ** k)
    a, b = steady.estimate("u", "c"), erratic.estimate("u", "c")
    fallback = DurationEstimator().estimate("u", "c")
    assert a.log_sigma < b.log_sigma and a.log_sigma < fallback.log_sigma
    for e in (a, b, fallback):
        assert e.low <= e.seconds <= e.high
        assert e.high / e.seconds == pytest.approx(math.exp(1.2815515655446004 * e.log_sigma))
    one = DurationEstimator()
    one.observe("u", "c", 1000.0)
    assert one.estimate("u", "c").log_sigma > a.log_sigma  # one run says little about the spread
    assert set(a.to_dict()) == {"seconds", "log_sigma", "low", "high", "source", "runs"}


def test_records_adapter_reads_history_rows_in_end_order():
    rows = [
        {"user": "u", "job_class": "c", "elapsed_s": 50, "state": "COMPLETED", "end_time": 30, "n_gpus": 1},
        {"user": "u", "job_class": "c", "elapsed_s": 70, "state": "TIMEOUT", "end_time": 10, "n_gpus": 1},
        {"user": "u", "job_class": "c", "elapsed_s": 900, "state": "NODE_FAIL", "end_time": 40, "n_gpus": 1},
        {"user": "u", "job_class": "c", "elapsed_s": 800, "state": "COMPLETED", "end_time": 50, "n_gpus": 0},
        {"user": "u", "job_class": "c", "elapsed_s": 0, "state": "CANCELLED by 0", "end_time": 60},
        {"user": "u", "job_class": "c", "elapsed_s": "junk", "end_time": 70},
        {"user": "u", "job_class": "c", "elapsed_s": 60, "state": "CANCELLED by 1000", "end_time": 20},
        {"user": "u", "job_class": "c", "elapsed_s": 9000, "state": "COMPLETED", "end_time": None},
    ]
    est = estimator_from_records(rows, DurationSettings(recent=2))
    # the node failure, the CPU job, the unstarted and the junk rows are skipped; no end time: oldest
    assert est.observed == 4
    assert est.estimate("u", "c").seconds == pytest.approx(55.0)  # the two that ended last: 60 and 50
    assert estimator_from_records(rows, gpu_only=False).observed == 5
    # a job on a shard of a GPU (sacct: no whole GPU, one shard) is a GPU job
    shard = {"user": "u", "job_class": "c", "elapsed_s": 40, "state": "COMPLETED", "end_time": 80, "n_gpus": 0,
             "shards": 1}
    assert estimator_from_records(rows + [shard]).observed == 5


def test_error_figures():
    truths = [100.0, 200.0, 400.0, 800.0]
    exact = [DurationEstimate(t, 0.1, t * 0.9, t * 1.1, "user", 3) for t in truths]
    errors = estimate_errors(exact, truths)
    assert errors["mare"] == 0.0 and errors["within_2x"] == 1.0 and errors["rank_corr"] == pytest.approx(1.0)
    assert errors["coverage_80"] == 1.0 and errors["sources"] == {"user": 1.0}
    wrong = [DurationEstimate(s, 0.1, s * 0.9, s * 1.1, "site", 1) for s in (1600.0, 800.0, 50.0, 25.0)]
    errors = estimate_errors(wrong, truths)
    assert errors["rank_corr"] == pytest.approx(-1.0) and errors["within_2x"] == 0.0
    assert errors["mare"] == pytest.approx((0.96875 + 3.0) / 2)  # |e-t|/t: 15, 3, 0.875, 0.96875
    assert errors["coverage_80"] == 0.0 and errors["median_log_ratio"] == pytest.approx(math.log(4 / 8) / 2)
    assert estimate_errors([], []) == {"jobs": 0}


def test_error_on_the_shipped_philly_sample_beats_constant_and_site_wide_guesses():
    """Measured on slurm_horus/data/philly_sample.csv (800 Philly jobs; user = virtual cluster, no class):
    median absolute relative error 0.085, rank correlation 0.36, 88 % within 2x, 95 % in [low, high]."""
    jobs = read_trace(str(package_data_path("philly_sample.csv")), "philly")
    rows = [(j.submit_time, j.duration, j.user, "", None) for j in jobs]
    ours, estimates = replay_errors(rows)
    site, _ = replay_errors(rows, DurationSettings(levels=("site",)))
    constant = estimate_errors([DurationEstimator().estimate()] * len(rows), sorted(j.duration for j in jobs))
    assert ours["mare"] < 0.15 < site["mare"] < constant["mare"]
    assert ours["rank_corr"] > site["rank_corr"] + 0.05
    assert ours["within_2x"] > 0.8 and ours["coverage_80"] >= 0.8
    assert estimates[0].source == "default" and ours["sources"]["user"] > 0.95


def _run(args, tmp_path):
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(simulate, args + ["--json", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())


def test_simulate_estimates_durations_by_default_and_oracle_only_when_asked(tmp_path):
    trace = tmp_path / "t.csv"
    lines = ["submit_time,duration,num_gpus,job_class,user"]
    lines += [f"{10 * k},{100 + 400 * (k % 2)},1,resnet50-bs64,u{k % 2}" for k in range(30)]
    trace.write_text("\n".join(lines) + "\n")
    base = ["--trace", str(trace), "--cluster", "1x2:v100", "--policy", "sjf,oracle"]
    output, est = _run(base, tmp_path)
    assert est["durations"]["mode"] == "estimated" and est["durations"]["true_durations"] == ["oracle"]
    assert "no time limit in the trace" in est["durations"]["time_limits"] and "3600 s (--default-duration)" in output
    sjf = est["policies"]["sjf"]
    assert sjf["durations"] == "estimated" and sjf["duration_mare"] == sjf["estimator"]["mare"]
    assert sjf["estimator"]["mean_abs_rel_error"] > 0  # the first jobs started on the default guess
    assert est["policies"]["oracle"]["durations"] == "oracle" and est["policies"]["oracle"]["duration_mare"] == 0
    assert "dur.err" in output and "exact" in output
    assert re.search(r"levels at the end (user\+class|class|user|site)( > (user\+class|class|user|site)){3}", output)
    assert len(sjf["estimator"]["order"].split(" > ")) == 4
    # the default: the settings' order to start with, then the measured one
    assert "(median of recent runs: user+class > class > user > site to start with, then the order the " \
           "levels' estimates earned, capped" in output
    assert est["learning"] == {"pairs_every_s": 300.0, "durations_every_s": 300.0}  # horusd's feed
    fixed, _ = _run(base + ["--duration-levels", "fixed"], tmp_path)
    assert "(median of recent runs: user+class > class > user > site, capped" in fixed and "to start with" not in fixed
    sources = est["policies"]["sjf"]["estimator"]["sources"]
    assert sources.get("default", 0) > 0 and sources.get("user+class", 0) > 0  # learned as jobs ended
    _, told = _run(base + ["--durations", "oracle"], tmp_path)
    assert told["durations"]["mode"] == "oracle" and told["policies"]["sjf"]["duration_mare"] == 0
    assert told["policies"]["oracle"] == {**est["policies"]["oracle"]}  # the oracle knew them anyway
    assert told["policies"]["sjf"]["mean_jct"] != est["policies"]["sjf"]["mean_jct"]
    # one policy told the true durations by its explicit oracle option; the others still estimate
    output, one = _run(["--trace", str(trace), "--cluster", "1x2:v100", "--policy", "sjf,sjf/oracle_durations=true"],
                       tmp_path)
    assert one["durations"]["true_durations"] == ["sjf/oracle_durations=true"] and "true durations: sjf/" in output
    assert one["policies"]["sjf"] == est["policies"]["sjf"]
    assert one["policies"]["sjf/oracle_durations=true"]["mean_jct"] == told["policies"]["sjf"]["mean_jct"]


def test_time_limits_cap_the_estimates(tmp_path):
    from slurm_horus.placement import NodeGroup
    from slurm_horus.sim.engine import SimOptions
    from slurm_horus.sim.run import run_policies
    from slurm_horus.sim.truth import load_truth

    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,job_class,time_limit\n"
                     "0,500,1,resnet50-bs64,200\n0,500,1,resnet50-bs64,\n")
    jobs = read_trace(str(trace), "generic")
    assert [j.time_limit for j in jobs] == [200.0, None]
    groups = [NodeGroup(1, 2, "v100", 16384.0)]
    result = run_policies(jobs, groups, load_truth("gavel:v100"), ["sjf"], options=SimOptions(time_limit=300.0))[0]
    assert [(j.estimate.source, j.estimate.seconds) for j in result.jobs] == [("limit", 200.0), ("limit", 300.0)]
    output, payload = _run(["--trace", str(trace), "--cluster", "1x2:v100", "--policy", "sjf",
                            "--time-limit", "300"], tmp_path)
    assert "1 of 2 jobs have no time limit in the trace: they get --time-limit 300 s" in output


@pytest.mark.parametrize("args,message", [
    (["--time-limit", "-5"], "--time-limit must be positive"),
    (["--default-duration", "0"], "--default-duration must be positive"),
    (["--durations", "perfect"], "Invalid value for '--durations'"),
    (["--bad-limit"], "t.csv:3: time_limit='soon' is not a number"),
])
def test_bad_duration_options_and_limits_give_one_line(tmp_path, capsys, args, message):
    from slurm_horus.cli import main
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,time_limit\n0,5,1,60\n" + ("0,5,1,soon\n" if "--bad-limit" in args else ""))
    args = [a for a in args if a != "--bad-limit"]
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--trace", str(trace), "--policy", "sjf", "--no-progress"] + args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_feed_of_run_times_re_estimates_the_queue_once_as_one_by_one(adaptive):
    """The simulator hands a feed's run times over together (``observe_many``): each waiting group is
    re-estimated once, after the last run, and the queue ends as after the runs one by one — the same
    estimates, spreads and SJF order — having re-timed fewer jobs."""
    import numpy as np

    from slurm_horus.placement.cycle import PendingQueue
    from slurm_horus.placement.duration import QueueEstimates
    from slurm_horus.placement.policies import SJF

    rng = np.random.default_rng(13)
    settings = DurationSettings(recent=3, adaptive=adaptive, min_scored=5)
    one, many = (QueueEstimates(DurationEstimator(settings), PendingQueue(SJF())) for _ in range(2))
    users, classes = ["u0", "u1", "u2", ""], ["a", "b", "c", ""]
    moved_one = moved_many = 0
    for step in range(150):
        for k in range(int(rng.integers(0, 6))):
            fields = dict(job_id=f"j{step}.{k}", job_class=str(rng.choice(classes)), user=str(rng.choice(users)),
                          submit_time=step, time_limit=float(rng.choice([0, 500, 5000])) or None)
            one.add(JobRequest(**fields))
            many.add(JobRequest(**fields))
        if len(one.queue) > 3 and rng.random() < 0.5:
            job_id = next(iter(one.queue)).job_id  # the first job starts
            one.queue.remove(job_id)
            many.queue.remove(job_id)
        feed = [(str(rng.choice(users)), str(rng.choice(classes)), float(rng.uniform(10, 9000)))
                for _ in range(int(rng.integers(0, 5)))]
        moved_one += sum(one.observe(*run) for run in feed)
        moved_many += many.observe_many(feed)
        assert [(r.job_id, r.expected_duration(), r.duration_spread()) for r in one.queue] == \
            [(r.job_id, r.expected_duration(), r.duration_spread()) for r in many.queue], step
        assert many.queue.work == pytest.approx(one.queue.work)
    assert one.estimator.reorders == many.estimator.reorders and (not adaptive or many.estimator.reorders >= 1)
    assert 0 < moved_many < moved_one


def test_a_fifo_queue_shares_one_estimate_per_group_and_hands_it_to_a_job_that_leaves():
    """A queue whose order reads no duration (FIFO) carries one estimate per group of waiting jobs:
    a new estimate is one assignment for all of them. Every waiting job still reads what the
    estimator says now (the same check as for an SJF queue), the queue's total follows, and a job
    that leaves keeps the estimate it had then, not the group's later ones."""
    import numpy as np

    from slurm_horus.placement.cycle import PendingQueue
    from slurm_horus.placement.duration import QueueEstimates
    from slurm_horus.placement.policies import SlurmDefault

    rng = np.random.default_rng(12)
    estimator = DurationEstimator(DurationSettings(recent=3, adaptive=True))
    queue = PendingQueue(SlurmDefault())
    assert queue.fixed_keys
    tracker = QueueEstimates(estimator, queue)
    users, classes = ["u0", "u1", "u2", ""], ["a", "b", "c", ""]
    left = []
    moved = 0
    for step in range(400):
        action = rng.random()
        if action < 0.5:
            req = JobRequest(f"j{step}", str(rng.choice(classes)), user=str(rng.choice(users)), submit_time=step,
                             time_limit=float(rng.choice([0, 500, 5000])) or None, gpus_per_node=int(rng.choice([1, 2])))
            tracker.add(req)
        elif action < 0.7 and len(queue):
            starts = list(queue)[int(rng.integers(len(queue)))]  # a job starts
            now = (starts.expected_duration(), starts.duration_spread())
            gone = queue.remove(starts.job_id)
            assert gone.shared_estimate is None and (gone.predicted_duration, gone.duration_sigma) == now
            left.append((gone, now[0]))
        else:
            moved += tracker.observe(str(rng.choice(users)), str(rng.choice(classes)), float(rng.uniform(10, 9000)))
        for req in queue:
            assert req.expected_duration() == estimator.estimate_request(req).seconds, (step, req)
            assert req.duration_spread() == estimator.seconds_spread(req.user, req.job_class, req.time_limit)[2]
        assert [r.job_id for r in queue] == [r.job_id for r in sorted(queue, key=lambda r: (r.submit_time, r.job_id))]
        assert queue.work == pytest.approx(sum(r.expected_duration() * r.n_gpus for r in queue))
    assert moved > 50 and len(queue) > 10 and len(left) > 30
    assert all(req.expected_duration() == seconds for req, seconds in left)  # not the group's later estimates
    assert estimator.reorders >= 2


def test_waiting_jobs_keep_the_current_estimate_and_their_queue_place():
    """QueueEstimates re-estimates only the jobs a finished run can change; the result must be what
    re-estimating the whole queue after every end gives (random users, classes and runs), and each
    waiting job carries its estimate's current spread (horus weighs it)."""
    import numpy as np

    from slurm_horus.placement.cycle import PendingQueue
    from slurm_horus.placement.duration import QueueEstimates
    from slurm_horus.placement.policies import SJF

    rng = np.random.default_rng(11)
    estimator = DurationEstimator(DurationSettings(recent=3, adaptive=True))
    queue = PendingQueue(SJF())
    tracker = QueueEstimates(estimator, queue)
    users, classes = ["u0", "u1", "u2", ""], ["a", "b", "c", ""]
    moved = 0
    for step in range(400):
        action = rng.random()
        if action < 0.5:
            req = JobRequest(f"j{step}", str(rng.choice(classes)), user=str(rng.choice(users)), submit_time=step,
                             time_limit=float(rng.choice([0, 500, 5000])) or None)
            tracker.add(req)
        elif action < 0.7 and len(queue):
            queue.remove(list(queue)[int(rng.integers(len(queue)))].job_id)  # a job starts
        else:
            moved += tracker.observe(str(rng.choice(users)), str(rng.choice(classes)), float(rng.uniform(10, 9000)))
        for req in queue:
            assert req.predicted_duration == estimator.estimate_request(req).seconds, (step, req)
            assert req.duration_sigma == estimator.seconds_spread(req.user, req.job_class, req.time_limit)[2]
        assert [r.job_id for r in queue] == [r.job_id for r in sorted(queue, key=SJF().queue_key)]
    assert moved > 50 and len(queue) > 10
    assert estimator.reorders >= 2  # the levels changed places (every group estimated again) and still equal
