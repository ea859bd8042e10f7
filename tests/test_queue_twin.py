"""One snapshot, two paths, the same placements: horusd's queue and the simulator share one cycle.

The snapshot is real: ``sinfo --json`` and ``squeue --json`` of the 2-node x 4-GPU local cluster
with 16 jobs horusd kept (``bench/bench_live_queue.py --phases B --save DIR`` took it, on 22.05.8;
two cancelled blocker jobs are still listed, as squeue lists ended jobs for MinJobAge). horusd's
path reads it the way a refresh does (snapshot.py -> Placer -> run_cycle); the simulator's path
reads the same facts as a trace and a cluster spec (its own request and cluster translation ->
Simulator._schedule -> run_cycle). Both call the one cycle of the placement core, so the test
proves that the two translations agree. bench_live_queue.py checks, on the real daemons, that horusd's
first cycle after that snapshot placed exactly what this cycle places.
"""

from pathlib import Path

import pytest

from slurm_horus.interference import build_model, gpu_memory_mb
from slurm_horus.jobclass import job_class_of
from slurm_horus.placement import ClassIndex, NodeGroup, PolicyModels, build_cluster, make_policy
from slurm_horus.service.daemon import Placer
from slurm_horus.service.snapshot import Snapshot, node_gpu_count
from slurm_horus.sim.engine import Simulator
from slurm_horus.sim.traces import TraceJob
from slurm_horus.sim.truth import load_truth
from slurm_horus.slurm.parse import parse_sinfo, parse_squeue

DATA = Path(__file__).parent / "data"
MODEL = build_model("chain")
NOW = 1795441700.0  # a moment after the snapshot was taken


def read_snapshot():
    nodes = parse_sinfo((DATA / "queue-snapshot-sinfo-22.05.json").read_text())
    jobs = parse_squeue((DATA / "queue-snapshot-squeue-22.05.json").read_text())
    return nodes, jobs


def horusd_path(nodes, jobs, policy_name):
    placer = Placer(None, binding="shard", gpu_type="v100", gpu_memory_mb=gpu_memory_mb, clock=lambda: NOW)
    placer.policy = make_policy(policy_name, PolicyModels(placer.classes, lambda kind: MODEL))
    placer.load_snapshot(Snapshot(nodes, jobs, taken_at=NOW))
    requests = {req.job_id: req for req in placer.queue}
    placements = {}
    for move in placer.cycle():
        (node, indices), = move.reply.gpus.items()
        placements[move.kept.job_id] = (placer.state.node_ids[node], tuple(indices))
    return requests, placements, placer.state


def simulator_path(nodes, jobs, policy_name):
    """The same facts as the simulator takes them: a cluster spec, a trace (duration: the time limit,
    which is all horusd knows), every waiting job arriving before this cycle."""
    (gpus, partitions), = {(node_gpu_count(n), n.partitions) for n in nodes}  # one homogeneous group
    groups = [NodeGroup(len(nodes), gpus, "v100", gpu_memory_mb("v100"), partitions, prefix="sim")]
    classes = ClassIndex()
    state = build_cluster(groups, classes=classes)
    trace = [TraceJob(str(j.job_id), float(j.submit_time), j.time_limit * 60.0, num_gpus=1,
                      job_class=job_class_of(comment=j.comment, admin_comment=j.admin_comment),
                      partition=j.partition, user=j.user)
             for j in jobs if j.state == "PENDING"]
    policy = make_policy(policy_name, PolicyModels(classes, lambda kind: MODEL))
    sim = Simulator(state, load_truth("gavel:v100"), policy, trace)
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


@pytest.mark.parametrize("policy_name", ["horus", "sjf-bsbf", "slurm-default"])
def test_horusd_and_the_simulator_place_one_snapshot_alike(policy_name):
    nodes, jobs = read_snapshot()
    live_requests, live, live_state = horusd_path(nodes, jobs, policy_name)
    sim_requests, simulated, sim_state = simulator_path(nodes, jobs, policy_name)
    assert len(live_requests) == 16  # the 16 kept jobs, not the 2 cancelled blockers
    # the translations agree: the same hardware, the same requests ...
    assert (live_state.n_gpus, [n.n_gpus for n in live_state.nodes]) == (sim_state.n_gpus, [n.n_gpus for n in sim_state.nodes])
    for job_id, live_req in live_requests.items():
        sim_req = sim_requests[job_id]
        for field in ("job_class", "gpus_per_node", "nodes", "partition", "submit_time", "user", "exclusive"):
            assert getattr(live_req, field) == getattr(sim_req, field), (job_id, field)
        assert live_req.expected_duration() == sim_req.expected_duration()
    # ... so the one cycle places them alike
    assert live and live == simulated
