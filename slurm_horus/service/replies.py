"""A decision of the placement core as horusd's reply, and the shape of a job horusd keeps.

Bindings (docs/horusd.md): ``indexed`` pins a job to its GPUs with per-GPU GRES types
(``gres:gpu:g2:1``); ``shard`` co-locates 1-GPU jobs that may share through typed shards
(``gres:shard:g2:1``) and holds whole GPUs like ``indexed`` for the others; ``node`` sets the node
only (sites whose GRES types are model names). One ``tres_per_node`` string names the same GPU
indices on every node, so a multi-node decision with different indices per node is bound by node.
Requests are spelled for the Slurm horusd reads (``prefix``: ``gres:`` up to 22.05, ``gres/`` later,
``SlurmVersion.gres_prefix``); 24.11 refuses the old spelling.
"""

from ..placement.request import Decision, JobRequest
from ..slurm.gres import GresItem, format_tres
from ..tokens import FRACTION_MODE, KEPT_MODE, gpu_list
from .protocol import Reply


def binding_of(binding, req: JobRequest, index_sets):
    """The binding a decision is applied with (a job asking shards is bound by shards whatever the
    site's binding: its request already is one)."""
    if req.gpu_units > 0:
        return "shard"
    if binding == "shard" and (req.n_gpus > 1 or req.exclusive):
        binding = "indexed"  # multi-GPU and exclusive jobs hold whole GPUs
    if binding in ("indexed", "shard") and len(index_sets) > 1:
        binding = "node"  # one tres_per_node string cannot name different GPUs per node
    return binding


def placement_reply(state, decision: Decision, req: JobRequest, binding, decision_id, age,
                    prefix="gres:") -> Reply:
    node_gpus = decision.gpus
    index_sets = {tuple(sorted(v)) for v in node_gpus.values()}
    used = binding_of(binding, req, index_sets)
    indices = sorted(next(iter(index_sets)))
    if used == "shard":
        items = [GresItem("shard", f"g{i}", max(req.gpu_units, 1)) for i in indices]
    elif used == "indexed":
        items = [GresItem("gpu", f"g{i}", 1) for i in indices]
    else:  # node binding: Slurm picks the GPUs on that node, of the type the user asked for
        items = [GresItem("gpu", req.gpu_type or None, req.gpus_per_node)]
    tres = format_tres(items, prefix)
    # shared: joins a GPU that runs another job; shareable: alone on a shard, others may join
    mode = "shared" if decision.shared else ("shareable" if used == "shard" else "exclusive")
    if req.gpu_units > 0:
        mode = FRACTION_MODE  # a share of the GPU's shards, by capacity (not the interference model's pairs)
    partition = ""
    if req.extra_partitions:
        node = state.nodes[state.node_ids[decision.nodes[0]]]
        if req.partition not in node.partitions:
            partition = next(p for p in req.extra_partitions if p in node.partitions)
    return Reply(
        "place", reason=f"{decision.reason}; {_MODE_WORDS[mode]}", id=decision_id, nodes=tuple(decision.nodes), gpus=node_gpus,
        gpulist=gpu_list(node_gpus), tres=tres, binding=used, mode=mode, job_class=req.job_class,
        slowdown=round(decision.predicted_slowdown, 3),
        corunner_slowdowns={k: round(1.0 / v, 3) if v > 0 else None for k, v in decision.corunner_norm_tput.items()},
        policy=decision.policy, partition=partition, age=round(age, 3), candidates=explain_candidates(decision),
        # SJF-BSBF's sub-batching: the job runs micro_batch samples per step, grad_accum steps per update
        micro_batch=decision.micro_batch or None, grad_accum=decision.grad_accum if decision.micro_batch else None,
        **candidate_counts(decision, state))


def kept_shape(binding, req: JobRequest, prefix="gres:"):
    """``tres_per_node`` of a job horusd keeps, chosen so that horusd can move it cleanly later and
    so that Slurm can start it anywhere if horusd is gone (measured on 22.05.8, docs/horusd.md): a job
    that may share one GPU is kept as an untyped shard ``gres:shard:1``, whole GPUs as untyped
    ``gres:gpu:N`` per node. Typed requests are never kept: Slurm moves them to another GPU type but
    keeps (and, for shards, leaks) the old type too."""
    if binding == "shard" and req.n_gpus == 1 and not req.exclusive:
        return f"{prefix}shard:1"
    return f"{prefix}gpu:{req.gpus_per_node}"


def keep_reply(req: JobRequest, binding, decision_id, lease_s, reason, prefix="gres:") -> Reply:
    return Reply("keep", reason=reason, id=decision_id, tres=kept_shape(binding, req, prefix),
                 mode=KEPT_MODE, job_class=req.job_class, lease=int(lease_s))


_MODE_WORDS = {
    "exclusive": "exclusive: a whole GPU of its own",
    "shareable": "shared via shard: alone on its GPU for now, a well-matched job may join it",
    "shared": "shared via shard with the job already on that GPU",
    "fraction": "its shards of one GPU, placed so that the cluster fills up",
}
# policies rank "a free GPU before anything else" (or after) with scores beyond any real value
_SENTINEL_SCORE = 1e8


def _score_words(score):
    if score >= _SENTINEL_SCORE:
        return "ranked before every shared GPU"
    if score <= -_SENTINEL_SCORE:
        return "ranked after every shared GPU"
    return f"score {score:.3f}"


def explain_candidates(decision):
    """The candidates a policy weighed, in the shape ``horus-sbatch --explain`` prints: this job's
    predicted slowdown there and the slowdown of the job already on that GPU (``corunner_slowdown``)."""
    chosen = {f"{node}:gpu{index}" for node, indices in decision.gpus.items() for index in indices}
    out = []
    for candidate in decision.candidates:
        node, _, gpu = candidate.where.partition(":gpu")
        corunner = candidate.corunner_tput if candidate.shared else None
        out.append({
            "node": node, "gpus": [int(gpu)] if gpu.isdigit() else [],
            "predicted_slowdown": round(1.0 / candidate.job_tput, 3) if candidate.job_tput > 0 else None,
            "corunner_slowdown": round(1.0 / corunner, 3) if corunner else None,
            "why": f"{candidate.note}; {_score_words(candidate.score)}", "chosen": candidate.where in chosen,
        })
    return out


def candidate_counts(decision, state):
    """How many GPUs could take the job and how many the cluster has (--explain lists only the best)."""
    return {"candidates_total": decision.n_feasible, "gpus_total": state.n_gpus}
