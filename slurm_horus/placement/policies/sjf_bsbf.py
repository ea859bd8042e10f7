"""sjf-bsbf: shortest job first, best-sharing-benefit first.

Source: Luo et al., "Scheduling Deep Learning Jobs in Multi-Tenant GPU Clusters via Wise Resource
Sharing" (SJF-BSBF, arXiv 2407.13088) and its reference code (``bsbf_alloc_res``). Rule: SJF queue
order; free GPUs are taken first; otherwise the new job ``a`` may join the job ``b`` running alone
on a GPU only if their mean completion time when sharing beats ``a`` waiting for ``b``. With E the
remaining exclusive time and ξ the slowdown (Ê = ξ·E): if Ê_a ≥ Ê_b,
T_con = ½E_a + (1 − 1/(2ξ_a))·Ê_b, symmetric otherwise; T_seq = E_b + ½E_a; share iff
T_con < T_seq. Among qualifying GPUs the **lowest T_con** wins (the reference sorts the candidate
partners by T_con). At most 2 jobs per GPU.

Sub-batching (the paper's answer to a pair that does not fit in memory): when the predicted pair
cannot run together (a predicted 0: memory), the job may run with a smaller per-step batch of its
own model and accumulate gradients over ``batch / micro`` steps, keeping the global batch. Such a
variant is considered only if the variant's pair is predicted to fit, and it must pass the same
T_con < T_seq test, T_con computed for a job that runs sub-batched for its whole run: exclusive time
E_a / s, with s the solo samples/s of the smaller batch over that of the submitted one (the solo
profiles: Gavel measured every batch size of a model), and the variant's pair values; T_seq (waiting,
then running as submitted) unchanged. The largest micro-batch that qualifies is used;
the decision carries ``micro_batch`` and ``grad_accum`` (HORUS_MICRO_BATCH / HORUS_GRAD_ACCUM in the
job's environment). Our reading: the paper does not say how the micro-batch is chosen; only
single-GPU jobs are sub-batched here, and only among batch sizes of the same model that the class
index knows and that divide the submitted batch.
"""

from typing import Dict, Optional, Tuple

import numpy as np

from ...interference.classes import micro_batch_speed, smaller_batches, with_batch
from ..framework import NEG_INF, Feasible, Policy, SJFMixin
from ..request import Decision

# margin of the shortcuts' bounds on a pair test: far above rounding (relative 1e-15), far below any
# difference that matters; a bound within it sends the decision to the exact test
PAIR_EPS = 1e-9


def pair_times(e_a, e_b, tput_a, tput_b):
    """(T_con, T_seq) of the SJF-BSBF rule (vectorized).

    Written with tput = 1/ξ: Ê = E/tput, and (1 − 1/(2ξ))·Ê = Ê − tput·Ê/2, so the branch that
    applies is the one of the smaller Ê (fewer temporaries on the decision path).
    """
    tput_a = np.maximum(tput_a, 1e-9)
    tput_b = np.maximum(tput_b, 1e-9)
    eh_a = e_a / tput_a
    eh_b = e_b / tput_b
    a_last = eh_a >= eh_b
    shorter = np.minimum(eh_a, eh_b)
    t_con = np.where(a_last, 0.5 * e_a + shorter * (1.0 - 0.5 * tput_a),
                     0.5 * e_b + shorter * (1.0 - 0.5 * tput_b))
    return t_con, e_b + 0.5 * e_a


def pair_benefit(e_a, e_b, tput_a, tput_b):
    """T_seq − T_con of the SJF-BSBF rule (vectorized); > 0 means sharing is worth it."""
    t_con, t_seq = pair_times(e_a, e_b, tput_a, tput_b)
    return t_seq - t_con


def may_beat_waiting(e_a_con, e_a, e_b, tput_a, tput_b):
    """Whether ``T_con < T_seq`` may hold for some remaining time of the partner in an interval:
    ``e_b`` holds the interval's ends (first half: the least, second half: the greatest, one per
    pair of throughputs in ``tput_a``/``tput_b``). ``e_a_con`` is the job's exclusive time in T_con
    (E_a, or E_a / speed sub-batched; one per pair, or one for all), ``e_a`` the one in T_seq.

    T_seq − T_con is continuous and piecewise linear in e_b, in two pieces, the later (the job ends
    last) of slope ½: convex or rising, it is largest at an end of the interval, so it is positive
    somewhere only if it is positive at an end (up to a margin far above rounding, ``PAIR_EPS``
    times the largest values involved)."""
    tput_a = np.concatenate((tput_a, tput_a))
    tput_b = np.concatenate((tput_b, tput_b))
    if np.ndim(e_a_con):
        e_a_con = np.concatenate((e_a_con, e_a_con))
    t_con, _ = pair_times(e_a_con, e_b, tput_a, tput_b)
    t_seq = e_b + 0.5 * e_a
    half = len(e_b) // 2
    scale = np.abs(t_seq) + np.abs(t_con)
    # the margin scales with the interval's largest values: the bound holds between the ends
    scale = np.maximum(scale[:half], scale[half:]) + (e_a_con[half:] if np.ndim(e_a_con) else e_a_con) \
        + e_a + e_b[half:]
    slack = t_seq - t_con
    return np.maximum(slack[:half], slack[half:]) + PAIR_EPS * scale > 0


def batch_speed(solo_tput: Dict[Tuple[str, str], float], gpu_type: str, job_class: str,
                variant: str) -> Optional[float]:
    """Samples/s of ``variant`` (a smaller batch of ``job_class``'s model) over those of
    ``job_class`` on ``gpu_type`` (solo throughputs in steps/s); None when either is unknown."""
    return micro_batch_speed(job_class, solo_tput.get((gpu_type, job_class)),
                             variant, solo_tput.get((gpu_type, variant)))


class SJFBSBF(SJFMixin, Policy):
    name = "sjf-bsbf"
    share = True
    max_jobs_per_gpu = 2
    uses_duration = True
    sub_batch = True  # consider a smaller per-step batch when a pair does not fit in memory

    def __init__(self, pairs=None, solo_tput: Optional[Dict[Tuple[str, str], float]] = None, **options):
        super().__init__(pairs, **options)
        self.solo_tput = dict(solo_tput or {})
        self._variant_of_gpu: Dict[int, Tuple[int, int, str]] = {}  # last decision: gpu -> (micro, accum, class)
        self._sub_t_con = None  # last decision: T_con of the sub-batched candidates (NaN elsewhere)

    # ---- sub-batching: replace predicted-OOM pairs by the best micro-batch variant that fits -----
    def _fill_predictions(self, cycle):
        super()._fill_predictions(cycle)
        self._variant_of_gpu = {}
        self._sub_t_con = None
        if not self.sub_batch or self.pairs is None or cycle.req.n_gpus != 1:
            return
        oom = ~cycle.free & (cycle.job_tput <= 0)
        if not oom.any():
            return
        state = cycle.state
        variants = self._smaller_batches(cycle.req.job_class, state.classes.names)
        if not variants:
            return
        job_tput, res_tput = cycle.job_tput.copy(), cycle.res_tput.copy()
        self._sub_t_con = np.full(len(cycle.idx), np.nan)
        e_a = cycle.req.expected_duration()
        positions = np.flatnonzero(oom)
        gpus = cycle.idx[positions]
        types = state.gpu_type_id[gpus]
        open_ = np.ones(len(positions), dtype=bool)  # no variant chosen yet
        for micro, accum, variant in variants:  # largest micro-batch first
            v = state.classes.ids[variant]
            for t in np.unique(types):
                gpu_type = state.gpu_types[t]
                speed = batch_speed(self.solo_tput, gpu_type, cycle.req.job_class, variant)
                sel = open_ & (types == t)
                if speed is None or not sel.any():
                    continue
                mat = self.pairs.matrix(gpu_type)
                resident = cycle.resident[positions[sel]]
                mine, theirs = mat[v, resident], mat[resident, v]
                e_b = np.maximum(state.gpu_end0[gpus[sel]] - cycle.ctx.now, 1.0)
                # sub-batched, the job runs as a job of E_a / speed alone for its whole run (after its
                # partner too); waiting, it would run as submitted: T_seq is unchanged
                t_con, _ = pair_times(e_a / speed, e_b, mine, theirs)
                ok = (mine > 0) & (theirs > 0) & (t_con < e_b + 0.5 * e_a)
                chosen = np.flatnonzero(sel)[ok]
                job_tput[positions[chosen]] = speed * mine[ok]
                res_tput[positions[chosen]] = theirs[ok]
                self._sub_t_con[positions[chosen]] = t_con[ok]
                open_[chosen] = False
                for g in gpus[chosen]:
                    self._variant_of_gpu[int(g)] = (micro, accum, variant)
        cycle.job_tput, cycle.res_tput = job_tput, res_tput

    def _smaller_batches(self, job_class, names):
        """:func:`smaller_batches` of ``job_class`` among the known classes (kept per class until
        a new class is known)."""
        cache = self.__dict__.setdefault("_variants_cache", {})
        key = (job_class, id(names), len(names))
        found = cache.get(key)
        if found is None:
            found = cache[key] = smaller_batches(job_class, names)
        return found

    def decide_quickly(self, cycle):
        """The pipeline's answer without computing T_con on every shared GPU: a 1-GPU job with a free
        feasible GPU takes the first one (a free GPU scores above any pair, first fit among them);
        with no free feasible GPU on one GPU type, a job waits at once when no pair can beat waiting
        (:meth:`_may_share`). Held equal to the pipeline by tests/test_placement.py."""
        req = cycle.req
        feasible = cycle.feasible
        if feasible is None or feasible.idx is not cycle.idx:
            feasible = Feasible(cycle.state, np.array(cycle.idx))
        first_free = feasible.first_free
        if first_free >= 0:
            if req.n_gpus != 1:
                return None
            self._variant_of_gpu = {}
            return self._decision_at(cycle, [first_free])
        if self.pairs is None or len(cycle.state.gpu_types) != 1 or self._may_share(cycle, feasible):
            return None
        return Decision(req.job_id, False, self.name, reason="sharing would not beat waiting (SJF-BSBF rule)",
                        n_feasible=len(cycle.idx))

    def _may_share(self, cycle, feasible) -> bool:
        """Whether some feasible GPU (one GPU type, none free) may get a finite score: a pair, or a
        sub-batched pair, whose T_con may beat T_seq (:func:`may_beat_waiting` at the least and the
        greatest expected end of each resident class). False: the pipeline scores every GPU -inf."""
        state, req = cycle.state, cycle.req
        gpu_type = state.gpu_types[0]
        mat = self.pairs.matrix(gpu_type)
        lo, hi = feasible.end_range(len(mat))
        k = np.flatnonzero(hi >= lo)
        if len(k) == 0:
            return False
        c = cycle.class_id
        e_a = req.expected_duration()
        now = cycle.ctx.now
        e_b = np.maximum(np.concatenate((lo[k], hi[k])) - now, 1.0)
        mine = mat[c, k]
        if may_beat_waiting(e_a, e_a, e_b, mine, mat[k, c]).any():
            return True
        if not self.sub_batch or req.n_gpus != 1:
            return False
        oom = k[mine <= 0]
        if len(oom) == 0:
            return False
        ids, speeds = self._variant_speeds(req.job_class, gpu_type, state.classes)
        if len(ids) == 0:
            return False
        # every (variant, resident class) at once: variant-major, as the pipeline's loop
        n = len(ids)
        mine, theirs = mat[np.ix_(ids, oom)].ravel(), mat[np.ix_(oom, ids)].T.ravel()
        e_b = np.maximum(np.concatenate((np.tile(lo[oom], n), np.tile(hi[oom], n))) - now, 1.0)
        fits = (mine > 0) & (theirs > 0)
        return bool((fits & may_beat_waiting(np.repeat(e_a / speeds, len(oom)), e_a, e_b, mine, theirs)).any())

    def _variant_speeds(self, job_class, gpu_type, classes):
        """The sub-batched variants of ``job_class`` with a known speed: their class ids and speeds
        (:func:`batch_speed`), kept until a new class is known."""
        cache = self.__dict__.setdefault("_speeds_cache", {})
        key = (job_class, gpu_type, id(classes.names), len(classes.names))
        found = cache.get(key)
        if found is None:
            ids, speeds = [], []
            for _micro, _accum, variant in self._smaller_batches(job_class, classes.names):
                speed = batch_speed(self.solo_tput, gpu_type, job_class, variant)
                if speed is not None:
                    ids.append(classes.ids[variant])
                    speeds.append(speed)
            found = cache[key] = (np.array(ids, dtype=np.intp), np.array(speeds, dtype=np.float64))
        return found

    def score_gpus(self, cycle):
        free = cycle.free
        score = np.full(len(cycle.idx), NEG_INF)
        # a free GPU beats any sharing; among free GPUs first fit
        score[free] = 1e9
        if not free.all():
            shared = ~free
            e_a = cycle.req.expected_duration()
            e_b = np.maximum(cycle.state.gpu_end0[cycle.idx[shared]] - cycle.ctx.now, 1.0)
            t_con, t_seq = pair_times(e_a, e_b, cycle.job_tput[shared], cycle.res_tput[shared])
            if self._sub_t_con is not None:  # sub-batched candidates: their own T_con (see above)
                sub = self._sub_t_con[shared]
                t_con = np.where(np.isnan(sub), t_con, sub)
            # the reference's tie-break: among qualifying partners the lowest T_con
            score[shared] = np.where(t_con < t_seq, -t_con, NEG_INF)
        if np.isinf(score).all() and not free.any():
            cycle.notes["wait_reason"] = "sharing would not beat waiting (SJF-BSBF rule)"
        return score

    def decide(self, state, req, ctx=None, explain=False):
        decision = super().decide(state, req, ctx, explain)
        if decision.placed and decision.shared and len(decision.gpu_ids) == 1:
            found = self._variant_of_gpu.get(decision.gpu_ids[0])
            if found is not None:
                micro, accum, variant = found
                decision.micro_batch, decision.grad_accum = micro, accum
                decision.reason = (f"sub-batched to fit in memory: {micro} samples per step x {accum} "
                                   f"accumulation steps (as {variant}); " + decision.reason)
        self._variant_of_gpu = {}
        return decision

    def job_record(self, req, decision, now):
        job = super().job_record(req, decision, now)
        if decision.micro_batch:
            job.job_class = with_batch(req.job_class, decision.micro_batch)  # what runs (and interferes)
        return job
