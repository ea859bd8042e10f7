"""One snapshot, two paths, the same placements: horusd's queue and the simulator share one cycle.

The snapshot is real: ``sinfo --json`` and ``squeue --json`` of the 2-node x 4-GPU local cluster
with 16 jobs horusd kept (``bench/bench_live_queue.py --phases B --save DIR`` took it, on 22.05.8;
two cancelled blocker jobs are still listed, as squeue lists ended jobs for MinJobAge). horusd's
path reads it the way a refresh does (snapshot.py -> Placer -> run_cycle); the simulator's path
reads the same facts as a trace and a cluster spec (its own request and cluster translation ->
Simulator._schedule -> run_cycle). Both call the one cycle of the placement core, so the test
proves that the two translations agree. bench_live_queue.py checks, on the real daemons, that horusd's
first cycle after that snapshot placed exactly what this cycle places.

Durations: both paths know the same history (finished jobs' run times: what ``horus ingest`` stored for
horusd, what ended earlier in the run for the simulator) and ask the one duration estimator; each
waiting job must reach the cycle with the same estimate on both paths, with and without history.
"""

from pathlib import Path

import pytest

from slurm_horus.interference import build_model, gpu_memory_mb
from slurm_horus.jobclass import job_class_of
from slurm_horus.placement import ClassIndex, NodeGroup, PolicyModels, build_cluster, make_policy
from slurm_horus.placement.duration import estimator_from_records
from slurm_horus.service.daemon import Placer
from slurm_horus.service.snapshot import Snapshot, node_gpu_count
from slurm_horus.sim.engine import SimOptions, Simulator
from slurm_horus.sim.traces import TraceJob
from slurm_horus.sim.truth import load_truth
from slurm_horus.slurm.parse import parse_sinfo, parse_squeue

DATA = Path(__file__).parent / "data"
MODEL = build_model("chain")
NOW = 1795441700.0  # a moment after the snapshot was taken
# finished jobs of the site (as the history store holds them): root's runs of some classes, another
# user's of others; the snapshot's jobs are root's, with limits of 2-5 minutes
HISTORY = [{"user": user, "job_class": cls, "elapsed_s": run, "state": "COMPLETED", "n_gpus": 1,
            "end_time": 1795440000 + k}
           for k, (user, cls, run) in enumerate([
               ("root", "resnet18-bs32", 40), ("root", "resnet18-bs32", 60), ("root", "lm-bs20", 250),
               ("root", "cyclegan", 30), ("ann", "a3c", 90), ("ann", "a3c", 110), ("ann", "resnet50-bs64", 900),
               ("ann", "transformer-bs32", 20)])]


def read_snapshot():
    nodes = parse_sinfo((DATA / "queue-snapshot-sinfo-22.05.json").read_text())
    jobs = parse_squeue((DATA / "queue-snapshot-squeue-22.05.json").read_text())
    return nodes, jobs


def horusd_path(nodes, jobs, policy_name, history=()):
    placer = Placer(None, binding="shard", gpu_type="v100", gpu_memory_mb=gpu_memory_mb, clock=lambda: NOW)
    placer.policy = make_policy(policy_name, PolicyModels(placer.classes, lambda kind: MODEL))
    placer.set_durations(estimator_from_records(history))  # what history.py feeds it from the store
    placer.load_snapshot(Snapshot(nodes, jobs, taken_at=NOW))
    requests = {req.job_id: req for req in placer.queue}
    placements = {}
    for move in placer.cycle():
        (node, indices), = move.reply.gpus.items()
        placements[move.kept.job_id] = (placer.state.node_ids[node], tuple(indices))
    return requests, placements, placer.state


def simulator_path(nodes, jobs, policy_name, history=()):
    """The same facts as the simulator takes them: a cluster spec, a trace (the time limits; the true
    durations, unknown to both paths, are twice the limits), every waiting job arriving before this
    cycle, ``history`` ended before them."""
    (gpus, partitions), = {(node_gpu_count(n), n.partitions) for n in nodes}  # one homogeneous group
    groups = [NodeGroup(len(nodes), gpus, "v100", gpu_memory_mb("v100"), partitions, prefix="sim")]
    classes = ClassIndex()
    state = build_cluster(groups, classes=classes)
    trace = [TraceJob(str(j.job_id), float(j.submit_time), j.time_limit * 120.0, num_gpus=1,
                      job_class=job_class_of(comment=j.comment, admin_comment=j.admin_comment),
                      partition=j.partition, user=j.user, time_limit=j.time_limit * 60.0)
             for j in jobs if j.state == "PENDING"]
    policy = make_policy(policy_name, PolicyModels(classes, lambda kind: MODEL))
    # durations: estimated (the default); horusd's slowdown limit (its default 1.5) as a run option
    sim = Simulator(state, load_truth("gavel:v100"), policy, trace, options=SimOptions(max_slowdown=1.5))
    for row in history:  # as the simulator learns of a job that ended: its user, class and run time
        sim.estimator.observe(row["user"], row["job_class"], row["elapsed_s"])
    placements = {}
    start = sim._start

    def recording_start(job, decision):
        (node, indices), = decision.gpus.items()
        placements[job.req.job_id] = (state.node_ids[node], tuple(indices))
        return start(job, decision)

    sim._start = recording_start
    for job in sim.jobs:
        sim._enqueue(job)
    sim.now = NOW
    sim._schedule()
    return {job.req.job_id: job.req for job in sim.jobs}, placements, state


@pytest.mark.parametrize("history", [(), HISTORY], ids=["limits", "history"])
@pytest.mark.parametrize("policy_name", ["horus", "sjf-bsbf", "slurm-default"])
def test_horusd_and_the_simulator_place_one_snapshot_alike(policy_name, history):
    nodes, jobs = read_snapshot()
    live_requests, live, live_state = horusd_path(nodes, jobs, policy_name, history)
    sim_requests, simulated, sim_state = simulator_path(nodes, jobs, policy_name, history)
    assert len(live_requests) == 16  # the 16 kept jobs, not the 2 cancelled blockers
    # the translations agree: the same hardware, the same requests ...
    assert (live_state.n_gpus, [n.n_gpus for n in live_state.nodes]) == (sim_state.n_gpus, [n.n_gpus for n in sim_state.nodes])
    for job_id, live_req in live_requests.items():
        sim_req = sim_requests[job_id]
        for field in ("job_class", "gpus_per_node", "nodes", "partition", "submit_time", "user", "exclusive",
                      "time_limit", "predicted_duration"):
            assert getattr(live_req, field) == getattr(sim_req, field), (job_id, field)
    durations = {job_id: req.predicted_duration for job_id, req in live_requests.items()}
    if history:  # the estimates are the history's, not the limits: root's resnet18 runs, ann's a3c runs
        assert durations["3"] == 50.0 and durations["8"] == 100.0 and durations["6"] == 300.0  # 900 s, capped
    else:
        assert all(durations[str(j.job_id)] == j.time_limit * 60.0 for j in jobs if j.state == "PENDING")
    # ... so the one cycle places them alike: the same jobs on the same GPUs (pairs included), the
    # same jobs left waiting
    assert live and live == simulated
    assert set(live_requests) - set(live) == set(sim_requests) - set(simulated)
