"""horus-risk: the flagship's candidate rule, pairs decided under prediction uncertainty (issue 13).

Not the default yet: on ``bench_robust.py``'s held-out cases it does better than ``horus``, but it
scores every feasible GPU per decision (a cycle over 5,000 pending jobs on 1,024 × 8 GPUs takes
135/158 ms CPU p50/p99 against ``horus``'s 28/41), and on ``bench_sim.py`` at load 3 its makespan gain
is smaller (−26.9 % against −31.2 %; that setup is where ``horus``'s thresholds were chosen). Figures:
docs/simulator.md, "horus-risk". Run it with ``--policies horus-risk`` or ``policy = horus-risk``.

Source: this project, combining the SJF queue order and the completion-time test of SJF-BSBF
(arXiv 2407.13088), the benefit-aware pairing of Horus (TPDS 2022) and Gavel's observation that a
well-chosen pair does more than one job's worth of work per GPU — decided under prediction
uncertainty instead of fixed thresholds. Rule, per job in queue order (shortest expected first):

* while free GPUs outnumber what the queue asks for, take a free GPU (exclusive is fastest per job);
* otherwise a GPU running job ``b`` is weighed for job ``a`` by the **expected benefit** ``B`` of the
  pair: SJF-BSBF's mean completion time of the two when ``a`` waits for ``b`` minus when they share
  (``pair_benefit``, seconds), from the predicted throughputs of both and their expected durations;
* every input carries its spread: the pair values by where they came from (``PairTable.sigma``:
  a pair measured on this cluster narrow, cf / utilization wider, the default prior widest), the
  durations by the estimator's own spread (``JobRequest.duration_sigma``, the log-σ of the history
  it was drawn from; the resident's remaining time is given the same log-σ); the **risk** ``R`` is the
  standard deviation of ``B`` they imply (first order: ``B``'s sensitivity to each input × its σ);
* the pair is formed when ``B − risk·R > 0``; where a free GPU is also there (the queue asks for more
  GPUs than are free), it must also add throughput with the same confidence:
  ``jt + rt − 1 − risk·√(σ_jt² + σ_rt²) > 0`` (the free GPU is then left to the next job). Among
  qualifying GPUs the lowest risk-adjusted completion time of the pair wins (SJF-BSBF's ``T_con`` +
  risk·R: join the job that frees the GPU soonest); a free GPU scores 1, a qualifying pair more;
  when nothing qualifies the job waits;
* **exploration**, deliberate and bounded: a pair never measured on this cluster may be formed on its
  expected benefit alone (``B > 0``, risk not counted) while the GPU type's exploration budget lasts
  (``explore_budget`` jobs per GPU type); each such placement spends one (``explored``);
* every pair observed while it runs replaces the model's prediction for that pair (learning), which
  narrows its spread; it also corrects the pairs not measured yet, by the offsets of the GPU type and
  of each class that the measured pairs show (``calibrate``, the shrinkage, ``PairTable.calibrate``:
  collaborative filtering's bias terms; a new GPU type is learned from a few pairs per class, not one
  pair at a time; 0: off);
* makespan guard (off unless ``guard`` > 0): once the queue asks for at most ``guard_queue`` GPUs per
  GPU, a job predicted to run longer than ``guard`` × the predicted time to drain the cluster starts
  first;
* fractional requests (``gpu_units``: shards, milli-GPU), CPU-only ones, and whole GPUs asked
  exclusively where the workload has fractional requests: FGD's rule
  (``placement/fragmentation.py``, ATC'23) — the GPU where the expected fragmentation grows least —
  and among the GPUs within ``frag_tolerance`` milli-GPU of that least increase, the one whose
  residents the job is predicted to slow least; a GPU where the job or its first resident is
  predicted under ``min_tput`` is never taken.

The one remaining parameter of the pairing rule, ``risk`` (how many standard deviations of the benefit
a pair must clear), is chosen by cross-validation (``bench/bench_robust.py``: tuned on one GPU type and
trace family, scored on the others), and so are ``explore_budget``, ``guard`` and ``calibrate``. ``--explain`` lists, per candidate GPU, B and R.
"""

import math

import numpy as np

from ..framework import NEG_INF, pressure
from .horus import Horus
from .sjf_bsbf import pair_benefit, pair_times


class HorusRisk(Horus):
    """``horus`` with its pairing thresholds replaced by the benefit-net-of-risk test; the queue order,
    the makespan guard (off by default here), fractions of a GPU and CPU-only jobs are ``horus``'s."""

    name = "horus-risk"
    share = True
    max_jobs_per_gpu = 2
    order_rule = "sjf"
    uses_duration = True
    risk = 0.25  # standard deviations of the benefit a pair must clear (cross-validated: bench_robust)
    explore_budget = 64  # per GPU type: jobs that may pair on the expected benefit alone (unknown pairs)
    calibrate = 3.0  # measured pairs correct the unmeasured ones (PairTable.calibrate; cross-validated)
    min_tput = 0.35  # fractions of a GPU only (FGD's rule): never next to a job slowed under this
    guard = 0.0  # makespan guard (see the docstring); 0: off
    guard_queue = 2.0
    frag_tolerance = 0.0  # milli-GPU: fragmentation increases this close to the least count as equal

    EXPLORING_KEPT = 4096  # exploring answers remembered until their job runs (horusd's offers are never all taken)

    def __init__(self, pairs=None, fragmentation=None, **options):
        super().__init__(pairs, fragmentation=fragmentation, **options)
        self.explored = {}  # GPU type -> jobs placed with an unknown pair on the benefit alone
        self._exploring = {}  # job id -> GPU type, for a decision that explores (until it runs)

    def running_job(self, req, decision, now):
        gpu_type = self._exploring.pop(req.job_id, None)
        if gpu_type is not None and decision.shared:
            self.explored[gpu_type] = self.explored.get(gpu_type, 0) + 1
        return super().running_job(req, decision, now)

    def counters(self):
        return {f"explored:{gpu_type}": count for gpu_type, count in sorted(self.explored.items())}

    def decide_quickly(self, cycle):
        """The pipeline's answer where no pair is weighed: free GPUs outnumber the queue (first free
        GPU). Held equal to the pipeline by tests/test_placement.py."""
        state, req = cycle.state, cycle.req
        if req.n_gpus != 1 or req.gpu_units > 0 or (req.exclusive and self._fractional_workload()):
            return None
        if pressure(cycle) or req.n_gpus > state.n_free:
            return None
        free = state.gpu_class0[cycle.idx] < 0
        if not free.any():
            return None
        cycle.notes["reason"] = "free GPUs outnumber the queue: a free GPU"
        return self._decision_at(cycle, [int(np.argmax(free))])

    def score_gpus(self, cycle):
        req = cycle.req
        if req.gpu_units > 0 or (req.exclusive and self._fractional_workload()):
            return self._score_fraction(cycle)
        free = cycle.free
        if not pressure(cycle) and cycle.req.n_gpus <= cycle.state.n_free:
            cycle.notes["reason"] = "free GPUs outnumber the queue: a free GPU"
            return np.where(free, 1.0, NEG_INF)  # only free GPUs qualify: first fit
        net, ok = self._weigh(cycle)
        cycle.notes["reason"] = "pressure: expected benefit net of risk"
        if not free.any() and not ok.any():
            cycle.notes["wait_reason"] = "no free GPU and no pair whose expected benefit clears its risk"
        return np.where(free, 1.0, np.where(ok, net, NEG_INF))

    def _spreads(self, cycle):
        """Per feasible GPU: σ of the job's and of the resident's predicted throughput, and whether
        the pair was ever measured on this cluster (both directions)."""
        state, idx, c = cycle.state, cycle.idx, cycle.class_id
        resident, free = cycle.resident, cycle.free
        sj, sr = np.zeros(len(idx)), np.zeros(len(idx))
        known = np.ones(len(idx), dtype=bool)
        types = state.gpu_type_id[idx] if len(state.gpu_types) > 1 else np.zeros(len(idx), dtype=int)
        for t in np.unique(types[~free]):
            name = state.gpu_types[t]
            sig, kn = self.pairs.sigma(name), self.pairs.known(name)
            sel = (types == t) & ~free
            r = resident[sel]
            sj[sel], sr[sel] = sig[c, r], sig[r, c]
            known[sel] = kn[c, r] & kn[r, c]
        return sj, sr, known, types

    def _weigh(self, cycle):
        """Per feasible GPU: the pair's score ``1 + 1 / (1 + T_con + risk·R)`` and whether it qualifies
        (see the docstring); the benefit and risk are kept in ``cycle.notes`` for ``--explain``."""
        state, req, idx = cycle.state, cycle.req, cycle.idx
        free = cycle.free
        busy = ~free & (cycle.job_tput > 0) & (cycle.res_tput > 0)
        jt, rt = cycle.job_tput, cycle.res_tput
        if self.pairs is None:
            sj = sr = np.full(len(idx), 0.25)
            known = np.zeros(len(idx), dtype=bool)
            types = np.zeros(len(idx), dtype=int)
        else:
            sj, sr, known, types = self._spreads(cycle)
        e_a = req.expected_duration()
        e_b = np.maximum(state.gpu_end0[idx] - cycle.ctx.now, 1.0)
        s_d = float(req.duration_sigma or 0.0)
        # B and its first-order sensitivities, in one vectorized call: rows = B, +δ on jt, rt, log E_a, log E_b
        d_t, d_l = 0.01, 0.01
        n = len(idx)
        ea = np.full((5, n), e_a)
        ea[3] *= math.exp(d_l)
        eb = np.tile(e_b, (5, 1))
        eb[4] *= math.exp(d_l)
        tj = np.tile(jt, (5, 1))
        tj[1] += d_t
        tr = np.tile(rt, (5, 1))
        tr[2] += d_t
        b = pair_benefit(ea, eb, tj, tr)
        benefit = b[0]
        risk = np.sqrt(((b[1] - benefit) / d_t * sj) ** 2 + ((b[2] - benefit) / d_t * sr) ** 2
                       + (((b[3] - benefit) ** 2 + (b[4] - benefit) ** 2) * (s_d / d_l) ** 2))
        explore = ~known & busy
        if explore.any():
            names = state.gpu_types
            left = np.array([self.explored.get(names[t], 0) < self.explore_budget for t in range(len(names))])
            explore &= left[types]
        k = np.where(explore, 0.0, self.risk)
        net = benefit - k * risk
        ok = busy & (net > 0)
        if free.any():  # a free GPU is there: the pair must also add throughput, as confidently
            ok &= jt + rt - 1.0 - k * np.sqrt(sj * sj + sr * sr) > 0
        cycle.notes["benefit"], cycle.notes["risk"], cycle.notes["explore"] = benefit, risk, explore
        # among qualifying pairs the lowest risk-adjusted completion time of the pair wins (SJF-BSBF's
        # T_con, plus the same multiple of the spread); a free GPU scores 1, below every pair
        t_con, _ = pair_times(e_a, e_b, jt, rt)
        return 1.0 + 1.0 / (1.0 + t_con + k * risk), ok

    def _decision(self, cycle, chosen, cands):
        decision = super()._decision(cycle, chosen, cands)
        explore = cycle.notes.get("explore")
        self._exploring.pop(decision.job_id, None)  # an earlier answer for the job (a dry run) counts no more
        if decision.shared and explore is not None and len(explore) == len(cycle.idx) and explore[chosen].any():
            gpu_type = cycle.state.gpu_types[int(cycle.state.gpu_type_id[cycle.idx[chosen[0]]])]
            self._exploring[decision.job_id] = gpu_type
            while len(self._exploring) > self.EXPLORING_KEPT:  # answers never applied (offers, dry runs)
                self._exploring.pop(next(iter(self._exploring)))
            decision.reason += f" (explores an unknown pair: {self.explored.get(gpu_type, 0)} of " \
                               f"{self.explore_budget} on {gpu_type} spent)"
        return decision

    def _candidates(self, cycle, limit=8):
        out = super()._candidates(cycle, limit)
        benefit, risk = cycle.notes.get("benefit"), cycle.notes.get("risk")
        if benefit is None or len(benefit) != len(cycle.idx):
            return out
        where = {cycle.state.gpu_label(int(g)): pos for pos, g in enumerate(cycle.idx)}
        for cand in out:
            pos = where.get(cand.where)
            if pos is not None and cand.shared:
                cand.note += (f"; benefit {benefit[pos]:.0f}s, risk {risk[pos]:.0f}s"
                              f"{' (explored: risk not counted)' if cycle.notes['explore'][pos] else ''}")
        return out
