"""deepboot: elastic training across the training and inference partitions (DeepBoot's ATS + AFE).

Source: Chen, Zhao, Zhi, Yin, "DeepBoot: Dynamic Scheduling System for Training and Inference Deep
Learning Tasks in GPU Cluster", IEEE TPDS 34(9), 2023 (and its simulator, a fork of Pollux's).

Rule, as published:

* The cluster has a training partition and an inference partition. Inference requests go first and
  only to the inference partition; training jobs may use idle inference GPUs (``lend``).
* **ATS** (adaptive task scaling), every round (60 s): every training job, running or waiting, gets a
  replica count from a group knapsack over the GPUs inference does not hold. A job's options are
  1..its replica limit, each valued at its Pollux speed-up (goodput on that many GPUs / goodput on
  the fair share ``ceil(GPUs / jobs)``), and any count other than its current one is discounted by
  the restart penalty ``(age − restarts × 10 s) / (age + 10 s)``; the round maximizes the sum
  (:meth:`DeepBoot.allocate`, :func:`~..elastic.group_knapsack`). As in Pollux, a job may at most
  double the largest replica count it has run on (its profile does not reach further).
* **ATS-I** (inference): a request takes, in this order, an idle pod of its own application (warm,
  no start-up), a free inference GPU, the GPU of a sleeping pod, and else a GPU borrowed by training:
  the borrower whose speed-up drops least gives one GPU back and keeps running (:meth:`reclaim`
  returns :class:`~..elastic.Shrink`).
* **AFE** (auto-fast elastic) makes that shrink cheap: DeepBoot's code charges 1–5 s for a change of
  replica count against 18–103 s for a start; the caller charges these costs (the simulator:
  ``slurm_horus/sim/elastic.py``).
* **Lifecycle** of inference pods: a pod whose request ended is *protected* for
  ``min(30 + 15 × hits, 120)`` s (its application's next request reuses it; no other job may take the
  GPU), then *sleeps* (still reused, but any job may take its GPU). The pods are the caller's
  RunningJobs with ``pod_app`` set; this policy only decides who may take their GPUs.

Our reading:

* Pollux learns each job's goodput from its own profile; here a job's curve comes with its request
  (``JobRequest.elastic``, from the application's measured traces) and the policy trusts it.
* Where replicas go: DeepBoot re-places a job whose count changes best-fit over identical nodes. Here a
  job keeps its GPUs while its count holds; it grows into the training partition first (the nodes it
  already uses, then best fit), then into free inference GPUs, then sleeping pods; a shrink gives back
  borrowed GPUs first. Inference runs only in the inference partition (DeepBoot's simulator lets it
  use any node; on a Slurm site partitions are fixed).
* DeepBoot's code pins ``ncf`` jobs to one replica; no application is special-cased here.
* Reclaim compares speed-ups against the fair share of the last round.
* A multi-GPU inference request is not guaranteed a one-node set of reclaimed GPUs (DeepBoot's
  inference requests use one GPU each).

Variants: ``elastic=False`` is the rigid lending of the first version (training jobs at their
requested size; reclaim preempts the most recently started borrowers whole, and the caller charges a
restart); ``lend=False`` keeps training in its partition. ``deepboot-nolend`` (rigid, no lending) is
the baseline. GPUs are exclusive.
"""

from typing import Dict, List, Optional, Sequence

import numpy as np

from ..elastic import ElasticJob, Shrink, fair_replicas, group_knapsack, restart_factor, speedups
from ..framework import Policy
from ..state import ClusterState, RunningJob

INFERENCE = "infer"
TRAINING = "train"


class DeepBoot(Policy):
    name = "deepboot"
    share = False
    lending = True
    inference_partition = INFERENCE
    training_partition = TRAINING
    elastic = True  # ATS rounds resize training jobs (False: rigid jobs at their requested size)
    explore = True  # a job may at most double the largest replica count it has run on (Pollux)
    restart_delay = 10.0  # seconds in the restart penalty (DeepBoot's and Pollux's ``delay``)

    def __init__(self, pairs=None, lend: bool = True, **options):
        super().__init__(pairs, **options)
        self.lending = bool(lend)
        self.fair = 1  # fair share (replicas) of the last round: reclaim compares speed-ups with it

    queue_key_reads_duration = False

    def queue_key(self, req):
        return (0 if req.partition == self.inference_partition else 1, req.submit_time, req.job_id)

    # ---- inference pods -------------------------------------------------------------------------
    @staticmethod
    def pods(state: ClusterState) -> List[RunningJob]:
        return [state.jobs[job_id] for job_id in sorted(state.pod_ids)]

    @staticmethod
    def pod_free_for(pod: RunningJob, application: str, now: float) -> bool:
        """Whether a job of ``application`` may take ``pod``'s GPU: its own application's pod (warm),
        or any pod past its protection (asleep)."""
        return (bool(application) and pod.pod_app == application) or now >= pod.protect_until

    def _takeable_pods(self, state, req, now) -> np.ndarray:
        """Bool per GPU: an idle pod that ``req`` may take."""
        mask = np.zeros(state.n_gpus, dtype=bool)
        for pod in self.pods(state):
            if self.pod_free_for(pod, req.application, now):
                mask[list(pod.gpus)] = True
        return mask

    def filter_gpus(self, cycle):
        mask = super().filter_gpus(cycle)
        state, req = cycle.state, cycle.req
        takeable = self._takeable_pods(state, req, cycle.ctx.now)
        if takeable.any():
            parts = self.partitions_of(req)
            allowed = np.zeros(state.n_gpus, dtype=bool)
            for p in parts:
                if p in state.partition_mask:
                    allowed |= state.partition_mask[p]
            if not parts:
                allowed[:] = True
            mask |= takeable & allowed & (state.gpu_njobs == 1)
        cycle.notes["pods"] = takeable
        return mask

    def _fill_predictions(self, cycle):
        super()._fill_predictions(cycle)
        pods = cycle.notes.get("pods")
        if pods is not None and pods.any():
            on_pod = pods[cycle.idx]
            cycle.free = cycle.free | on_pod  # the pod leaves when the job comes: the GPU is its alone
            cycle.job_tput = np.where(on_pod, 1.0, cycle.job_tput)
            cycle.res_tput = np.where(on_pod, 1.0, cycle.res_tput)

    def score_gpus(self, cycle):
        # inference: own application's warm pod, then a free GPU, then a sleeping pod;
        # training: own partition before borrowed GPUs, free GPUs before sleeping pods; first fit
        state, req, idx = cycle.state, cycle.req, cycle.idx
        on_pod = cycle.notes.get("pods", np.zeros(state.n_gpus, dtype=bool))[idx]
        empty = state.gpu_njobs[idx] == 0
        score = empty.astype(float)
        if req.partition == self.inference_partition and req.application:
            warm = np.zeros(len(idx), dtype=bool)
            for pod in self.pods(state):
                if pod.pod_app == req.application:
                    warm |= np.isin(idx, pod.gpus)
            score = score + 2.0 * warm
        elif req.partition and req.partition in state.partition_mask:
            score = score + 2.0 * state.partition_mask[req.partition][idx]
        return np.where(empty | on_pod, score, -np.inf)

    def job_record(self, req, decision, now):
        job = super().job_record(req, decision, now)
        job.application = req.application
        job.elastic = req.elastic
        return job

    # ---- reclaim --------------------------------------------------------------------------------
    def reclaim(self, state, req, ctx):
        if req.partition != self.inference_partition or not self.lending:
            return []
        mask = state.partition_mask.get(self.inference_partition)
        if mask is None:
            return []
        takeable = self._takeable_pods(state, req, ctx.now)
        available = int((((state.gpu_njobs == 0) | takeable) & mask).sum())
        need = req.n_gpus - available
        if need <= 0:
            return []
        borrowers = [job for job in state.jobs.values()
                     if not job.pod_app and job.partition != self.inference_partition and mask[list(job.gpus)].any()]
        if self.elastic:
            return self._shrink_least_loss(state, borrowers, mask, need)
        borrowers.sort(key=lambda job: -job.start)
        chosen, freed = [], 0
        for job in borrowers:
            chosen.append(job.job_id)
            freed += int(mask[list(job.gpus)].sum())
            if freed >= need:
                return chosen
        return []

    def _shrink_least_loss(self, state, borrowers, mask, need) -> list:
        """ATS-I: one GPU at a time from the borrower whose speed-up drops least. A rigid borrower
        cannot shrink: it is preempted whole, and only when no elastic one is left."""
        held = {job.job_id: list(job.gpus) for job in borrowers}
        taken: Dict[str, List[int]] = {}
        freed = 0
        while freed < need:
            best, best_key = None, None
            for job in borrowers:
                gpus = held[job.job_id]
                if not any(mask[g] for g in gpus):
                    continue
                r = len(gpus)
                if job.elastic is not None:
                    base = job.elastic.at(min(self.fair, job.elastic.max_replicas)) or 1.0
                    loss = (job.elastic.at(r) - job.elastic.at(r - 1)) / base
                else:
                    loss = float("inf")
                key = (loss, -job.start, job.job_id)
                if best_key is None or key < best_key:
                    best, best_key = job, key
            if best is None:
                return []
            gpus = held[best.job_id]
            give = [self._give_back_order(state, gpus, mask)[0]] if best.elastic is not None else list(gpus)
            for g in give:
                gpus.remove(g)
            taken.setdefault(best.job_id, []).extend(give)
            freed += sum(1 for g in give if mask[g])
        by_id = {job.job_id: job for job in borrowers}
        return [Shrink(job_id, tuple(sorted(gpus))) if by_id[job_id].elastic is not None else job_id
                for job_id, gpus in taken.items()]

    @staticmethod
    def _give_back_order(state, gpus: Sequence[int], borrowed: np.ndarray) -> List[int]:
        """The order in which a shrinking job gives GPUs back: borrowed ones first, then those on the
        nodes where it has fewest GPUs (what stays is as packed as it can be)."""
        per_node: Dict[int, int] = {}
        for g in gpus:
            per_node[int(state.gpu_node[g])] = per_node.get(int(state.gpu_node[g]), 0) + 1
        return sorted(gpus, key=lambda g: (not borrowed[g], per_node[int(state.gpu_node[g])], -g))

    # ---- ATS: the allocation round --------------------------------------------------------------
    def training_mask(self, state: ClusterState) -> np.ndarray:
        """GPUs training jobs may use: their partition, and the inference partition when lending."""
        mask = state.partition_mask.get(self.training_partition, np.zeros(state.n_gpus, dtype=bool)).copy()
        if self.lending and self.inference_partition in state.partition_mask:
            mask |= state.partition_mask[self.inference_partition]
        return mask

    def training_gpus(self, state: ClusterState, now: float) -> np.ndarray:
        """Bool per GPU: usable by the round (free, held by an elastic job, or a sleeping pod)."""
        usable = self.training_mask(state) & (state.gpu_njobs == 0)
        for job in state.jobs.values():
            if job.elastic is not None or (job.pod_app and now >= job.protect_until):
                usable[list(job.gpus)] = True
        return usable & self.training_mask(state)

    def replica_limit(self, job: ElasticJob, capacity: int, profiled: int) -> int:
        limit = min(job.spec.max_replicas, capacity)
        if self.explore:
            limit = min(limit, max(1, 2 * profiled))
        return max(0, limit)

    def allocate(self, state: ClusterState, jobs: Sequence[ElasticJob], now: float,
                 profiled: Optional[Dict[str, int]] = None) -> Dict[str, int]:
        """ATS: the replica count of every training job for this round (0: it waits).

        ``jobs`` are all training jobs in the system; ``profiled[job_id]`` is the most replicas each
        has run on (Pollux's exploration limit)."""
        capacity = int(self.training_gpus(state, now).sum())
        if not jobs or capacity <= 0:
            return {job.job_id: 0 for job in jobs}
        profiled = profiled or {}
        order = sorted(jobs, key=lambda j: (j.attained, j.submit_time, j.job_id))
        self.fair = fair_replicas(capacity, len(order))
        choices = []
        for job in order:
            limit = self.replica_limit(job, capacity, profiled.get(job.job_id, 0))
            factor = restart_factor(max(0.0, now - job.submit_time), job.restarts, self.restart_delay)
            values = speedups(job, min(self.fair, job.spec.max_replicas), limit)
            choices.append([(w, v if w == job.replicas else v * factor) for w, v in values.items()])
        counts = group_knapsack(choices, capacity)
        return {job.job_id: count for job, count in zip(order, counts)}

    def resize_gpus(self, state: ClusterState, job_id: str, current: Sequence[int], target: int,
                    now: float) -> Optional[tuple]:
        """The GPUs ``job_id`` should hold on ``target`` replicas, from those it holds (``current``):
        a shrink gives back borrowed GPUs first; a grow takes free training GPUs, then sleeping pods'
        training GPUs, then free inference GPUs, then sleeping pods' (each tier only when the earlier
        ones are not enough), node by node best fit, nodes the job already uses first. None: no room."""
        current = list(current)
        borrowed = state.partition_mask.get(self.inference_partition, np.zeros(state.n_gpus, dtype=bool))
        if target <= len(current):
            drop = self._give_back_order(state, current, borrowed)[:len(current) - target]
            return tuple(sorted(set(current) - set(drop)))
        need = target - len(current)
        mask = self.training_mask(state)
        tier = np.full(state.n_gpus, 9)
        free = state.gpu_njobs == 0
        asleep = np.zeros(state.n_gpus, dtype=bool)
        for pod in self.pods(state):
            if now >= pod.protect_until:
                asleep[list(pod.gpus)] = True
        tier[mask & free & ~borrowed] = 0
        tier[mask & asleep & ~borrowed] = 1
        tier[mask & free & borrowed] = 2
        tier[mask & asleep & borrowed] = 3
        tier[current] = 9
        for top in range(4):
            pool = np.flatnonzero(tier <= top)
            if len(pool) >= need:
                break
        else:
            return None
        mine = {int(state.gpu_node[g]) for g in current}
        chosen = list(current)
        while need > 0:
            per_node: Dict[int, List[int]] = {}
            for g in pool:
                if g not in chosen:
                    per_node.setdefault(int(state.gpu_node[g]), []).append(int(g))
            fits = [n for n, gs in per_node.items() if len(gs) >= need]
            if fits:  # best fit: the node with the fewest available GPUs that still takes them all
                node = min(fits, key=lambda n: (n not in mine, len(per_node[n]), n))
            else:
                node = max(per_node, key=lambda n: (n in mine, len(per_node[n]), -n))
            gpus = sorted(per_node[node], key=lambda g: (tier[g], g))[:need]
            chosen += gpus
            mine.add(node)
            need -= len(gpus)
        return tuple(sorted(chosen))
