"""Where the simulator's scheduling cycle puts shard requests: the reference the live path is held to."""

from slurm_horus.placement import ClassIndex, ClusterState, JobRequest
from slurm_horus.placement.cycle import PendingQueue, run_cycle
from slurm_horus.placement.policies import PolicyModels, make_policy


def packing_by_the_simulators_cycle(policy_name, requests, predictor_factory, nodes=("n1", "n2"), gpus=4,
                                    shards=8, gpu_type="v100", partition="gpu"):
    """[(node, GPU index)] for ``requests`` (shards of one GPU each) offered one after the other to
    ``policy_name`` on an empty cluster of ``nodes`` x ``gpus`` GPUs of ``shards`` shards."""
    state = ClusterState(classes=ClassIndex())
    for name in nodes:
        state.add_node(name, gpu_type, gpus, 16384, partitions=(partition,), gpu_cap=shards)
    state.build()
    policy = make_policy(policy_name, PolicyModels(state.classes, predictor_factory))
    where = []
    for k, units in enumerate(requests):
        queue = PendingQueue(policy)
        queue.add(JobRequest(f"s{k}", "unknown", gpu_units=units, partition=partition))

        def start(req, decision):
            state.place(policy.running_job(req, decision, 0.0))
            where.append((decision.nodes[0], decision.gpus[decision.nodes[0]][0]))
            return True
        run_cycle(state, policy, queue, 0.0, start)
    return where
