"""FGD's protocol: requests arrive, each is tried once, nothing departs; how full does the cluster get?

Source: Weng et al., "Beware of Fragmentation" (USENIX ATC'23), §6.1: the trace's requests are drawn
with replacement until the GPU capacity they ask reaches ``inflate`` × the cluster's (130 % in the
paper's figures); each request is placed at arrival or fails (no queue, no departure); the figure of
merit is the share of the cluster's GPU capacity allocated as a function of the share that arrived.

Every request goes through the placement core's scheduling cycle (``placement/cycle.py``), the very
one horusd runs, with a queue of that one request: what differs from the event simulation is only
that nothing ends. Pure bookkeeping here; the policies decide.
"""

import copy
from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

from ..placement.cycle import PendingQueue, run_cycle
from ..placement.fragmentation import FragmentationModel, fragmentation_pct
from ..placement.framework import Policy
from ..placement.state import ClusterState
from .engine import trace_request
from .traces import TraceJob


def requested_gpus(job: TraceJob) -> float:
    """GPUs a trace job asks (a fraction counts as its share of one GPU)."""
    if job.num_gpus == 1 and 0 < job.gpu_milli < 1000:
        return job.gpu_milli / 1000.0
    return float(job.num_gpus)


def inflate_trace(jobs: Sequence[TraceJob], cluster_gpus: int, inflate: float, seed: int,
                  keep_trace: bool = False) -> List[TraceJob]:
    """Requests drawn with replacement from ``jobs`` until they ask ``inflate`` × ``cluster_gpus``
    GPUs (FGD's workload inflation); ids get a ``#k`` suffix so that each draw is its own request.

    ``keep_trace``: the way FGD's simulator does it (its ``TunePodsByNodeTotalResource``): every
    request of the trace once, in an order shuffled by ``seed``, then draws with replacement appended
    while the total stays within the target (when the trace alone asks more, requests drawn at random
    are dropped until it fits). Without it every request is a draw, the last one crossing the target."""
    if inflate <= 0:
        raise ValueError("--inflate must be positive")
    if not any(requested_gpus(j) > 0 for j in jobs):
        raise ValueError("the trace asks for no GPU: nothing to inflate")
    rng = np.random.default_rng(seed)
    target = inflate * cluster_gpus
    out, asked = [], 0.0
    if keep_trace:
        order = list(rng.permutation(len(jobs)))
        asked = sum(requested_gpus(jobs[int(k)]) for k in order)
        while asked > target + 1e-9 and order:
            k = order.pop(int(rng.integers(len(order))))
            asked -= requested_gpus(jobs[int(k)])
        for k in order:
            job = copy.copy(jobs[int(k)])
            job.job_id = f"{job.job_id}#{len(out)}"
            out.append(job)
        while True:
            picks = rng.integers(0, len(jobs), size=1024)
            for k in picks:
                need = requested_gpus(jobs[int(k)])
                if asked + need > target + 1e-9:
                    return out
                job = copy.copy(jobs[int(k)])
                job.job_id = f"{job.job_id}#{len(out)}"
                out.append(job)
                asked += need
    while asked < target:
        picks = rng.integers(0, len(jobs), size=1024)
        for k in picks:
            job = copy.copy(jobs[int(k)])
            job.job_id = f"{job.job_id}#{len(out)}"
            out.append(job)
            asked += requested_gpus(job)
            if asked >= target:
                break
    return out


@dataclass
class ArrivalResult:
    policy: str
    n_gpus: int
    arrived: int = 0
    placed: int = 0
    failed: int = 0
    arrived_gpus: float = 0.0  # GPUs asked by all arrivals
    curve: List[List[float]] = field(default_factory=list)  # [arrived %, allocated %] per 1 % bin
    allocated_gpus: float = 0.0
    fragmentation_pct: float = 0.0
    over_capacity: int = 0  # GPUs holding more units than they have (must stay 0)
    seconds: float = 0.0


def run_arrivals(state: ClusterState, policy: Policy, jobs: Sequence[TraceJob],
                 measure: FragmentationModel = None) -> ArrivalResult:
    """Offer ``jobs`` in order, once each, to ``policy`` through the scheduling cycle; nothing departs.
    ``measure``: the fragmentation model the final ``fragmentation_pct`` is taken with."""
    state.build()
    width = state.node_gpu_table.shape[1]
    result = ArrivalResult(policy.name, state.n_gpus)
    next_bin = 1
    n = max(state.n_gpus, 1)
    for k, job in enumerate(jobs):
        req = trace_request(job, width)
        queue = PendingQueue(policy)
        queue.add(req)

        def start(r, decision):
            state.place(policy.running_job(r, decision, float(k)))
            return True

        started = run_cycle(state, policy, queue, float(k), start).started
        result.arrived += 1
        result.arrived_gpus += requested_gpus(job)
        if started:
            result.placed += 1
            result.allocated_gpus += requested_gpus(job)
        else:
            result.failed += 1
        arrived_pct = 100.0 * result.arrived_gpus / n
        while arrived_pct >= next_bin:
            result.curve.append([float(next_bin), round(100.0 * result.allocated_gpus / n, 3)])
            next_bin += 1
    result.over_capacity = int((state.gpu_used > state.gpu_cap).sum())
    if measure is not None:
        result.fragmentation_pct = fragmentation_pct(state, measure)
    return result


def summarize_arrivals(result: ArrivalResult) -> dict:
    n = max(result.n_gpus, 1)
    return {
        "allocated_gpu_pct": round(100.0 * result.allocated_gpus / n, 3),
        "arrived_gpu_pct": round(100.0 * result.arrived_gpus / n, 3),
        "fragmentation_pct": round(result.fragmentation_pct, 3),
        "requests": result.arrived, "placed": result.placed, "failed": result.failed,
        "over_capacity_gpus": result.over_capacity, "seconds": round(result.seconds, 3),
        "allocation_curve": result.curve,
    }


def allocated_at(curve: List[List[float]], arrived_pct: float) -> float:
    """The allocated % once ``arrived_pct`` % had arrived (the last bin at or below it)."""
    value = 0.0
    for arrived, allocated in curve:
        if arrived > arrived_pct + 1e-9:
            break
        value = allocated
    return value
