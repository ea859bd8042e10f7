"""``horus replay``: sacct records to the simulator's metrics, and a real replay on local clusters."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_horus.localcluster import LocalCluster
from slurm_horus.localcluster.procs import marked_processes, pid_alive
from slurm_horus.replay.cli import parse_replay_cluster
from slurm_horus.replay.live import LiveJob, LiveRun, measure_cadence, summarize_live
from slurm_horus.replay.workload import offered_load, philly_like, write_generic
from slurm_horus.sim.traces import TraceJob
from slurm_horus.sim.truth import load_truth

TRUTH = load_truth("gavel:v100")
HORUS = [sys.executable, "-m", "slurm_horus"]


def _row(job_id, cls, submit, start, end, gpu, node="n1", state="COMPLETED"):
    return {"job_id": job_id, "job_class": cls, "submit_time": submit, "start_time": start, "end_time": end,
            "state": state, "nodes": node, "gpu_indices": str(gpu), "n_gpus": 1, "shards": 0}


def test_live_figures_are_the_simulators_metrics_in_trace_seconds():
    """Two jobs of a bad pair share GPU 0 for 4 s of wall time, a third runs alone; speedup 100."""
    t0 = 1000.0
    traces = [TraceJob("a", 0.0, 500.0, job_class="resnet50-bs64"), TraceJob("b", 100.0, 300.0, job_class="lm-bs20"),
              TraceJob("c", 100.0, 200.0, job_class="lm-bs20")]
    jobs = [LiveJob(i, t, attempts=[10 + i]) for i, t in enumerate(traces)]
    rows = {10: _row(10, "resnet50-bs64", 1000, 1001, 1008, 0), 11: _row(11, "lm-bs20", 1001, 1002, 1006, 0),
            12: _row(12, "lm-bs20", 1001, 1003, 1005, 1)}
    run = LiveRun("horus", jobs, rows, t0=t0, start=0.0, speedup=100.0, n_gpus=2)
    s = summarize_live(run, TRUTH, "v100")
    # sacct seconds move to the middle of their second: end of the last job = (1008.5 - 1000) x 100
    assert s["makespan"] == pytest.approx(850.0)
    assert s["mean_jct"] == pytest.approx((800 + 500 + 400) / 3)
    assert s["mean_queueing_delay"] == pytest.approx((100 + 100 + 200) / 3)
    # a and b shared GPU 0 for 4 s (400 trace-s) each; lm-bs20 next to resnet50-bs64 keeps 0.38 (< 0.85)
    run_time = 700 + 400 + 200
    assert s["shared_share"] == pytest.approx(800 / run_time)
    bad = 400 * (TRUTH.pair("v100", "resnet50-bs64", "lm-bs20") < 0.85) + 400
    assert s["bad_pair_share"] == pytest.approx(bad / run_time)
    # GPU 0 busy 1001..1008, GPU 1 1003..1005: 9 s of 2 GPUs x 8.5 s
    assert s["gpu_allocation_ratio"] == pytest.approx(900 / (2 * 850))
    assert s["jobs"] == 3 and s["unfinished"] == 0


def test_a_failed_last_attempt_is_unfinished_and_an_oom_retry_counts():
    traces = [TraceJob("a", 0.0, 100.0, job_class="a3c")]
    jobs = [LiveJob(0, traces[0], attempts=[5, 6], oom_attempts=1)]
    rows = {5: _row(5, "a3c", 1000, 1000, 1001, 0, state="FAILED"), 6: _row(6, "a3c", 1002, 1002, 1004, 0)}
    s = summarize_live(LiveRun("horus", jobs, rows, 1000.0, 0.0, 10.0, 1), TRUTH, "v100")
    assert s["oom_events"] == 1 and s["unfinished"] == 0
    assert s["mean_jct"] == pytest.approx(40.0)  # first submit to the end of the last attempt
    rows[6]["state"] = "FAILED"
    assert summarize_live(LiveRun("horus", jobs, rows, 1000.0, 0.0, 10.0, 1), TRUTH, "v100")["unfinished"] == 1


def test_the_live_cadence_is_read_from_sacct():
    """GPU 0: a (alone, 2 s of work) ends at 1004; b, submitted at 1001, starts there at 1005 (1 s
    late); c shares GPU 1 with d. Speedup 100: 200 trace-s of work is 2 s."""
    traces = [TraceJob(n, 0.0, 200.0, job_class="a3c") for n in "abcd"]
    jobs = [LiveJob(i, t, attempts=[10 + i]) for i, t in enumerate(traces)]
    rows = {10: _row(10, "a3c", 1000, 1002, 1004, 0), 11: _row(11, "a3c", 1001, 1005, 1008, 0),
            12: _row(12, "a3c", 1000, 1000, 1003, 1), 13: _row(13, "a3c", 1000, 1001, 1004, 1)}
    cadence = measure_cadence(LiveRun("horus", jobs, rows, 1000.0, 0.0, 100.0, 2))
    # only b waited (a started 2 s after its submission but after no end on its GPU)
    assert cadence["end_to_cycle_s"] == 1.0 and cadence["queued_starts"] == 1
    # a and b ran alone: 2 s and 3 s in sacct for 2 s of work each
    assert cadence["launch_s"] == 0.5 and cadence["jobs_alone"] == 2


def test_cluster_spec_and_workload():
    assert parse_replay_cluster("2x4", "v100") == (2, 4, "v100")
    assert parse_replay_cluster("1x2:P100", "v100") == (1, 2, "p100")
    with pytest.raises(Exception, match="NODESxGPUS"):
        parse_replay_cluster("4", "v100")
    jobs = philly_like(40, load=1.5, n_gpus=8, seed=3)
    assert len(jobs) == 40 and offered_load(jobs, 8) == pytest.approx(1.5)
    assert all(60 <= j.duration <= 3600 and j.num_gpus == 1 for j in jobs)
    assert philly_like(40, load=1.5, n_gpus=8, seed=3)[7].duration == jobs[7].duration  # seeded


def test_bad_input_gives_one_line(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus\n0,60,1\n")
    for args, words in ((["--cluster", "2"], "NODESxGPUS"), (["--policy", "oracle"], "oracle"),
                        (["--policy", "horus,horus-risk/oracle_pairs=true"], "horus-risk/oracle_pairs=true"),
                        (["--speedup", "0"], "speedup")):
        result = subprocess.run(HORUS + ["replay", "--trace", str(trace), *args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr


# ---- real replays ------------------------------------------------------------------------------------

@pytest.fixture
def clusters():
    """A directory for the replay's clusters (munged wants every directory above its socket o+x,
    which pytest's tmp_path is not)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="horus-replay-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _trace(tmp_path, n=6):
    jobs = philly_like(n, load=1.5, n_gpus=2, min_s=60, max_s=600, seed=1)
    path = tmp_path / "trace.csv"
    write_generic(jobs, path)
    return path


def test_replay_on_real_slurm_beside_the_simulator(tmp_path, clusters):
    """Plain Slurm and horusd, each on its own local cluster (1 node x 2 fake GPUs, slurmdbd)."""
    out = tmp_path / "replay.json"
    report = tmp_path / "replay.html"
    result = subprocess.run(
        HORUS + ["replay", "--trace", str(_trace(tmp_path)), "--cluster", "1x2", "--policy", "slurm-default,horus",
                 "--speedup", "100", "--json", str(out), "--report", str(report),
                 "--history-dir", str(tmp_path / "history"), "--work-dir", str(clusters)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert set(payload["policies"]) == {"slurm-default", "horus"}
    for name, entry in payload["policies"].items():
        live, sim = entry["live"], entry["sim"]
        assert live["jobs"] == sim["jobs"] == 6 and live["unfinished"] == 0
        for key in ("makespan", "mean_jct", "median_jct", "p99_jct", "mean_queueing_delay", "shared_share"):
            assert key in live and key in sim
        # in trace seconds: Slurm cannot beat the simulator's instant scheduling by much, and costs at
        # most ~2 s of wall time per job (its 1 s scheduling passes, start, a loaded machine); how close
        # live and simulated runs are is measured by bench/bench_replay.py, not here
        assert 0.9 * sim["makespan"] <= live["makespan"] <= sim["makespan"] + 6 * 2.0 * 100, (name, live, sim)
    assert payload["policies"]["slurm-default"]["live"]["shared_share"] == 0.0
    for entry in payload["policies"].values():  # the cadence the simulator was told, and the one measured
        assert entry["cadence"]["told_sim"]["end_to_cycle_s"] > 0 and entry["sim_ideal"]["jobs"] == 6
        assert entry["cadence"]["measured"]["launch_s"] is not None
    assert "live/sim" in result.stdout and "slurm-default" in result.stdout
    assert "<svg" in report.read_text()
    assert "slurm-default: " in result.stderr  # progress on stderr
    # each cluster was stopped: nothing of it runs any more
    for directory in clusters.iterdir():
        state = LocalCluster.read_state(directory)
        assert not any(pid_alive(d["pid"]) for d in state["daemons"])
        assert not marked_processes(str(directory.resolve()))
    # the history: sacct with the jobs' declared solo time, and horusd's decisions
    import sqlite3

    db = sqlite3.connect(tmp_path / "history" / "horus.db")
    assert db.execute("SELECT count(*) FROM jobs WHERE comment LIKE '%solo_s=%'").fetchone()[0] == 6
    assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] > 0


def test_ctrl_c_stops_every_daemon_the_replay_started(tmp_path, clusters):
    process = subprocess.Popen(
        HORUS + ["replay", "--trace", str(_trace(tmp_path, 12)), "--cluster", "1x2", "--policy", "horus",
                 "--speedup", "20", "--work-dir", str(clusters), "--history-dir", str(tmp_path / "h")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a suite started in the background (`make test &`) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: give the replay the terminal's default, as Ctrl-C finds it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    state_file = clusters / "horus" / "cluster.json"
    while time.time() < deadline:
        if state_file.exists() and any(d["name"] == "horusd" for d in json.loads(state_file.read_text())["daemons"]):
            break
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    time.sleep(3)  # jobs are being submitted and run
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=120)
    assert process.returncode != 0 and "Traceback" not in err, err[-2000:]
    state = LocalCluster.read_state(clusters / "horus")
    assert not any(pid_alive(d["pid"]) for d in state["daemons"])
    assert not marked_processes(str((clusters / "horus").resolve()))
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_collector_of(p, clusters)]


def _is_collector_of(pid, clusters):
    try:
        return str(clusters) in Path(f"/proc/{pid}/cmdline").read_text() and "collect" in Path(
            f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def test_the_replays_simulator_is_told_horusds_slowdown_limit(monkeypatch):
    """horusd's cycle refuses pairs over slowdown_limit (1.5 by default, as the replay runs it): the
    simulator beside a horusd run must apply the same limit, plain Slurm none."""
    import slurm_horus.sim.run as sim_run
    from slurm_horus.replay import run as replay_run

    seen = {}
    monkeypatch.setattr(sim_run, "run_policies", lambda jobs, groups, truth, policies, **kw:
                        seen.setdefault(policies[0], kw["options"]) and [None])
    setup = replay_run.ReplaySetup.__new__(replay_run.ReplaySetup)
    setup.__dict__.update(nodes=1, gpus=2, gpu_type="v100", oom_penalty=0.0, speedup=100.0, jobs=[],
                          truth=None, knowledge=replay_run.KNOWLEDGE)
    for policy in ("slurm-default", "horus"):
        replay_run.run_sim(setup, policy)
    assert seen["slurm-default"].max_slowdown is None and seen["horus"].max_slowdown == 1.5
    assert seen["horus"].durations == "limit"
    assert seen["horus"].learn_pairs_every_s == math.inf  # no refit during a replay: no pair learned
