"""Fractional GPUs, CPUs and host memory in the placement core; FGD's fragmentation and policies;
the simulator's no-departure protocol (issue 21). Small made-up clusters, never the shared data."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_horus.placement import ClassIndex, JobRequest, RunningJob
from slurm_horus.placement.fragmentation import FragmentationModel, Shape, typical_shapes
from slurm_horus.placement.policies import POLICY_NAMES, PolicyModels, make_policy
from slurm_horus.placement.state import ClusterState
from slurm_horus.sim.cli import simulate

PRIOR = {Shape(500, 1, 4000): 3, Shape(250, 1, 8000): 2, Shape(0, 1, 12000): 4, Shape(0, 2, 16000): 1,
         Shape(300, 1, 2000, ("t4",)): 1}


def cluster(cap=1000):
    state = ClusterState()
    for k in range(6):
        state.add_node(f"n{k}", "t4" if k % 2 else "v100", [2, 4, 8][k % 3], 16000, gpu_cap=cap,
                       cpu_milli=[16000, 64000][k % 2], memory_mib=65536)
    state.build()
    return state


def models():
    from slurm_horus.interference import build_model
    return PolicyModels(ClassIndex(), lambda kind: build_model("utilization"))


def fill_randomly(state, seed=3, n=25):
    rng = np.random.default_rng(seed)
    for j in range(n):
        g = int(rng.integers(state.n_gpus))
        units = int(rng.choice([100, 250, 500]))
        if state.gpu_left()[g] >= units and state.node_room(4000, 0)[state.gpu_node[g]]:
            state.place(RunningJob(f"r{seed}-{j}", "x", (g,), 0, 1, gpu_units=units, cpu_milli=4000))


def recomputed_delta(state, req, g):
    """The increase of fragmentation by placing ``req`` on GPU ``g``, from scratch (fresh models)."""
    before = FragmentationModel(PRIOR).total(state)
    gpus = (g,)
    if req.n_gpus > 1:
        node = state.nodes[state.gpu_node[g]]
        gpus = tuple([x for x in range(node.first_gpu, node.first_gpu + node.n_gpus)
                      if state.gpu_njobs[x] == 0][:req.n_gpus])
    state.place(RunningJob("probe", "x", gpus, 0, 1, gpu_units=req.gpu_units, cpu_milli=req.cpu_milli,
                           exclusive=req.exclusive))
    after = FragmentationModel(PRIOR).total(state)
    state.release("probe")
    return after - before


@pytest.mark.parametrize("req", [JobRequest("a", "x", gpu_units=250, cpu_milli=3000),
                                 JobRequest("b", "x", exclusive=True, cpu_milli=12000),
                                 JobRequest("c", "x", gpus_per_node=2, exclusive=True, cpu_milli=1000)])
def test_incremental_delta_equals_recomputing_the_fragmentation(req):
    state = cluster()
    fill_randomly(state)
    model = FragmentationModel(PRIOR)
    model.total(state)  # the cache, then kept current by node_version
    fill_randomly(state, seed=4, n=10)
    need = req.gpu_units or state.gpu_cap[0]
    candidates = np.array([g for g in range(state.n_gpus) if state.gpu_left()[g] >= need
                           and (req.n_gpus == 1 or state.node_free[state.gpu_node[g]] >= req.n_gpus)])
    assert len(candidates) > 3
    fast = model.delta_for(state, req, candidates)
    slow = np.array([recomputed_delta(state, req, int(g)) for g in candidates])
    assert np.allclose(fast, slow)
    assert len(set(np.round(slow, 6))) > 1  # the case tells placements apart


def test_fragment_definition_on_one_node():
    state = ClusterState()
    state.add_node("a", "t4", 2, 16000, cpu_milli=8000)
    state.build()
    model = FragmentationModel({Shape(500, 1, 1000): 1, Shape(0, 1, 1000): 1})
    assert model.total(state) == 0.0
    state.place(RunningJob("j", "x", (0,), 0, 1, gpu_units=300))
    # a whole GPU cannot use GPU 0's 700 milli: half the workload sees 700 fragmented
    assert model.total(state) == pytest.approx(350.0)
    state.place(RunningJob("k", "x", (1,), 0, 1, gpu_units=100, cpu_milli=8000))
    # no CPU left: every free milli is a fragment for every shape
    assert model.total(state) == pytest.approx(700 + 900)


def test_typical_shapes_cover_95_percent_and_leave_cpu_only_out():
    counts = {Shape(0, 0, 1000): 50, Shape(500, 1): 60, Shape(0, 1): 30, Shape(250, 1): 8, Shape(0, 8): 2}
    shapes = typical_shapes(counts)
    assert [s for s, _ in shapes] == [Shape(500, 1), Shape(0, 1), Shape(250, 1)]  # 98 of 100 GPU requests
    assert sum(p for _, p in shapes) == pytest.approx(1.0)


ALL = [p for p in POLICY_NAMES if p not in ("oracle",)]


@pytest.mark.parametrize("name", ALL)
def test_every_policy_respects_capacity_cpus_and_whole_gpus(name):
    policy = make_policy(name, models())
    state = cluster(cap=8)
    rng = np.random.default_rng(1)
    placed = 0
    for k in range(120):
        kind = rng.integers(4)
        if kind == 0:
            req = JobRequest(f"w{k}", "unknown", exclusive=True, cpu_milli=4000)
        elif kind == 1:
            req = JobRequest(f"c{k}", "unknown", gpus_per_node=0, cpu_milli=6000)
        else:
            req = JobRequest(f"f{k}", "unknown", gpu_units=int(rng.integers(1, 8)), cpu_milli=2000, memory_mib=4096)
        decision = policy.decide(state, req)
        if decision.placed:
            state.place(policy.running_job(req, decision, 0.0))
            placed += 1
    assert placed > 20
    assert (state.gpu_used <= state.gpu_cap).all()
    assert (state.node_cpu_used <= state.node_cpu_total).all()
    assert (state.node_mem_used <= state.node_mem_total).all()
    for job in state.jobs.values():
        if job.exclusive:  # a whole GPU is nobody else's
            assert all(state.gpu_jobs[g] == [job.job_id] for g in job.gpus)


def test_time_shared_gpus_and_fractions_do_not_mix():
    policy = make_policy("horus", models())
    state = ClusterState()
    state.add_node("a", "v100", 1, 16384)
    state.build()
    state.place(RunningJob("plain", "resnet50-bs64", (0,), 0, 100))  # interference-shared model
    assert not policy.decide(state, JobRequest("f", "lm-bs20", gpu_units=100)).placed
    state.release("plain")
    state.place(RunningJob("frac", "x", (0,), 0, 100, gpu_units=100))
    assert not policy.decide(state, JobRequest("p", "lm-bs20", predicted_duration=10)).placed
    assert policy.decide(state, JobRequest("f2", "lm-bs20", gpu_units=900)).placed
    assert not policy.decide(state, JobRequest("f3", "lm-bs20", gpu_units=901)).placed


def test_fgd_keeps_whole_gpus_whole_where_first_fit_does_not():
    state = ClusterState()
    state.add_node("a", "t4", 2, 16000)
    state.build()
    state.place(RunningJob("half", "x", (1,), 0, 1, gpu_units=500))
    m = models()
    m.workload = {Shape(500, 1): 1, Shape(0, 1): 1}
    req = JobRequest("j", "unknown", gpu_units=500)
    assert make_policy("slurm-default", m).decide(state, req).gpus == {"a": [0]}
    for name in ("fgd", "horus", "bestfit", "packing"):
        assert make_policy(name, m).decide(state, req).gpus == {"a": [1]}, name


def test_cpu_only_requests_take_a_node_with_cpus():
    policy = make_policy("fgd", models())
    state = ClusterState()
    state.add_node("small", "t4", 1, 16000, cpu_milli=2000)
    state.add_node("big", "t4", 1, 16000, cpu_milli=16000)
    state.build()
    decision = policy.decide(state, JobRequest("c", "unknown", gpus_per_node=0, cpu_milli=8000))
    assert decision.placed and decision.nodes == ["big"] and decision.gpu_ids == ()
    state.place(policy.running_job(JobRequest("c", "unknown", gpus_per_node=0, cpu_milli=8000), decision, 0))
    assert state.node_cpu_used.tolist() == [0.0, 8000.0]
    assert not policy.decide(state, JobRequest("d", "unknown", gpus_per_node=0, cpu_milli=9000)).placed


def write_fgd_files(tmp_path, n=300):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{k},{[32000, 96000][k % 2]},262144,{[2, 8][k % 2]},{['T4', 'G2'][k % 2]}\n" for k in range(10))
        + "cpu0,64000,262144,0,nan\n")
    rng = np.random.default_rng(0)
    rows = []
    for k in range(n):
        kind = rng.integers(10)
        gpus, milli, cpu = (0, 0, 4000) if kind == 0 else (1, int(rng.choice([250, 460, 500])), 4000) if kind < 5 \
            else (2, 1000, 8000) if kind == 5 else (1, 1000, 8000)
        rows.append(f"p{k},{cpu},1024,{gpus},{milli},,LS,Running,{k},{k + 10},{k}\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\n" + "".join(rows))
    return str(nodes), str(pods)


def test_cli_no_departure_inflates_and_reports(tmp_path):
    nodes, pods = write_fgd_files(tmp_path)
    out, html = tmp_path / "out.json", tmp_path / "r.html"
    result = CliRunner().invoke(simulate, [
        "--trace", pods, "--cluster", nodes, "--no-departure", "--inflate", "1.3", "--shuffle-seed", "2",
        "--policy", "fgd,random,horus", "--truth", "none", "--gpu-memory-mb", "G2=32768",
        "--json", str(out), "--report", str(html), "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["cluster_gpus"] == 50
    for name, s in data["policies"].items():
        assert s["arrived_gpu_pct"] >= 130.0 and s["arrived_gpu_pct"] < 135.0
        assert 50.0 < s["allocated_gpu_pct"] <= 100.0 and s["over_capacity_gpus"] == 0
        assert s["failed"] > 0 and s["placed"] + s["failed"] == data["requests"]
        curve = s["allocation_curve"]
        assert [a for a, _ in curve][:130] == list(range(1, 131))
        assert all(b2 >= b1 for (_, b1), (_, b2) in zip(curve, curve[1:]))  # nothing departs
        assert curve[-1][1] == pytest.approx(s["allocated_gpu_pct"], abs=0.01)
        assert 0.0 <= s["fragmentation_pct"] <= 100.0 - s["allocated_gpu_pct"] + 1e-6
    assert data["policies"]["fgd"]["allocated_gpu_pct"] >= data["policies"]["random"]["allocated_gpu_pct"]
    assert "<svg" in html.read_text()


@pytest.mark.parametrize("args,message", [
    (["--inflate", "1.3"], "--inflate and --shuffle-seed go with --no-departure"),
    (["--no-departure", "--inflate", "-1"], "--inflate must be positive"),
    (["--no-departure", "--gpu-memory-mb", "G2"], "--gpu-memory-mb: expected TYPE=MB"),
])
def test_cli_no_departure_bad_options(tmp_path, args, message):
    nodes, pods = write_fgd_files(tmp_path, 20)
    result = CliRunner().invoke(simulate, ["--trace", pods, "--cluster", nodes, "--truth", "none",
                                           "--gpu-memory-mb", "G2=32768", "--policy", "fgd"] + args)
    assert result.exit_code != 0 and message in result.output + str(result.exception)


def test_node_list_errors_name_file_and_line(tmp_path):
    from slurm_horus.errors import InputError
    from slurm_horus.sim.run import parse_cluster
    bad = tmp_path / "n.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1000,2,T4\na,1000,1000,2,T4\n")
    with pytest.raises(InputError, match="n.csv:3: duplicate node name 'a'"):
        parse_cluster(str(bad))
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1000,2,nan\n")
    with pytest.raises(InputError, match="n.csv:2: node a has 2 GPUs but no model"):
        parse_cluster(str(bad))
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1000,2,Z9\n")
    with pytest.raises(InputError, match="n.csv:2: unknown GPU type 'z9'"):
        parse_cluster(str(bad))


def test_typical_shapes_with_cpu_only_shapes_and_fgd_tie_order():
    counts = {Shape(0, 0, 8000): 40, Shape(500, 1, 4000): 40, Shape(500, 1, 6000): 10, Shape(0, 1, 4000): 10,
              Shape(250, 1, 2000): 1}
    gpu_only = [s for s, _ in typical_shapes(counts)]
    assert Shape(0, 0, 8000) not in gpu_only
    with_cpu = typical_shapes(counts, include_cpu=True)
    # equal counts in FGD's order, the larger request first: 8 CPUs before 4, 6 CPUs before 4
    assert [s for s, _ in with_cpu] == [Shape(0, 0, 8000), Shape(500, 1, 4000), Shape(500, 1, 6000),
                                        Shape(0, 1, 4000)]
    assert sum(p for _, p in with_cpu) == pytest.approx(1.0)


def test_cpu_only_shapes_count_every_free_gpu_and_shift_every_increase_alike():
    state = ClusterState()
    state.add_node("a", "t4", 2, 16000, cpu_milli=16000)
    state.add_node("b", "t4", 2, 16000, cpu_milli=16000)
    state.build()
    state.place(RunningJob("j", "x", (0,), 0, 1, gpu_units=300, cpu_milli=1000))
    prior = {Shape(500, 1, 1000): 1, Shape(0, 0, 1000): 1}
    gpu_only = FragmentationModel(prior)
    with_cpu = FragmentationModel(prior, include_cpu=True)
    free = 700 + 1000 + 2000
    # GPU shapes: 700 milli of GPU 0 unusable for 500 milli? no (700 >= 500): no fragment; CPU shape: all
    assert gpu_only.total(state) == pytest.approx(0.0)
    assert with_cpu.total(state) == pytest.approx(0.5 * free)
    req = JobRequest("r", "x", gpu_units=400, cpu_milli=1000)
    gpus = np.arange(state.n_gpus)
    d_gpu, d_cpu = gpu_only.delta_for(state, req, gpus), with_cpu.delta_for(state, req, gpus)
    # the CPU shape's share of the increase is the same everywhere: -p * 400 milli taken
    assert np.allclose(d_cpu - 0.5 * d_gpu, -0.5 * 400)


def test_tie_break_order_takes_the_first_node_of_a_seeded_order():
    def empty():
        state = ClusterState()
        for k in range(6):
            state.add_node(f"n{k}", "t4", 2, 16000, cpu_milli=16000)
        state.build()
        return state

    m = models()
    m.workload = {Shape(500, 1, 1000): 1}
    req = JobRequest("r", "x", gpu_units=500, cpu_milli=1000)
    first = make_policy("fgd/quantize=true", m).decide(empty(), req)
    assert first.nodes == ["n0"]  # first fit
    chosen = {}
    for seed in range(6):
        policy = make_policy(f"fgd/quantize=true/tie_break=order/seed={seed}", m)
        a, b = policy.decide(empty(), req), policy.decide(empty(), req)
        assert a.nodes == b.nodes  # the same order for every decision of a run
        assert a.gpus[a.nodes[0]] == [0]  # inside the node: the first GPU of the best score
        chosen[seed] = a.nodes[0]
    assert len(set(chosen.values())) > 1  # the order depends on the seed
    state = empty()
    policy = make_policy("fgd/quantize=true/tie_break=order/seed=3", m)
    for k in range(4):
        decision = policy.decide(state, JobRequest(f"q{k}", "x", gpu_units=500, cpu_milli=1000))
        state.place(policy.running_job(JobRequest(f"q{k}", "x", gpu_units=500, cpu_milli=1000), decision, 0))
    # equal nodes are filled in order: 4 halves on 2 GPUs of one node, not spread
    assert int((state.gpu_used > 0).sum()) == 2 and len(set(state.gpu_node[state.gpu_used > 0])) == 1
    with pytest.raises(ValueError, match="tie_break"):
        make_policy("fgd/tie_break=sometimes", m)


def test_bestfit_quantized_scores_are_the_plugins_normalized_integers():
    state = cluster()
    fill_randomly(state)
    m = models()
    m.workload = dict(PRIOR)
    policy = make_policy("bestfit/quantize=true", m)
    req = JobRequest("r", "x", gpu_units=250, cpu_milli=2000)
    nodes = np.arange(len(state.nodes))
    node_score = policy._node_score(state, req, nodes, 250.0)
    assert np.array_equal(node_score, np.floor(node_score))
    exact = make_policy("bestfit", m)._node_score(state, req, nodes, 250.0)
    assert node_score[np.argmax(exact)] == node_score.max()  # the exact best node scores best
    assert node_score.min() == 0.0 and node_score.max() == 100.0


def test_inflate_keeping_the_trace_offers_every_request_then_draws():
    from slurm_horus.sim.arrivals import inflate_trace, requested_gpus
    from slurm_horus.sim.traces import TraceJob
    jobs = [TraceJob(f"j{k}", 0.0, 10.0, 1, gpu_milli=[250, 1000][k % 2]) for k in range(40)]
    asked = sum(requested_gpus(j) for j in jobs)  # 25 GPUs
    out = inflate_trace(jobs, 20, 1.5, seed=4, keep_trace=True)
    ids = [j.job_id.split("#")[0] for j in out]
    assert sorted(ids[:40]) == sorted(j.job_id for j in jobs)  # each once, first
    assert ids[:40] != [j.job_id for j in jobs]  # shuffled
    total = sum(requested_gpus(j) for j in out)
    assert asked < total <= 30.0 + 1e-9 and total > 30.0 - 1.0  # within the target, up to one request short
    fewer = inflate_trace(jobs, 20, 1.0, seed=4, keep_trace=True)  # the trace asks more: some dropped
    assert 19.0 <= sum(requested_gpus(j) for j in fewer) <= 20.0 + 1e-9
    base = [j.job_id.split("#")[0] for j in fewer]
    assert len(set(base)) == len(base) < 40  # no draw, each kept request once


def test_cli_inflate_keep_trace(tmp_path):
    nodes, pods = write_fgd_files(tmp_path, 60)  # the trace asks less than 130 % of the 50 GPUs
    out = tmp_path / "out.json"
    result = CliRunner().invoke(simulate, [
        "--trace", pods, "--cluster", nodes, "--no-departure", "--inflate", "1.3", "--inflate-keep-trace",
        "--shuffle-seed", "1", "--policy", "fgd/quantize=true/tie_break=order/cpu_shapes=true,bestfit",
        "--truth", "none", "--gpu-memory-mb", "G2=32768", "--json", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["inflate_keep_trace"] is True and data["requests"] > 60
    for s in data["policies"].values():
        assert 125.0 < s["arrived_gpu_pct"] <= 130.0 + 1e-6 and s["over_capacity_gpus"] == 0
    bad = CliRunner().invoke(simulate, ["--trace", pods, "--cluster", nodes, "--truth", "none", "--no-departure",
                                        "--gpu-memory-mb", "G2=32768", "--inflate-keep-trace"])
    assert bad.exit_code != 0 and "--inflate-keep-trace goes with --inflate" in bad.output + str(bad.exception)


def test_bench_fgd_reads_fgd_files_from_a_directory(tmp_path):
    """bench/bench_fgd.py --fgd-data: FGD's file names, FGD's inflation, the aliases seeded per run."""
    import subprocess
    import sys
    from pathlib import Path
    nodes, pods = write_fgd_files(tmp_path, 60)
    data = tmp_path / "fgd"
    data.mkdir()
    Path(nodes).rename(data / "openb_node_list_gpu_node.csv")
    Path(pods).rename(data / "openb_pod_list_default.csv")
    bench = Path(__file__).resolve().parent.parent / "bench" / "bench_fgd.py"
    run = subprocess.run([sys.executable, str(bench), "--fgd-data", str(data), "--seeds", "1,2",
                          "--policies", "fgd-paper,bestfit-paper"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["workload"] == "FGD's openb files" and out["keep_trace"] is True
    assert out["cluster"] == {"gpu_nodes": 10, "gpus": 50} and out["trace_requests"] == 60
    fgd = out["policies"]["fgd-paper"]
    assert fgd["spec"] == "fgd/quantize=true/tie_break=order/cpu_shapes=true/seed=SEED"
    assert fgd["published"] == 95.4 and len(fgd["per_seed"]) == 2 and fgd["over_capacity_gpus"] == 0
    assert all(125.0 < a <= 130.0 for a in fgd["arrived_pct_at_end"])
    missing = subprocess.run([sys.executable, str(bench), "--fgd-data", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "no such file" in missing.stderr


def test_state_counts_for_has_room_follow_every_place_and_release():
    """has_room and nodes_with_room read counts the state keeps (GPUs per number of jobs, GPUs with a
    held and unfinished fraction, GPUs per node another job may join, GPUs per node running one job
    a second may join): after any mix of fractions, exclusive, shared and multi-GPU jobs placed and
    released, they equal the counts taken from the arrays."""
    state = cluster()
    rng = np.random.default_rng(5)
    running = []
    for step in range(400):
        if running and rng.random() < 0.45:
            state.release(running.pop(int(rng.integers(len(running)))))
        else:
            kind = int(rng.integers(4))
            left = state.gpu_left()
            if kind == 0:  # a fraction
                units = int(rng.choice([100, 250, 500, 1000]))
                fits = np.flatnonzero((left >= units) & ~state.gpu_exclusive)
                job = dict(gpu_units=units)
            elif kind == 1:  # a whole GPU, exclusive (now and then joining a time-shared job: the state
                # records what runs, as horusd reads it from Slurm, whether a policy would do it or not)
                alone = (state.gpu_njobs == 1) & (state.gpu_used == 0) & ~state.gpu_exclusive
                fits = np.flatnonzero(alone if rng.random() < 0.3 else state.gpu_njobs == 0)
                job = dict(exclusive=True)
            else:  # time-shared whole GPUs (no fraction held there), one or two
                fits = np.flatnonzero((state.gpu_used == 0) & (state.gpu_njobs < 2) & ~state.gpu_exclusive)
                job = {}
            if not len(fits):
                continue
            take = 2 if kind == 3 and len(fits) >= 2 else 1
            gpus = tuple(int(g) for g in rng.choice(fits, take, replace=False))
            job_id = f"j{step}"
            state.place(RunningJob(job_id, "x", gpus, 0, 1, **job))
            running.append(job_id)
        counts = np.bincount(state.gpu_njobs, minlength=len(state.njobs_count))
        assert list(counts) == state.njobs_count
        used = state.gpu_used
        assert state.n_fraction_room == int(((state.gpu_nplain == 0) & (used > 0) & (used < state.gpu_cap)).sum())
        joinable = (state.gpu_njobs > 0) & (state.gpu_njobs < state.max_jobs_per_gpu) & ~state.gpu_exclusive
        assert list(state.node_joinable) == list(np.bincount(state.gpu_node[joinable], minlength=len(state.nodes)))
        single = (state.gpu_njobs == 1) & ~state.gpu_exclusive
        assert list(state.node_single) == list(np.bincount(state.gpu_node[single], minlength=len(state.nodes)))
    assert state.n_fraction_room > 0 and len(state.njobs_count) >= 3  # the mix reached both cases
