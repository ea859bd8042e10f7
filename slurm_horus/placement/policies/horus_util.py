"""horus-util: the placement rule of the Horus paper.

Source: Yeung et al., "Horus: Interference-Aware and Prediction-Based Scheduling in Deep Learning
Systems", IEEE TPDS 33(1), 2022, and a public reimplementation of its scheduler (``horus_score``,
``schedule_horus``, ``can_fit``). Rule:

* **utilization, predicted**: each job's solo GPU utilization comes from its model's features without
  profiling (:class:`~slurm_horus.interference.utilmodel.UtilizationModel`); a utilization measured on
  this cluster (solo profiles) is used when there is one;
* **feasible GPUs**: fewer than ``max_jobs_per_gpu`` (3) jobs, and at least ``headroom_mb`` (500 MB)
  of memory left with the job's peak memory added (where peak memories are known);
* **cost** of a GPU, lowest wins: ``1.3 · (memory used + job's) / GPU memory
  + |min(Σ utilization, 100) + job's − 100| / 100`` (that term × 1.6 when over 100 %)
  ``+ number of jobs there``;
  a free GPU therefore always wins over a shared one, and once none is free jobs are packed toward
  100 % summed utilization, fewest co-runners first;
* **queue**: waiting jobs ordered by predicted utilization, lowest first (the reference's min-heap),
  with a look-ahead of ``look_ahead`` (5): a cycle stops trying once that many jobs failed to place.

Our reading: peak memory comes from the solo profiles when measured, else it is unknown and the
memory term counts 0 — a pair the interference model predicts cannot fit (a predicted 0: observed or
inferred out-of-memory) is never a candidate, for the new job's pair with every resident; the queue's
utilization is the one predicted for ``queue_gpu`` (a queue is not tied to a GPU type); a class the
feature table does not know is taken as using the whole GPU (``unknown_util``).

Option, not the reference's rule: ``max_util_sum`` (> 0) shares a GPU only while the predicted
utilization sum stays at or under it (the "co-locate while Σ utilization ≤ threshold" reading; off
by default). With the default knowledge on Gavel's V100 classes (predicted 77–100 %, A3C 1 %) it
removes nearly every harmful pair but shares too little to shorten the makespan (docs/placement.md).
"""

from typing import Dict, Optional, Tuple

import numpy as np

from ..framework import NEG_INF, Policy
from ..request import Decision


class HorusUtil(Policy):
    name = "horus-util"
    share = True
    max_jobs_per_gpu = 3
    memory_weight = 1.3  # the reference's MEMCOST
    over_weight = 1.6  # the reference's UTILCOST: going over 100 % costs this much more
    headroom_mb = 500.0
    look_ahead = 5
    unknown_util = 100.0
    queue_gpu = "v100"
    order_rule = "utilization"  # or "fifo" (for comparison; the paper orders by utilization)
    max_util_sum = 0.0  # > 0: share only where the predicted utilization sum stays at most this (0: off)

    def __init__(self, pairs=None, utilization: Optional[Dict[Tuple[str, str], float]] = None,
                 util_model=None, gmem: Optional[Dict[Tuple[str, str], float]] = None, **options):
        super().__init__(pairs, **options)
        self.utilization = dict(utilization or {})  # measured (gpu type, class) -> percent
        self.util_model = util_model
        self.gmem = dict(gmem or {})  # measured (gpu type, class) -> peak MB
        self._per_type: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        self._queue_util: Dict[str, float] = {}
        self._ctx = None
        self._failed = 0
        self._log_pos = 0  # position in the state's change log up to which the sums are kept
        self._state = None
        self._util_sum = self._mem_sum = None
        self._bits, self._bits_ok = None, True  # per GPU its resident classes as bits (_set_bits)

    # ---- utilization and memory per class -------------------------------------------------------
    def util_of(self, job_class: str, gpu_type: str) -> float:
        measured = self.utilization.get((gpu_type, job_class))
        if measured is not None:
            return float(measured)
        predicted = self.util_model.predict(job_class, gpu_type) if self.util_model is not None else None
        return self.unknown_util if predicted is None else float(predicted)

    def _class_arrays(self, state, gpu_type: str) -> Tuple[np.ndarray, np.ndarray]:
        arrays = self._per_type.get(gpu_type)
        if arrays is None or len(arrays[0]) < len(state.classes):
            names = state.classes.names
            arrays = (np.array([self.util_of(n, gpu_type) for n in names]),
                      np.array([self.gmem.get((gpu_type, n), 0.0) for n in names]))
            self._per_type[gpu_type] = arrays
        return arrays

    queue_key_reads_duration = False  # (submission, or the class's utilization)

    def queue_key(self, req):
        if self.order_rule == "fifo":
            return (req.submit_time, req.job_id)
        util = self._queue_util.get(req.job_class)
        if util is None:
            measured = [v for (_, c), v in self.utilization.items() if c == req.job_class and v is not None]
            util = float(np.mean(measured)) if measured else self.util_of(req.job_class, self.queue_gpu)
            self._queue_util[req.job_class] = util
        return (util, req.submit_time, req.job_id)

    # ---- per-GPU sums of the residents' utilization and memory, and their classes, kept up to date -
    def _sync(self, state):
        """Follow ``state.jobs`` through the state's change log (``state.changes``): O(changes since the
        last decision). A new state object, or a log trimmed past this policy's position, starts over
        from ``state.jobs``."""
        if (self._state is not state or len(self._util_sum) != state.n_gpus
                or self._log_pos < state.changes_base):
            self._state = state
            self._util_sum, self._mem_sum = np.zeros(state.n_gpus), np.zeros(state.n_gpus)
            self._residents = np.full((state.n_gpus, self.max_jobs_per_gpu + 1), -1, dtype=np.int64)
            self._bits, self._bits_ok = np.zeros(state.n_gpus, dtype=np.int64), True
            for running in state.jobs.values():
                self._add(state, running, 1.0)
            self._log_pos = state.changes_base + len(state.changes)
            return
        start = self._log_pos - state.changes_base
        for sign, running in state.changes[start:]:
            self._add(state, running, float(sign))
        self._log_pos = state.changes_base + len(state.changes)

    def _add(self, state, running, sign):
        gpus = np.asarray(running.gpus, dtype=np.int64)
        if not len(gpus):
            return  # a CPU-only job
        util, mem = self._class_arrays(state, state.gpu_type_of(int(gpus[0])))
        cid = state.classes.id(running.job_class)
        if cid >= len(util):
            self._per_type.clear()
            util, mem = self._class_arrays(state, state.gpu_type_of(int(gpus[0])))
        if len(gpus) == 1:  # the common case, without fancy indexing (the same arithmetic)
            g = int(gpus[0])
            self._util_sum[g] += sign * util[cid]
            self._mem_sum[g] += sign * (running.mem_mb or mem[cid])
            row = self._residents[g]
            want = -1 if sign > 0 else cid
            for i in range(len(row)):  # one slot per resident: its class id
                if row[i] == want:
                    row[i] = cid if sign > 0 else -1
                    break
            self._set_bits(g, row)
            return
        self._util_sum[gpus] += sign * util[cid]
        self._mem_sum[gpus] += sign * (running.mem_mb or mem[cid])
        slots = self._residents[gpus]
        for row, g in zip(slots, gpus):  # one slot per resident: its class id
            free = np.flatnonzero(row == (-1 if sign > 0 else cid))
            if len(free):
                self._residents[g, free[0]] = cid if sign > 0 else -1
            self._set_bits(int(g), self._residents[g])

    def _set_bits(self, g, row):
        """GPU ``g``'s resident classes as a bit set (bit c: a job of class c runs there), while every
        class id fits in one int64 (then :meth:`_fits_with_every_resident` reads it)."""
        bits = 0
        for cid in row.tolist():
            if cid >= 63:
                self._bits_ok = False
            elif cid >= 0:
                bits |= 1 << cid
        self._bits[g] = bits

    # ---- the pipeline ----------------------------------------------------------------------------
    def decide(self, state, req, ctx=None, explain=False):
        if ctx is not None and ctx is not self._ctx:
            self._ctx, self._failed = ctx, 0
        if ctx is not None and self._failed >= self.look_ahead:
            return Decision(req.job_id, False, self.name,
                            reason=f"beyond Horus's look-ahead ({self.look_ahead} jobs could not be placed)")
        decision = super().decide(state, req, ctx, explain)
        if not decision.placed and ctx is not None:
            self._failed += 1
        return decision

    def score_gpus(self, cycle):
        state, idx = cycle.state, cycle.idx
        self._sync(state)
        if len(state.gpu_types) == 1:
            util, mem = self._class_arrays(state, state.gpu_types[0])
            job_util, job_mem = util[cycle.class_id], cycle.req.mem_mb or mem[cycle.class_id]
        else:
            types = state.gpu_type_id[idx]
            job_util, job_mem = np.empty(len(idx)), np.empty(len(idx))
            for t in np.unique(types):
                util, mem = self._class_arrays(state, state.gpu_types[t])
                sel = types == t
                job_util[sel] = util[cycle.class_id]
                job_mem[sel] = cycle.req.mem_mb or mem[cycle.class_id]
        cap = state.gpu_mem_total[idx]
        mem_after = self._mem_sum[idx] + job_mem
        # the reference caps a device's current utilization at 100 % before adding the job's
        over = np.minimum(self._util_sum[idx], 100.0) + job_util - 100.0
        cost = (self.memory_weight * mem_after / cap
                + np.where(over > 0, self.over_weight, 1.0) * np.abs(over) / 100.0
                + state.gpu_njobs[idx])
        ok = (mem_after <= cap - self.headroom_mb) | (mem_after <= 0)
        if self.max_util_sum > 0:
            ok &= (state.gpu_njobs[idx] == 0) | (self._util_sum[idx] + job_util <= self.max_util_sum)
        ok &= self._fits_with_every_resident(cycle)
        return np.where(ok, -cost, NEG_INF)

    def _fits_with_every_resident(self, cycle) -> np.ndarray:
        """The framework checked the pair with the first resident; check them all (≤ 3 per GPU)."""
        state = cycle.state
        ok = np.ones(len(cycle.idx), dtype=bool)
        if self.pairs is None:
            return ok
        c = cycle.class_id
        if len(state.gpu_types) == 1:
            clash = self._clash(state.gpu_types[0], c)
            if not clash.any():
                return ok
            if self._bits_ok and len(clash) <= 64:
                # no resident of a clashing class: one AND per GPU over its residents' bit set
                mask = 0
                for k in np.flatnonzero(clash[:-1]).tolist():
                    mask |= 1 << k
                return (self._bits[cycle.idx] & mask) == 0
            # a GPU with at most one job: its only resident is its first (gpu_class0; -1 when free);
            # the others: every slot
            ok = ~clash[state.gpu_class0[cycle.idx]]
            several = np.flatnonzero(state.gpu_njobs[cycle.idx] > 1)
            if len(several):
                ok[several] = ~clash[self._residents[cycle.idx[several]]].any(axis=1)
            return ok
        residents = self._residents[cycle.idx]
        types = state.gpu_type_id[cycle.idx]
        for t in np.unique(types):
            sel = types == t
            ok[sel] = ~self._clash(state.gpu_types[t], c)[residents[sel]].any(axis=1)
        return ok

    def _clash(self, gpu_type: str, c: int) -> np.ndarray:
        """Per resident class: whether class ``c`` and it are predicted not to fit together (a 0 either
        way), with a trailing False for an empty slot (-1)."""
        mat = self.pairs.matrix(gpu_type)
        return np.append((mat[c] <= 0) | (mat[:, c] <= 0), False)
