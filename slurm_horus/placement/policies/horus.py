"""horus: the slurm-horus flagship and the live default.

Source: this project, combining the rules measured best in the simulator: the SJF queue order of
SJF-BSBF (arXiv 2407.13088), the benefit-aware pairing of Horus (TPDS 2022) and Gavel's observation
that a well-chosen pair does more than one job's worth of work per GPU. Rule, per job in queue order:

* while free GPUs outnumber what the queue asks for, take a free GPU (exclusive is fastest per job);
* under pressure, join a running job only where the predicted *combined* normalized throughput of
  the pair is at least ``min_combined`` (1.05) — ``min_combined_known`` (1.2) once the pair has been
  measured on this cluster: a low bar for pairs only predicted, so that they get tried and learned
  (exploration), a higher one for pairs known to be mediocre — and neither job falls under
  ``min_tput``; among such pairs
  take the one maximizing the job's own predicted throughput plus half its partner's
  (``score_rule="combined"``: the plain sum); a free GPU scores 1.0, so it is used only when no pair
  is worth more; when neither exists the job waits (a better partner or a free GPU will come);
* pairing is benefit-aware across the queue, not only for the job at hand: when the caller passes
  the classes of the first waiting jobs (``ctx.extra["window"]``), a job joins resident ``r`` only
  if no waiting job pairs with ``r`` better by more than ``partner_slack`` (the slot is kept for it);
* no pair that loses on completion time: every pair must also pass SJF-BSBF's test (sharing
  beats the job waiting for its partner), so two long jobs never lock a GPU together for days
  while short jobs queue (``require_benefit``);
* short next to long: a pair also qualifies when SJF-BSBF's benefit (mean completion time of the
  pair when sharing vs the job waiting for its partner) is at least ``bsbf_gain`` of the pair's
  work and the pair loses no throughput (combined ≥ 1): in heavy-tailed workloads a short job
  should not wait behind a long one for want of a perfect partner;
* makespan guard: when the queue has shrunk to at most ``guard_queue`` GPUs asked per GPU (the
  tail of a burst or of a trace), a waiting job predicted to run longer than ``guard`` × the
  predicted time to drain the cluster (work waiting plus work running, over the GPUs) starts first,
  so that SJF does not leave the longest jobs alone at the end;
* every pair observed while it runs replaces the model's prediction for that pair (learning);
* fractional requests (``gpu_units``: shards, milli-GPU), CPU-only ones, and whole GPUs asked
  exclusively where the workload has fractional requests: FGD's rule
  (``placement/fragmentation.py``, ATC'23) — the GPU where the expected fragmentation grows least —
  and among the GPUs within ``frag_tolerance`` milli-GPU of that least increase, the one whose
  residents the job is predicted to slow least (the job's throughput + ½ its partner's); a GPU where
  the job or its first resident is predicted under ``min_tput`` is never taken: a fuller cluster
  that does not slow its jobs down.

Queue order (``order``: ``sjf`` or ``fifo``) and the placement rule are independent choices.
"""

import numpy as np

from ..fragmentation import FragmentationModel
from ..framework import NEG_INF, Policy, pressure
from .sjf_bsbf import pair_benefit


class Horus(Policy):
    name = "horus"
    share = True
    max_jobs_per_gpu = 2
    min_combined = 1.05  # for a pair only predicted: low, so that unknown pairs get tried (explored)
    min_combined_known = 1.2  # for a pair already measured on this cluster
    min_tput = 0.35
    order_rule = "sjf"
    uses_duration = True
    partner_slack = 0.1
    guard = 0.8
    guard_queue = 2.0  # guard only while the queue asks for at most this many GPUs per GPU (0: always)
    bsbf_gain = 0.2  # share also when SJF-BSBF's benefit is at least this share of the pair's work
    require_benefit = True  # a pair must also pass SJF-BSBF's test (sharing beats waiting)
    free_score = 1.0  # a free GPU under pressure ranks like a pair of this value
    score_rule = "own"  # or "combined": rank qualifying pairs by the sum of both throughputs
    frag_tolerance = 0.0  # milli-GPU: fragmentation increases this close to the least count as equal

    def __init__(self, pairs=None, fragmentation=None, **options):
        super().__init__(pairs, **options)
        self.fragmentation = fragmentation if fragmentation is not None else FragmentationModel()

    def running_job(self, req, decision, now):
        # the workload fragmentation is measured against: the requests that ran (a decision may be
        # asked and not applied: a dry run, an offer, a job that waits)
        self.fragmentation.observe(req)
        return super().running_job(req, decision, now)

    def score_cpu_nodes(self, state, req, nodes):
        return -self.fragmentation.delta_nodes(state, req, nodes)

    def _score_fraction(self, cycle):
        """A fraction of a GPU: least fragmentation, then least interference (see the docstring)."""
        delta = self.fragmentation.delta_for(cycle.state, cycle.req, cycle.idx)
        jt, rt, free = cycle.job_tput, cycle.res_tput, cycle.free
        harmless = free | ((jt >= self.min_tput) & (rt >= self.min_tput))
        if not harmless.any():
            cycle.notes["wait_reason"] = "every GPU with room runs a job predicted to slow it too much"
            return np.full(len(delta), NEG_INF)
        best = delta[harmless].min()
        near = harmless & (delta <= best + self.frag_tolerance)
        value = np.where(free, 1.5, jt + 0.5 * rt)
        cycle.notes["reason"] = "fraction: least fragmentation, least interference"
        return np.where(near, 1e9 + value, np.where(harmless, -delta, NEG_INF))

    def queue_key(self, req):
        if self.order_rule == "fifo":
            return (req.submit_time, req.job_id)
        return (req.expected_duration(), req.submit_time, req.job_id)

    def urgent_duration(self, state, ctx):
        if self.guard <= 0 or self.order_rule == "fifo":
            return float("inf")
        if self.guard_queue > 0 and ctx.waiting_gpus > self.guard_queue * state.n_gpus:
            return float("inf")
        running = np.maximum(state.gpu_end0 - ctx.now, 0.0).sum()
        drain = (ctx.waiting_work + running) / max(state.n_gpus, 1)
        return self.guard * drain

    def _fractional_workload(self) -> bool:
        return any(shape.units > 0 for shape, _ in self.fragmentation.typical)

    def score_gpus(self, cycle):
        req = cycle.req
        if req.gpu_units > 0 or (req.exclusive and self._fractional_workload()):
            return self._score_fraction(cycle)
        free = cycle.free
        busy = pressure(cycle)
        if not busy and cycle.req.n_gpus <= cycle.state.n_free:
            cycle.notes["reason"] = "free GPUs outnumber the queue: a free GPU"
            return np.where(free, self.free_score, NEG_INF)  # only free GPUs qualify: first fit
        jt, rt = cycle.job_tput, cycle.res_tput
        combined = jt + rt
        threshold = self.min_combined
        if self.min_combined_known != self.min_combined and len(cycle.state.gpu_types) == 1:
            known = self.pairs.known(cycle.state.gpu_types[0])
            c = cycle.class_id
            # per resident class (trailing entry: free GPU), then one gather per GPU
            by_class = np.append(np.where(known[c] & known[:, c], self.min_combined_known, self.min_combined),
                                 self.min_combined)
            threshold = by_class[cycle.resident]
        ok = (combined >= threshold) & (jt >= self.min_tput) & (rt >= self.min_tput)
        window = cycle.ctx.extra.get("window")
        if window is not None and len(window):
            ok &= combined >= self._best_partner(cycle, window) - self.partner_slack
        e_a = cycle.req.expected_duration()
        e_b = np.maximum(cycle.state.gpu_end0[cycle.idx] - cycle.ctx.now, 1.0)
        gain = pair_benefit(e_a, e_b, jt, rt) / (e_a + e_b)
        if self.require_benefit:
            ok &= gain > 0
        if self.bsbf_gain > 0:
            # a job much shorter than its would-be partner gains far more by starting now than the
            # partner loses (SJF-BSBF's test), even when the pair adds little throughput
            ok |= ((gain >= self.bsbf_gain) & (combined >= 1.0) & (jt >= self.min_tput)
                   & (rt >= self.min_tput) & ~free)
        # among the pairs worth making, the job's own speed counts double: it is the job being
        # placed now (queue order put it first), the resident has been running already
        value = combined if self.score_rule == "combined" else jt + 0.5 * rt
        score = np.where(free, self.free_score, np.where(ok, value, NEG_INF))
        cycle.notes["reason"] = "pressure: best predicted pair"
        if not free.any() and not ok.any():
            cycle.notes["wait_reason"] = "no free GPU and no pair predicted worth sharing"
        return score

    def _best_partner(self, cycle, window):
        """Per feasible GPU: the best combined throughput any waiting job would reach there."""
        state = cycle.state
        cache = cycle.ctx.extra.setdefault("_best_partner", {})
        types = state.gpu_type_id[cycle.idx] if len(state.gpu_types) > 1 else None
        out = np.zeros(len(cycle.idx))
        for t in (np.unique(types) if types is not None else (0,)):
            name = state.gpu_types[t]
            mat = self.pairs.matrix(name)
            best = cache.get(name)
            if best is None or len(best) != len(mat) + 1:
                w = np.asarray(window)
                # trailing 0: a free GPU (resident -1) has no partner to keep it for
                best = np.append((mat[w, :] + mat[:, w].T).max(axis=0), 0.0)
                cache[name] = best
            if types is None:
                return best[cycle.resident]
            sel = types == t
            out[sel] = best[cycle.resident[sel]]
        return out
