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

import math
from typing import Dict, Optional, Tuple

import numpy as np

from ...interference.classes import micro_batch_speed, smaller_batches, with_batch
from ..framework import NEG_INF, NO_QUALIFYING_GPU, Feasible, Policy, SJFMixin, kept_after_release, nodes_holding
from ..request import Decision

# margin of horus's bound on a pair test (policies/horus.py): far above rounding (relative 1e-15), far
# below any difference that matters; a bound within it sends the decision to the exact test
PAIR_EPS = 1e-9


def pair_times(e_a, e_b, tput_a, tput_b):
    """(T_con, T_seq) of the SJF-BSBF rule (vectorized): :func:`pair_ends` without the first end."""
    t_con, t_seq, _ = pair_ends(e_a, e_b, tput_a, tput_b)
    return t_con, t_seq


def pair_ends(e_a, e_b, tput_a, tput_b):
    """(T_con, T_seq, the end of the one that ends first when they share) of the SJF-BSBF rule
    (vectorized); the other one ends at 2·T_con minus the first end.

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
    return t_con, e_b + 0.5 * e_a, shorter


def pair_benefit(e_a, e_b, tput_a, tput_b):
    """T_seq − T_con of the SJF-BSBF rule (vectorized); > 0 means sharing is worth it."""
    t_con, t_seq = pair_times(e_a, e_b, tput_a, tput_b)
    return t_seq - t_con


def share_ratio(t_a: float, t_b: float, speed: float = 1.0, gain: float = 0.0) -> float:
    """ρ such that ``T_seq − T_con ≥ gain·(E_a + e_b)`` holds exactly when the partner's remaining
    time e_b > ρ·E_a (t_a, t_b > 0, 0 < speed ≤ 1, 0 ≤ gain < ½; the job's exclusive time in T_con
    E_a / speed, in T_seq E_a). gain = 0 is SJF-BSBF's test T_con < T_seq; horus also asks
    ``gain ≥ bsbf_gain`` of a short job next to a long one.

    F = T_seq − T_con − gain·(E_a + e_b) is continuous and piecewise linear in e_b, negative or 0 at
    e_b = 0 (−E_a·(½(1/speed − 1) + gain)), in two pieces split at e_b = β·E_a, β = t_b / (speed·t_a):
    - the job ends last (e_b ≤ β·E_a): slope σ − gain, σ = (t_b − 1 + ½t_a) / t_b;
    - the partner ends last (e_b ≥ β·E_a): slope ½ − gain > 0, zero at ρ₂·E_a,
      ρ₂ = ((1 − ½t_b) / (speed·t_a) + gain − ½) / (½ − gain).
    If ρ₂ ≥ β the first piece stays at or below 0 and the threshold is ρ₂; otherwise the first piece
    rises through 0 at ρ₁·E_a, ρ₁ = (½(1/speed − 1) + gain) / (σ − gain) (0 when speed = 1 and gain
    = 0). So the test passes above one threshold, linear in E_a: a job that waits for a partner waits
    for it while the partner's remaining time shrinks, and a longer job of the class waits too."""
    t_a = max(t_a, 1e-9)  # as pair_times
    t_b = max(t_b, 1e-9)
    beta = t_b / (speed * t_a)
    rho2 = ((1.0 - 0.5 * t_b) / (speed * t_a) + gain - 0.5) / (0.5 - gain)
    rising = (t_b - 1.0 + 0.5 * t_a) / t_b - gain
    if rho2 >= beta or rising <= 0:
        return rho2
    return (0.5 * (1.0 / speed - 1.0) + gain) / rising


class ShareRatios:
    """ρ[c, k] (:func:`share_ratio` at ``gain``) for every pair of classes a PairTable knows on one
    GPU type: the least ρ with which a job of class c may join a job of class k running alone — the
    pair's when it fits (t_c,k > 0), else the least over c's sub-batched variants that fit
    (``variants(c)``: their class ids and speeds); inf when none may; −inf (any E_a may) where such a
    variant is faster than the job as submitted (the threshold form does not hold), or not slower by
    more than RATIO_MIN without being as fast. Kept in step with the table: a measured pair
    recomputes the cells it touches (``PairTable.changes_since``)."""

    def __init__(self, gain: float = 0.0):
        self.gain = gain
        self._kept: Dict[str, tuple] = {}  # gpu_type -> (matrix, n_observations, ρ, variant users, classes)

    def matrix(self, pairs, gpu_type: str, variants=None) -> np.ndarray:
        mat = pairs.matrix(gpu_type)
        n = len(mat)
        found = self._kept.get(gpu_type)
        if found is not None and found[4] is pairs.classes and len(found[2]) <= n:
            old_mat, seen, rho, old_users, _classes = found
            if old_mat is not mat:  # new classes: their rows and columns (a user may name any class)
                rho, users, rows = self._grown(mat, rho, variants)
                if rows:  # classes that gained a sub-batched variant among the new ones
                    for c in rows:
                        rho[c] = [self._cell(mat, c, k, variants) for k in range(n)]
            else:
                users = old_users
            if seen != pairs.n_observations:
                changes = pairs.changes_since(seen)
                if changes is None:
                    found = None
                else:
                    for t, a, b in changes:
                        if t == gpu_type:
                            cells = {(a, b), (b, a)}  # the pair, either way round, and where a or b is a variant
                            cells.update((c, b) for c in users.get(a, ()))
                            cells.update((c, a) for c in users.get(b, ()))
                            for c, k in cells:
                                rho[c, k] = self._cell(mat, c, k, variants)
            if found is not None:
                self._kept[gpu_type] = (mat, pairs.n_observations, rho, users, pairs.classes)
                return rho
        rho = np.array([[self._cell(mat, c, k, variants) for k in range(n)] for c in range(n)]).reshape(n, n)
        self._kept[gpu_type] = (mat, pairs.n_observations, rho, self._users(n, variants), pairs.classes)
        return rho

    def _grown(self, mat, old, variants):
        """(ρ, variant users, rows to redo) after new classes joined the table: the old cells kept
        (the table keeps its old values), the new rows and columns computed, and the old classes
        whose sub-batched variants changed named."""
        m, n = len(old), len(mat)
        rho = np.empty((n, n))
        rho[:m, :m] = old
        for c in range(n):
            for k in range(m if c < m else 0, n):
                rho[c, k] = self._cell(mat, c, k, variants)
        users = self._users(n, variants)
        rows = [c for c in range(m) if variants is not None
                and any(int(v) >= m for v in variants(c)[0])]
        return rho, users, rows

    @staticmethod
    def _users(n, variants) -> Dict[int, list]:
        """Variant class id -> the classes it is a sub-batched variant of."""
        users: Dict[int, list] = {}
        if variants is not None:
            for c in range(n):
                for v in variants(c)[0]:
                    users.setdefault(int(v), []).append(c)
        return users

    def _cell(self, mat, c, k, variants) -> float:
        mine = mat.item(c, k)
        if mine > 0:
            return share_ratio(mine, mat.item(k, c), 1.0, self.gain)
        rho = math.inf
        if variants is not None:
            ids, speeds = variants(c)
            for v, speed in zip(ids.tolist(), speeds.tolist()):
                t_a, t_b = mat.item(v, k), mat.item(k, v)
                if t_a > 0 and t_b > 0 and speed > 0:
                    if 1 - RATIO_MIN <= speed and speed != 1.0:
                        return -math.inf
                    rho = min(rho, share_ratio(t_a, t_b, speed, self.gain))
        return rho


# margins of the threshold test (:meth:`SJFBSBF._may_share`), far above rounding (1e-16), far below any
# difference that matters: a job within RATIO_EPS (relative) of its class's threshold goes to the exact
# test, and so does any job next to a class whose ρ is below RATIO_MIN, or whose sub-batched variant
# is within RATIO_MIN of the submitted batch's speed (where the pair test's rounding, seen as a
# remaining time, is no longer far below the threshold)
RATIO_EPS = 1e-7
RATIO_MIN = 1e-6

WAIT_REASON = "sharing would not beat waiting (SJF-BSBF rule)"


def share_limits(e_b, rho):
    """The E_a below which a job may join residents of remaining times ``e_b`` whose pairs have the
    ratios ``rho`` (:func:`share_ratio`): e_b / ρ; 0 where ρ = inf (the pair does not fit), inf where
    ρ < RATIO_MIN (too small to trust: the exact test decides)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        limits = np.asarray(e_b / rho, dtype=float)
    limits[rho < RATIO_MIN] = np.inf
    return limits


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
        feasible GPU takes the first one (a free GPU scores above any pair, first fit among them); on
        one GPU type, a job waits at once when the share limits show that too few GPUs can take it
        (:meth:`_quick_wait`). Held equal to the pipeline by tests/test_placement.py."""
        req = cycle.req
        feasible = cycle.feasible
        if feasible is None or feasible.idx is not cycle.idx:
            feasible = Feasible(cycle.state, np.array(cycle.idx))
        if feasible.first_free >= 0 and req.n_gpus == 1:
            self._variant_of_gpu = {}
            return self._decision_at(cycle, [feasible.first_free])
        if self.pairs is None or len(cycle.state.gpu_types) != 1:
            return None
        reason = self._quick_wait(cycle.state, feasible, cycle.class_id, req, cycle.ctx.now)
        if reason is None:
            return None
        return Decision(req.job_id, False, self.name, reason=reason, n_feasible=len(cycle.idx))

    def wait_reason(self, state, req, ctx):
        """The wait :meth:`decide_quickly` would answer, from this cycle's feasible GPUs for the
        request's shape on this cluster version (``Feasible``, :meth:`cycle_feasible`), without
        building the decision: most of a saturated queue waits, and the cycle asks this first."""
        if self.pairs is None or req.n_gpus == 0 or req.gpu_units > 0 or len(state.gpu_types) != 1 \
                or type(self).decide_quickly is not SJFBSBF.decide_quickly:
            return None
        feasible = self.cycle_feasible(state, req, ctx)
        if feasible is None:
            return None
        return self._quick_wait(state, feasible, state.classes.ids[req.job_class], req, ctx.now)

    def wait_epoch(self, state, ctx):
        """:meth:`wait_reason` reads, besides the cluster and the clock, only the pair table (its
        classes; the measurements of the job's class, :meth:`wait_stamp`): a wait holds later, after
        placements and for a longer job, since every share limit is e_b / ρ or a constant (the
        remaining times e_b only shrink), the job's E_a is compared against them, and a placement
        only turns a GPU that may take the job into one that may not (a free one busy, a shared one
        full)."""
        if type(self).wait_reason is not SJFBSBF.wait_reason or type(self).decide_quickly is not SJFBSBF.decide_quickly \
                or type(self)._quick_wait is not SJFBSBF._quick_wait or self.pairs is None:
            return None
        return ("sjf-bsbf", len(state.classes.names), id(self.pairs.classes))

    def waits_after_release(self, state, ctx, waits, nodes):
        """Every wait :meth:`_quick_wait` gives says that fewer than ``nodes`` nodes hold
        ``gpus_per_node`` feasible GPUs the job may take: free ones, or shared ones whose limit e_b / ρ
        is above E_a (one GPU: none at all, with the sub-batched ρ when ``sub_batch``; the class
        limits are the largest of the GPUs'): a release changes that only on its nodes
        (:func:`~..framework.kept_after_release`)."""
        gpu_type = state.gpu_types[0]

        def limits(req, c, residents, e_b):
            rho = self._ratio_matrix(gpu_type, bool(self.sub_batch and req.n_gpus == 1), state.classes)
            return share_limits(e_b, rho[c][residents])

        return kept_after_release(state, waits, nodes, self.max_jobs_per_gpu, ctx.now, limits, RATIO_EPS)

    def wait_stamp(self, req):
        """A job's share limits read ρ's row of its class only: the pairs of its class and, with
        sub-batching, of its smaller-batch variants (:class:`ShareRatios`) — their measurements."""
        measured = self.pairs.measured
        if not self.sub_batch:
            return measured.get(req.job_class, 0)
        # (kept per class while no pair is measured and no class is new: asked at every known wait)
        cache = self.__dict__.setdefault("_stamps", {})
        names = self.pairs.classes.names
        version = (id(self.pairs), self.pairs.n_observations, id(names), len(names))
        found = cache.get(req.job_class)
        if found is not None and found[0] == version:
            return found[1]
        variants = self._smaller_batches(req.job_class, names)
        stamp = (measured.get(req.job_class, 0),) + tuple(measured.get(v, 0) for _, _, v in variants)
        cache[req.job_class] = (version, stamp)
        return stamp

    def _quick_wait(self, state, feasible, c, req, now) -> Optional[str]:
        """The reason the pipeline gives a job that must wait, when the share limits show it (one GPU
        type, at least ``n_gpus`` feasible GPUs); None: ask the pipeline.

        One GPU, none free: no resident class may be joined (:meth:`_may_share`). Several GPUs: fewer
        nodes than it asks have ``gpus_per_node`` GPUs that may take the job (free, or a resident it
        may join: :meth:`_gpu_limits`); the reason then says whether some GPU surely could (the
        pipeline's "no GPU qualifies")."""
        if req.n_gpus == 1:
            if feasible.first_free >= 0 or self._may_share(state, feasible, c, req, now):
                return None
            return WAIT_REASON
        if feasible.first_free >= 0 and int(np.count_nonzero(state.node_free >= req.gpus_per_node)) >= req.nodes:
            return None  # free GPUs may be enough: the pipeline (the test below would cost as much)
        limits = self._gpu_limits(state, feasible, c, now)
        e_a = req.expected_duration()
        may = limits > e_a * (1.0 - RATIO_EPS)
        n_may = int(np.count_nonzero(may))
        if n_may == 0:
            return WAIT_REASON
        if n_may >= req.n_gpus and len(nodes_holding(state, feasible.idx[may], req.gpus_per_node)) >= req.nodes:
            return None  # as the pipeline's select: enough nodes with GPUs that may take the job
        # whether some GPU surely scores decides the pipeline's reason (an infinite limit of a busy GPU
        # only says "may": ρ too small to trust); unsure: ask the pipeline
        if feasible.first_free < 0 and not (np.isfinite(limits) & (limits > e_a * (1.0 + RATIO_EPS))).any():
            return None
        return NO_QUALIFYING_GPU

    def _gpu_limits(self, state, feasible, c, now) -> np.ndarray:
        """Per feasible GPU, the E_a below which a job of class ``c`` (not sub-batched) may take it:
        inf when free, e_b / ρ when it runs a job alone (:meth:`_share_limits`' terms; inf where
        ρ < RATIO_MIN, 0 where the pair does not fit). Kept in ``Feasible.memo``."""
        gpu_type = state.gpu_types[0]
        mat = self.pairs.matrix(gpu_type)
        key = ("bsbf-gpu-limits", id(self), c, now, len(mat), self.pairs.n_observations)
        found = feasible.memo.get(key)
        if found is None:
            resident = feasible.resident
            busy = resident >= 0
            found = np.full(len(feasible.idx), np.inf)
            r = self._ratio_matrix(gpu_type, False, state.classes)[c][resident[busy]]
            found[busy] = share_limits(np.maximum(state.gpu_end0[feasible.idx[busy]] - now, 1.0), r)
            feasible.memo[key] = found
        return found

    def _may_share(self, state, feasible, c, req, now) -> bool:
        """Whether some feasible GPU (one GPU type, none free) may get a finite score: a pair, or a
        sub-batched pair, whose T_con may beat T_seq (False: the pipeline scores every GPU -inf). The
        job's expected duration E_a against its class's longest duration that may still share
        (:meth:`_share_limits`), with a margin (``RATIO_EPS``)."""
        limits = self._share_limits(state, feasible, bool(self.sub_batch and req.n_gpus == 1), now)
        return req.expected_duration() * (1.0 - RATIO_EPS) < limits[c]

    def _share_limits(self, state, feasible, sub, now) -> np.ndarray:
        """Per job class c, the E_a below which a job of the class may share a feasible GPU (inf: any
        may): the largest e_b / ρ (:meth:`_ratio_matrix`) over the resident classes, e_b the greatest
        remaining time among their residents (``max(end − now, 1)``). Kept in ``Feasible.memo`` for
        this cluster version, time and pair table."""
        gpu_type = state.gpu_types[0]
        mat = self.pairs.matrix(gpu_type)
        key = ("bsbf-limits", id(self), sub, now, len(mat), self.pairs.n_observations)
        found = feasible.memo.get(key)
        if found is None:
            rho = self._ratio_matrix(gpu_type, sub, state.classes)
            lo, hi = feasible.end_range(len(mat))
            k = np.flatnonzero(hi >= lo)
            if len(k) == 0:
                found = np.zeros(len(mat))
            else:
                found = share_limits(np.maximum(hi[k] - now, 1.0), rho[:, k]).max(axis=1)
            feasible.memo[key] = found
        return found

    def _ratio_matrix(self, gpu_type, sub, classes) -> np.ndarray:
        """ρ[c, k] (:class:`ShareRatios`): with ``sub``, a pair that does not fit takes its
        sub-batched variants' ρ."""
        kept = self.__dict__.setdefault("_share_ratios", {})
        ratios = kept.get(sub)
        if ratios is None:
            ratios = kept[sub] = ShareRatios()
        variants = (lambda c: self._variant_speeds(classes.names[c], gpu_type, classes)) if sub else None
        return ratios.matrix(self.pairs, gpu_type, variants)

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
            cycle.notes["wait_reason"] = WAIT_REASON
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
