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
  if no waiting job pairs with ``r`` better by more than ``partner_slack`` (the slot is kept for it;
  not for a job whose pair with ``r`` ``probe_once`` holds back: it could not take it);
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
* one probe at a time (``probe_once``): a pair only predicted (not measured both ways on this
  cluster) is formed only where it shares no GPU of that type already, so that one running copy
  measures it instead of a cycle pairing many jobs on a prediction the first measurement would have
  corrected; which pairs share a GPU is read from the cluster state (``placement/sharing.py``);
  with ``probe_hold`` (off: cross-validated) a probe's pair also stays held for one feed of the
  history store from its start, so that a probe that fails at once (out of memory) is not tried
  again and again before its measurement comes back;
* fractional requests (``gpu_units``: shards, milli-GPU), CPU-only ones, and whole GPUs asked
  exclusively where the workload has fractional requests: FGD's rule
  (``placement/fragmentation.py``, ATC'23) — the node whose GPU grows the expected fragmentation
  least (within ``frag_tolerance`` milli-GPU; equal nodes in the tie order: first fit, or with
  ``tie_break=order`` an order drawn from ``seed`` as FGD's simulator does), and inside that node,
  of its GPUs of that least increase, the one whose residents the job is predicted to slow least
  (the job's throughput + ½ its partner's; FGD takes the first); a GPU where the job or its first
  resident is predicted under ``min_tput`` is never taken: a fuller cluster that does not slow its
  jobs down. ``quantize`` and ``cpu_shapes``: FGD's integer scores and typical workload
  (``policies/fgd.py``), so that ``horus/quantize=true/tie_break=order/cpu_shapes=true`` is FGD's
  rule as its simulator scores it plus the interference rules.

Queue order (``order``: ``sjf`` or ``fifo``) and the placement rule are independent choices.
"""

import functools
import math
from collections import deque

import numpy as np

from ..duration import FEED_EVERY_S
from ..fragmentation import FragmentationModel
from ..framework import (NEG_INF, NO_QUALIFYING_GPU, Cycle, Feasible, Policy, kept_after_release, nodes_holding,
                         pressure, shareable_gpus)
from ..request import Decision
from ..sharing import SharingPairs
from .fgd import _sigmoid_score as _fgd_score
from .sjf_bsbf import PAIR_EPS, RATIO_EPS, ShareRatios, pair_benefit, share_limits


NO_PAIR = "no free GPU and no pair predicted worth sharing"
TESTS_KEPT = 4096  # class tests kept across cycles (class × window × its best partners) before starting over
PROBE_LOG_KEEP = 1024  # probe_once's moves remembered for the class tests kept (older: start over)


class Horus(Policy):
    name = "horus"
    share = True
    max_jobs_per_gpu = 2
    min_combined = 1.05  # for a pair only predicted: low, so that unknown pairs get tried (explored)
    min_combined_known = 1.2  # for a pair already measured on this cluster
    min_tput = 0.35
    order_rule = "sjf"
    uses_duration = True
    reads_window = True
    partner_slack = 0.1
    guard = 0.8
    guard_queue = 2.0  # guard only while the queue asks for at most this many GPUs per GPU (0: always)
    bsbf_gain = 0.2  # share also when SJF-BSBF's benefit is at least this share of the pair's work
    require_benefit = True  # a pair must also pass SJF-BSBF's test (sharing beats waiting)
    free_score = 1.0  # a free GPU under pressure ranks like a pair of this value
    score_rule = "own"  # or "combined": rank qualifying pairs by the sum of both throughputs
    frag_tolerance = 0.0  # milli-GPU: fragmentation increases this close to the least count as equal
    # FGD's rule as its simulator scores it (``policies/fgd.py``): integer plugin scores, equal ones
    # then go to the interference tie-break; CPU-only shapes in the typical workload
    quantize = False
    cpu_shapes = False
    frac_free_value = 1.5  # a free GPU among a fraction's equal candidates ranks like a pair of this value
    tie_break = "first"  # or "order": equal nodes in an order drawn from ``seed`` (FGD's simulator)
    seed = 0
    calibrate = 0.0  # measured pairs also correct the unmeasured ones (PairTable.calibrate: its shrinkage); 0: off
    probe_once = True  # a pair only predicted is formed where it shares no GPU already (docstring)
    # a probe's pair stays held ``probe_hold_s`` from its start (its measurement reaches horusd at the
    # next feed of the history store), even when the probe fails at once (out of memory): far fewer
    # failed starts, a worse mean JCT on the tuning family (cross-validated: off; docs/simulator.md)
    probe_hold = False
    probe_hold_s = FEED_EVERY_S
    counts_probes = True  # count the jobs placed next to a pair only predicted (``explored:<GPU type>``)

    PROBES_KEPT = 4096  # probing answers remembered until their job runs (horusd's offers are never all taken)

    def __init__(self, pairs=None, fragmentation=None, **options):
        super().__init__(pairs, **options)
        if self.calibrate > 0 and pairs is not None:
            pairs.calibrate = self.calibrate  # (each policy learns on its own table)
        if self.tie_break not in ("first", "order"):
            raise ValueError("policy horus: tie_break must be first or order")
        self.fragmentation = fragmentation if fragmentation is not None else FragmentationModel()
        if self.cpu_shapes:
            self.fragmentation.include_cpu = True
        self._rank = np.zeros(0)
        # GPU type -> jobs placed next to a pair only predicted (what learning it cost); horus-risk:
        # those placed with an unknown pair on the expected benefit alone (its budget spent)
        self.explored = {}
        self._probes = {}  # job id -> (GPU type, pair key), for a decision that forms a pair only predicted
        self._held = {}  # pair key (GPU type id, class id, class id) -> held until (probe_once)

    def _node_rank(self, state):
        """Per node: its place in the tie order — the node id (first fit), or with ``tie_break=order``
        a permutation drawn once from ``seed`` (FGD's simulator: the smallest of per-seed names)."""
        if self.tie_break != "order":
            return np.arange(len(state.nodes), dtype=float)
        if len(self._rank) != len(state.nodes):
            order = np.random.default_rng([int(self.seed), 7]).permutation(len(state.nodes))
            self._rank = np.empty(len(state.nodes))
            self._rank[order] = np.arange(len(state.nodes))
        return self._rank

    def running_job(self, req, decision, now):
        # the workload fragmentation is measured against: the requests that ran (a decision may be
        # asked and not applied: a dry run, an offer, a job that waits)
        self.fragmentation.observe(req)
        record = super().running_job(req, decision, now)
        probed = self._probes.pop(req.job_id, None)
        if probed is not None and decision.shared:
            gpu_type, key = probed
            self.explored[gpu_type] = self.explored.get(gpu_type, 0) + 1
            # held until the next feed has told what it measured, should it fail at once (out of
            # memory) and leave no trace in the state; while it runs, the state holds its pair
            self._hold([key], now)
        return record

    def counters(self):
        return {f"explored:{gpu_type}": count for gpu_type, count in sorted(self.explored.items())}

    def carry_over(self, old):
        super().carry_over(old)
        if self.counts_probes and isinstance(old, Horus) and old.counts_probes:
            self.explored = dict(old.explored)
            self._probes = dict(old._probes)
            names = old.pairs.classes.names if old.pairs is not None else None
            if names is not None and self.pairs is not None:  # (class ids of the new table)
                for (t, a, b), until in old._held.items():
                    self._held[(t,) + self._pair_of(names[a], names[b])] = until

    def _decision(self, cycle, chosen, cands):
        decision = super()._decision(cycle, chosen, cands)
        if self.counts_probes and self.pairs is not None and not self.pairs.exact:
            self._probes.pop(decision.job_id, None)  # an earlier answer for the job (a dry run) counts no more
            probed = self._probe_of(cycle, chosen) if decision.shared else None
            if probed is not None:
                self._probes[decision.job_id] = probed
                while len(self._probes) > self.PROBES_KEPT:
                    self._probes.pop(next(iter(self._probes)))
        return decision

    def _probe_of(self, cycle, chosen):
        """(GPU type, pair key) of the pair only predicted that the decision at ``chosen`` forms with a
        resident (None: every pair it forms is measured)."""
        state, c = cycle.state, int(cycle.class_id)
        for pos in chosen:
            r = int(cycle.resident[pos])
            if r >= 0:
                t = int(state.gpu_type_id[cycle.idx[pos]])
                key = (t, min(c, r), max(c, r))
                if self._unmeasured(state, key):
                    return state.gpu_types[t], key
        return None

    def _probe_version(self, state, now):
        """``probe_once``: a number that moves whenever the pairs only predicted that are held change:
        one starts sharing its first GPU or leaves its last one, or (``probe_hold``) a probe's hold
        (``probe_hold_s`` from its start: its measurement comes back at the next feed) ends by
        ``now`` (what :meth:`_probing` reads besides the pair table's measurements); None when the
        rule is off (or every pair is known: the simulator's truth). What is held at ``now`` depends
        on the state and ``now`` only, not on when this was last asked."""
        if not self.probe_once or self.pairs is None or self.pairs.exact:
            return None
        tracker = self._tracker()
        moved = tracker.update(state, functools.partial(self._unmeasured, state))
        if moved:
            self._probe_moved(moved)
        if now >= self._held_next:
            ended = [key for key, until in self._held.items() if until <= now]
            for key in ended:
                del self._held[key]
            self._held_next = min(self._held.values(), default=math.inf)
            self._probe_moved(ended)
        return self._probe_moves

    def _tracker(self):
        tracker = self.__dict__.get("_sharing")
        if tracker is None:
            tracker = self._sharing = SharingPairs()
            self._probe_moves = 0
            self._probe_log = deque(maxlen=PROBE_LOG_KEEP)  # per move: the classes whose tests it changed
            self._held_next = min(self._held.values(), default=math.inf)  # the earliest hold's end
        return tracker

    def _hold(self, keys, start):
        """``probe_hold``: hold the pairs ``keys`` until ``start`` + ``probe_hold_s``."""
        if not keys or not self.probe_once or not self.probe_hold or self.pairs is None or self.pairs.exact:
            return
        self._tracker()
        until = start + self.probe_hold_s
        for key in keys:
            self._held[key] = max(self._held.get(key, until), until)
        self._held_next = min(self._held_next, until)
        self._probe_moved(keys)

    def _probe_moved(self, keys):
        if keys:
            self._probe_moves += 1
            self._probe_log.append({c for _t, a, b in keys for c in (a, b)})

    def _probe_classes_since(self, version):
        """The classes whose pairs only predicted started or stopped sharing since :meth:`_probe_version`
        was ``version`` (None: not all kept)."""
        new = self._probe_moves - version
        if new < 0 or new > len(self._probe_log):
            return None
        return set().union(*(self._probe_log[-i] for i in range(new, 0, -1)))

    def _unmeasured(self, state, key):
        """Whether the pair ``key`` (GPU type id, class id, class id) is not measured both ways."""
        return not self._measured_both_ways(state.gpu_types[key[0]], key[1:])

    def _pair_of(self, a_name, b_name):
        """A pair's key by class names: its class ids in this table, smaller first."""
        a, b = self.pairs.classes.id(a_name), self.pairs.classes.id(b_name)
        return (a, b) if a <= b else (b, a)

    def _measured_both_ways(self, gpu_type, pair):
        """Whether the pair (class id, class id) is measured on ``gpu_type`` in both directions."""
        kn = self.pairs.known(gpu_type)  # (after _pair_of: the matrix grows with a class new to it)
        a, b = pair
        return a < len(kn) and b < len(kn) and bool(kn[a, b] and kn[b, a])

    def _no_pair(self, state, c, now):
        """The reason a job of class ``c`` waits when no pair passes: with ``probe_once``, it names the
        classes whose pairs with ``c``, only predicted, are being measured (the same words on every
        path: the quick answers, the kept waits and the pipeline)."""
        version = self._probe_version(state, now)
        if version is None:
            return NO_PAIR
        key = (version, self.pairs.n_observations, c)
        kept = self.__dict__.get("_no_pair_kept")
        if kept is None or kept[0] != key[:2]:
            kept = self._no_pair_kept = (key[:2], {})
        found = kept[1].get(c)
        if found is None:
            names = set()
            for gpu_type in state.gpu_types:
                probing = self._probing(state, gpu_type, len(self.pairs.matrix(gpu_type)), version)
                if probing is not None and c < len(probing):
                    names.update(state.classes.names[x] for x in np.flatnonzero(probing[c]))
            found = NO_PAIR
            if names:
                shown = sorted(names)
                found += (f"; its pairs with {', '.join(shown[:3])}{' and others' if len(shown) > 3 else ''}, only "
                          f"predicted, are being measured first (one probe at a time)")
            kept[1][c] = found
        return found

    def _probing(self, state, gpu_type, n, version):
        """``probe_once``: per pair of classes (n × n, symmetric), whether it is only predicted and
        already shares a GPU of ``gpu_type``: the tests then fail it, so that one probe at a time
        learns it (None: no such pair). ``version``: :meth:`_probe_version`'s, read just before."""
        if version is None:
            return None
        kept = self.__dict__.get("_probing_kept")
        if kept is None or kept[0] != (version, self.pairs.n_observations):
            kept = self._probing_kept = ((version, self.pairs.n_observations), {})
        found = kept[1].get((gpu_type, n), False)
        if found is not False:
            return found
        t = state.gpu_types.index(gpu_type)
        pairs = self._sharing.pairs(t)
        if self._held:
            held = [(a, b) for (k, a, b) in self._held if k == t]
            if held:
                pairs = np.concatenate([pairs, np.array(held, dtype=np.intp)])
        a, b = pairs[:, 0], pairs[:, 1]
        within = (a < n) & (b < n)
        a, b = a[within], b[within]
        known = self.pairs.known(gpu_type)
        only_predicted = ~(known[a, b] & known[b, a])
        out = None
        if only_predicted.any():
            out = np.zeros((n, n), dtype=bool)
            a, b = a[only_predicted], b[only_predicted]
            out[a, b] = out[b, a] = True
        kept[1][(gpu_type, n)] = out
        return out

    def score_cpu_nodes(self, state, req, nodes):
        score = _fgd_score(self.fragmentation.delta_nodes(state, req, nodes), self.quantize)
        if not len(score):
            return score
        rank = self._node_rank(state)[nodes]
        return score + 1e-7 * (score == score.max()) * (1.0 - rank / max(len(state.nodes), 1))

    def _score_fraction(self, cycle):
        """A fraction of a GPU: least fragmentation, then least interference (see the docstring)."""
        delta = self.fragmentation.delta_for(cycle.state, cycle.req, cycle.idx)
        jt, rt, free = cycle.job_tput, cycle.res_tput, cycle.free
        harmless = free | ((jt >= self.min_tput) & (rt >= self.min_tput))
        if not harmless.any():
            cycle.notes["wait_reason"] = "every GPU with room runs a job predicted to slow it too much"
            return np.full(len(delta), NEG_INF)
        score = _fgd_score(delta, self.quantize)
        tolerance = 0.0 if self.quantize else self.frag_tolerance
        # FGD's node: the best score, ties to the first node of the tie order; inside it, of the GPUs
        # of that score those of the least exact increase, the job predicted to slow least (FGD
        # takes the first GPU of the best score)
        nodes = cycle.state.gpu_node[cycle.idx]
        best = score[harmless].max()
        tied = harmless & (score >= best - tolerance)
        rank = self._node_rank(cycle.state)
        node = nodes[tied][int(np.argmin(rank[nodes[tied]]))]
        near = tied & (nodes == node)
        near &= delta <= delta[near].min() + 1e-6
        value = np.where(free, self.frac_free_value, jt + 0.5 * rt)
        cycle.notes["reason"] = "fraction: least fragmentation, least interference"
        return np.where(near, 1e9 + value, np.where(harmless, score, NEG_INF))

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
        """Whether a typical request shape asks for a fraction of a GPU (kept per typical set)."""
        typical = self.fragmentation.typical
        kept = self.__dict__.get("_fractional_kept")
        if kept is None or kept[0] is not typical:
            kept = self._fractional_kept = (typical, any(shape.units > 0 for shape, _ in typical))
        return kept[1]

    def decide_quickly(self, cycle):
        """The pipeline's answer on one GPU type, without scoring every GPU: for a 1-GPU job, and
        for a larger job when it can only wait.

        Under pressure a free GPU scores ``free_score`` and a qualifying pair its class's value, so
        the GPU :meth:`select` takes (the first of the highest score) is found by testing the pairs of
        the best-valued resident class first: the SJF-BSBF benefit, the only per-GPU test, is then
        computed on a few hundred GPUs instead of thousands. When that class has no qualifying GPU,
        all the classes that could still beat a free GPU are tested at once. With no free GPU, a job
        whose expected duration is not below its class's share limit waits at once, whatever its
        size (:meth:`_waits`); otherwise the classes none of whose GPUs can pass the benefit test
        (:meth:`_may_pair`, from their least and greatest expected end) are left out. Held equal to
        the pipeline by tests/test_placement.py."""
        state, req = cycle.state, cycle.req
        if len(state.gpu_types) != 1 or self.min_tput <= 0:
            return None  # (min_tput > 0: a qualifying pair never has a predicted 0, masked later)
        if req.gpu_units > 0 or (req.exclusive and self._fractional_workload()):
            return None  # a fraction of a GPU: FGD's rule (_score_fraction), the pipeline's
        feasible = cycle.feasible
        if feasible is None or feasible.idx is not cycle.idx:
            feasible = Feasible(state, np.array(cycle.idx))
        resident = feasible.resident
        first_free = feasible.first_free
        if req.n_gpus != 1:
            reason = self._multi_wait(cycle, feasible)
            return None if reason is None else Decision(req.job_id, False, self.name, reason=reason,
                                                        n_feasible=len(cycle.idx))
        if not pressure(cycle) and req.n_gpus <= state.n_free:
            cycle.notes["reason"] = "free GPUs outnumber the queue: a free GPU"
            if first_free < 0:
                return Decision(req.job_id, False, self.name, reason="no GPU qualifies under this policy",
                                n_feasible=len(cycle.idx))
            return self._decision_at(cycle, [first_free])
        jt, rt, ok_c, bsbf_c, value = self._class_tests(cycle)
        may = None
        if first_free < 0:
            if self._waits(cycle, feasible):
                return Decision(req.job_id, False, self.name, reason=self._no_pair(state, cycle.class_id, cycle.ctx.now),
                                n_feasible=len(cycle.idx))
            may = self._may_pair(cycle, feasible, jt, rt, ok_c, bsbf_c)
        need_c = ok_c | bsbf_c
        need_c[-1] = False
        floor = self.free_score if first_free >= 0 else NEG_INF
        need_c &= value >= floor  # a class valued below a free GPU can never be selected
        if may is not None and need_c.any():
            # (with a free GPU the prune is not worth its cost: a cycle that starts jobs changes the
            # cluster at every start, so the classes' expected ends would be gathered for each job;
            # _pair_ok tests the same classes exactly)
            need_c &= may
        best_pos, best_value = -1, NEG_INF
        if need_c.any():
            top = value[need_c].max()
            for classes in (need_c & (value == top), need_c & (value < top)):
                if not classes.any():
                    continue
                pos = np.flatnonzero(classes[resident])
                if len(pos) == 0:
                    continue
                ok = self._pair_ok(cycle, pos, resident[pos], jt, rt, ok_c, bsbf_c)
                if ok.any():
                    vals = value[resident[pos[ok]]]
                    best_value = vals.max()
                    best_pos = int(pos[ok][np.argmax(vals)])  # first of the highest
                    break
        cycle.notes["reason"] = "pressure: best predicted pair"
        if first_free >= 0 and (best_pos < 0 or self.free_score > best_value
                                or (self.free_score == best_value and first_free < best_pos)):
            return self._decision_at(cycle, [first_free])
        if best_pos < 0:
            return Decision(req.job_id, False, self.name, reason=self._no_pair(state, cycle.class_id, cycle.ctx.now),
                            n_feasible=len(cycle.idx))
        return self._decision_at(cycle, [best_pos])

    def wait_reason(self, state, req, ctx):
        """The wait :meth:`decide_quickly` would answer (no free feasible GPU, under pressure, no pair
        that may pass: :meth:`_waits`), from this cycle's feasible GPUs for the request's shape on this
        cluster version (``Feasible``, :meth:`cycle_feasible`), without building the decision."""
        if type(self).decide_quickly is not Horus.decide_quickly or req.n_gpus == 0 or req.gpu_units > 0:
            return None
        if len(state.gpu_types) != 1 or self.min_tput <= 0 or type(self)._class_tests is not Horus._class_tests \
                or self.pairs is None:
            return None
        feasible = self.cycle_feasible(state, req, ctx)
        if feasible is None or (req.exclusive and self._fractional_workload()):
            return None
        cycle = Cycle(state, req, ctx, state.classes.ids[req.job_class])
        cycle.feasible, cycle.idx = feasible, feasible.idx
        if req.n_gpus != 1:
            return self._multi_wait(cycle, feasible)
        if feasible.first_free >= 0 or (req.n_gpus <= state.n_free and not pressure(cycle)):
            return None  # (no pressure: the free-GPU rule)
        if not self._waits(cycle, feasible):
            return None
        return self._no_pair(state, cycle.class_id, cycle.ctx.now)

    def wait_epoch(self, state, ctx):
        """:meth:`wait_reason` reads, besides the cluster and the clock: the pair table (its classes;
        the measurements of the job's class, :meth:`wait_stamp`), the pressure, the window's best
        partners (the class tests; a wait may outlive them, :meth:`waits_after_token`) and whether the
        workload is fractional. With these fixed, a wait holds later, after placements and for a
        longer job: every share limit is e_b / ρ or a constant (the remaining times e_b only shrink),
        the job's E_a is compared against them, and a placement only turns a GPU that may take the
        job into one that may not (a free one busy, a shared one full)."""
        if type(self).wait_reason is not Horus.wait_reason or type(self).decide_quickly is not Horus.decide_quickly \
                or type(self)._class_tests is not Horus._class_tests or self.pairs is None \
                or len(state.gpu_types) != 1 or self.min_tput <= 0:
            return None
        window = ctx.extra.get("window")
        partners = None
        if window is not None and len(window):
            self._partners(state, ctx, window)
            partners = ctx.extra[("_best_partner_key", id(self), state.gpu_types[0])]
        # (without the pressure every waiting job asks for at most the free GPUs: the free-GPU rule)
        return ("horus", len(state.classes.names), id(self.pairs.classes), ctx.waiting_gpus > state.n_free,
                self._fractional_workload(), self._probe_version(state, ctx.now), partners)

    def waits_after_token(self, state, ctx, old, new, waits):
        """The window's best partners are the part of the token a wait may outlive (the rest must be
        equal): they enter a job's class tests only as ``combined ≥ partner − partner_slack`` per
        resident class. For a job of class c, the resident classes it now passes its tests with
        (``ok_c``) but failed that window test with under the old partners are the only change: its
        tests read nothing else that moved (the rest reads its class's row and column of the table,
        whose measurements :meth:`wait_stamp` checks). So the GPUs it may take now are those it could
        take then, and the shareable GPUs of such an eased resident class whose limit
        (:meth:`_limits`) is above E_a (the least known to wait). A wait holds when there is none, or
        when no node holding one has ``gpus_per_node`` GPUs free or shareable at all (counted wider
        than the filter, as :func:`~..framework.kept_after_release` does)."""
        if old[:-1] != new[:-1] or old[-1] is None or new[-1] is None or len(old[-1]) != len(new[-1]):
            return {}
        before, now = np.frombuffer(old[-1]), np.frombuffer(new[-1])
        mat = self.pairs.matrix(state.gpu_types[0])
        fell = np.flatnonzero(now[:len(mat)] < before[:len(mat)])  # (trailing: a free GPU, always 0)
        if len(fell) == 0:
            return waits  # the partners only rose: every class test is as hard or harder
        floor, lower = before[fell] - self.partner_slack, now[fell] - self.partner_slack
        shareable = room = None  # per GPU: shareable at all; per node: GPUs free or shareable
        ok_all = bsbf_all = None  # every class's tests under the new partners (:meth:`_all_class_tests`)
        kept, eased_gpus = {}, {}
        for request, value in waits.items():
            req = value[2]
            found = eased_gpus.get(req.job_class)
            if found is None:
                c = state.classes.ids.get(req.job_class)
                found = None if c is None or c >= len(mat) else ()
                if found is not None:
                    combined = mat[c][fell] + mat[fell, c]
                    # only a resident class whose bar fell across the pair's combined may now pass
                    if ((combined >= lower) & (combined < floor)).any():
                        if ok_all is None:
                            ok_all, bsbf_all = self._all_class_tests(state, ctx)
                        eased = fell[ok_all[c][fell] & (combined < floor)]
                        gpus = ()
                        if len(eased):
                            if shareable is None:
                                shareable = shareable_gpus(state, self.max_jobs_per_gpu)
                            # (a lookup per resident class, its trailing entry for a free GPU's -1)
                            eased_c = np.zeros(max(len(mat), int(state.gpu_class0.max(initial=-1)) + 1) + 1, dtype=bool)
                            eased_c[eased] = True
                            gpus = np.flatnonzero(shareable & eased_c[state.gpu_class0])
                        if len(gpus):
                            e_b = np.maximum(state.gpu_end0[gpus] - ctx.now, 1.0)
                            res = state.gpu_class0[gpus]
                            found = (gpus, self._limits_at(state.gpu_types[0], c, ok_all[c][res], bsbf_all[c][res],
                                                           res, e_b))
                eased_gpus[req.job_class] = found
            if found is None:
                continue
            if found:
                gpus = found[0][found[1] > value[0] * (1.0 - RATIO_EPS)]
                if len(gpus):
                    if room is None:
                        room = state.node_free + np.bincount(state.gpu_node[shareable], minlength=len(state.nodes))
                    if (room[state.gpu_node[gpus]] >= req.gpus_per_node).any():
                        continue
            kept[request] = value
        return kept

    def wait_stamp(self, req):
        """A job's waits read the pair table's rows and columns of its class only (the window's best
        partners are in the token): the measurements its class is part of."""
        return self.pairs.measured.get(req.job_class, 0)

    def waits_after_release(self, state, ctx, waits, nodes):
        """Every wait :meth:`wait_reason` gives says that fewer than ``nodes`` nodes hold
        ``gpus_per_node`` feasible GPUs the job may take: free ones, or shared ones whose resident's
        limit (:meth:`_limits` at its remaining time) is above E_a (:meth:`_multi_wait`; for one GPU
        :meth:`_waits`: none at all, the class limits being the largest of the GPUs'): a release
        changes that only on its nodes (:func:`~..framework.kept_after_release`)."""
        gpu_type = state.gpu_types[0]
        ok_all, bsbf_all = self._all_class_tests(state, ctx)

        def limits(req, c, residents, e_b):
            return self._limits_at(gpu_type, c, ok_all[c][residents], bsbf_all[c][residents], residents, e_b)

        return kept_after_release(state, waits, nodes, self.max_jobs_per_gpu, ctx.now, limits, RATIO_EPS)

    def _all_class_tests(self, state, ctx):
        """The class tests for every class at once, without the free-GPU entry: (ok, bsbf), matrices
        [job class, resident class]; row c is class c's ``ok_c`` and ``bsbf_c`` of
        :meth:`_class_tests` (combined, the known-pair threshold, ``min_tput`` and the window's best
        partners; the short-next-to-long exception's class part). Kept while the pair table and the
        window's best partners stay."""
        gpu_type = state.gpu_types[0]
        mat = self.pairs.matrix(gpu_type)
        window = ctx.extra.get("window")
        partners = None
        if window is not None and len(window):
            best = self._partners(state, ctx, window)
            partners = ctx.extra[("_best_partner_key", id(self), gpu_type)]
        version = self._probe_version(state, ctx.now)
        key = (id(mat), len(mat), self.pairs.n_observations, gpu_type, partners, version)
        kept = self.__dict__.get("_all_tests")
        if kept is not None and kept[0] == key and kept[1] is mat:
            return kept[2]
        jt, rt = mat, mat.T
        combined = jt + rt
        threshold = self.min_combined
        if self.min_combined_known != self.min_combined:
            known = self.pairs.known(gpu_type)
            threshold = np.where(known & known.T, self.min_combined_known, self.min_combined)
        both_fast = (jt >= self.min_tput) & (rt >= self.min_tput)
        ok = (combined >= threshold) & both_fast
        if partners is not None:
            ok &= combined >= best[:len(mat)] - self.partner_slack
        bsbf = (combined >= 1.0) & both_fast if self.bsbf_gain > 0 else np.zeros(mat.shape, dtype=bool)
        probing = self._probing(state, gpu_type, len(mat), version)
        if probing is not None:
            ok &= ~probing
            bsbf &= ~probing
        self._all_tests = (key, mat, (ok, bsbf))
        return ok, bsbf

    def _multi_wait(self, cycle, feasible):
        """The reason the pipeline gives a multi-GPU job that must wait, when it is known without
        scoring the GPUs; None: ask the pipeline. With no free GPU and no pair that may pass
        (:meth:`_waits`), it waits whatever its size. Otherwise it waits when fewer nodes than it asks
        have ``gpus_per_node`` GPUs it may take: free ones (all it may take without pressure), or
        under pressure also those whose resident it may join (:meth:`_gpu_limits` above its E_a);
        then the pipeline's reason is "no GPU qualifies" when some GPU surely scores."""
        state, req = cycle.state, cycle.req
        if not np.isfinite(self.free_score):
            return None
        first_free = feasible.first_free
        relaxed = not pressure(cycle) and req.n_gpus <= state.n_free
        if not relaxed and first_free < 0 and self._waits(cycle, feasible):
            return self._no_pair(state, cycle.class_id, cycle.ctx.now)
        if first_free >= 0 and int(np.count_nonzero(state.node_free >= req.gpus_per_node)) >= req.nodes:
            return None  # free GPUs may be enough: the pipeline (the test below would cost as much)
        resident = feasible.resident
        if relaxed:
            may = resident < 0  # the pipeline scores only the free GPUs
        else:
            e_a = req.expected_duration()
            # first a bound per node: at most its free GPUs and those of the classes whose greatest
            # remaining time passes; too few such nodes, and the job surely waits
            limits = self._class_limits(cycle, feasible, self._class_tests(cycle))
            passing = np.append(limits > e_a * (1.0 - RATIO_EPS), True)  # trailing: a free GPU (-1)
            upper = feasible.idx[passing[resident]]
            if len(nodes_holding(state, upper, req.gpus_per_node)) < req.nodes and (
                    first_free >= 0 or (np.isfinite(limits) & (limits > e_a * (1.0 + RATIO_EPS))).any()):
                return NO_QUALIFYING_GPU  # (some GPU surely scores: a free one, or one of a class whose limit passes)
            may = self._gpu_limits(cycle, feasible) > e_a * (1.0 - RATIO_EPS)
        if len(nodes_holding(state, feasible.idx[may], req.gpus_per_node)) >= req.nodes:
            return None
        if relaxed or first_free >= 0:
            return NO_QUALIFYING_GPU
        # no GPU free: the reason says whether some pair passes (only GPUs that may can)
        pos = np.flatnonzero(may)
        if len(pos) and self._qualifying(cycle, pos, resident[pos], self._class_tests(cycle)).any():
            return NO_QUALIFYING_GPU
        return self._no_pair(state, cycle.class_id, cycle.ctx.now)

    def _waits(self, cycle, feasible) -> bool:
        """With no free feasible GPU, under pressure: whether no GPU can pass the pair test (the job
        waits, whatever its size): its expected duration E_a is not below its class's share limit
        (:meth:`_share_limit`), with a margin (``RATIO_EPS``)."""
        limit = self._share_limit(cycle, feasible, self._class_tests(cycle))
        return cycle.req.expected_duration() * (1.0 - RATIO_EPS) >= limit

    def _share_limit(self, cycle, feasible, tests) -> float:
        """The E_a below which a job of the cycle's class may pass :meth:`_pair_ok` on some feasible
        GPU (inf: any may; 0: none): the largest of :meth:`_class_limits`."""
        limits = self._class_limits(cycle, feasible, tests)
        return float(limits.max()) if len(limits) else 0.0

    def _class_limits(self, cycle, feasible, tests):
        """Per resident class id: the E_a below which a job of the cycle's class may pass
        :meth:`_pair_ok` next to one of its residents on a feasible GPU — :meth:`_limits` at the
        greatest remaining time among them (``max(end − now, 1)``); 0 for a class not there. Kept in
        ``Feasible.memo`` per class, time and class tests."""
        key = ("horus-class-limits", id(self), cycle.class_id, cycle.ctx.now)
        found = feasible.memo.get(key)
        if found is not None and found[0] is tests:
            return found[1]
        n = len(tests[0]) - 1
        e_b, present = feasible.remaining(n, cycle.ctx.now)
        k = np.flatnonzero(present)
        limits = np.zeros(n)
        if len(k):
            limits[k] = self._limits(cycle, tests, k, e_b[1][k])
        feasible.memo[key] = (tests, limits)
        return limits

    def _gpu_limits(self, cycle, feasible):
        """Per feasible GPU, the E_a below which a job of the cycle's class may take it: inf when
        free, :meth:`_limits` of its resident otherwise. Kept in ``Feasible.memo`` per class, time and
        class tests."""
        tests = self._class_tests(cycle)
        key = ("horus-gpu-limits", id(self), cycle.class_id, cycle.ctx.now)
        found = feasible.memo.get(key)
        if found is not None and found[0] is tests:
            return found[1]
        resident = feasible.resident
        busy = resident >= 0
        limits = np.full(len(feasible.idx), np.inf)
        e_b = np.maximum(cycle.state.gpu_end0[feasible.idx[busy]] - cycle.ctx.now, 1.0)
        limits[busy] = self._limits(cycle, tests, resident[busy], e_b)
        feasible.memo[key] = (tests, limits)
        return limits

    def _limits(self, cycle, tests, res, e_b):
        """Per resident (class ids ``res``, remaining times ``e_b``): the E_a below which a job of the
        cycle's class may pass :meth:`_pair_ok` next to it (inf: any may; 0: none). Where the class
        tests pass (``ok_c``), SJF-BSBF's benefit > 0 holds exactly for e_b > ρ₀·E_a, and where the
        short-next-to-long exception's do (``bsbf_c``), gain ≥ ``bsbf_gain`` for e_b > ρ_g·E_a
        (:func:`~.sjf_bsbf.share_ratio`, kept per pair of classes by :class:`~.sjf_bsbf.ShareRatios`):
        the limit is e_b / ρ (inf where ρ < RATIO_MIN). Without the benefit test the class tests alone
        decide (inf), and so they do with ``bsbf_gain`` ≥ ½ (no threshold form)."""
        _jt, _rt, ok_c, bsbf_c, _value = tests
        return self._limits_at(cycle.state.gpu_types[0], cycle.class_id, ok_c[res], bsbf_c[res], res, e_b)

    def _limits_at(self, gpu_type, c, passing, short, res, e_b):
        """:meth:`_limits` of class ``c`` from its class tests at the residents (``passing``: ok_c,
        ``short``: bsbf_c)."""
        gain = self.bsbf_gain
        if gain <= 0:
            short = None
        pass_any, short_any = bool(passing.any()), short is not None and bool(short.any())
        if not (pass_any or short_any):
            return np.zeros(len(res))
        # (every resident at once, the unused ones masked out: fewer steps than gathering subsets)
        rho = self._ratio_rows(gpu_type, c)
        out = np.zeros(len(res))
        if pass_any:
            out = np.where(passing, share_limits(e_b, rho[0][res]) if self.require_benefit else np.inf, 0.0)
        if short_any:
            out = np.where(short, np.maximum(out, share_limits(e_b, rho[1][res]) if gain < 0.5 else np.inf), out)
        return out

    def _ratio_rows(self, gpu_type, c):
        """SJF-BSBF's ratios ρ (:class:`~.sjf_bsbf.ShareRatios`) of class ``c`` against every class, at
        gain 0 and at ``bsbf_gain``: kept while the pair table neither grew nor measured a pair."""
        mat = self.pairs.matrix(gpu_type)
        kept = self.__dict__.get("_rho_kept")
        if kept is None or kept[0] is not mat or kept[1] != self.pairs.n_observations or kept[2] != gpu_type:
            ratios = self.__dict__.setdefault("_share_ratios", {})
            for gain in (0.0, self.bsbf_gain):
                if gain not in ratios:
                    ratios[gain] = ShareRatios(gain)
            kept = self._rho_kept = (mat, self.pairs.n_observations, gpu_type,
                                     ratios[0.0].matrix(self.pairs, gpu_type),
                                     ratios[self.bsbf_gain].matrix(self.pairs, gpu_type))
        return kept[3][c], kept[4][c]

    def _may_pair(self, cycle, feasible, jt, rt, ok_c, bsbf_c):
        """Per resident class (the trailing entry, a free GPU: False): whether some feasible GPU
        holding a job of that class may pass :meth:`_pair_ok`; False only when none can.

        With the job's expected run E_a and the class's throughputs fixed, SJF-BSBF's benefit
        T_seq − T_con is continuous and piecewise linear in the resident's remaining time e_b: two
        pieces, the later (the job ends last) of slope ½. The tests ``gain > 0`` and ``gain ≥
        bsbf_gain`` (gain: the benefit over E_a + e_b) are ``benefit − g·(E_a + e_b) ≥ 0``, whose
        later piece rises while g < ½: convex or rising, it is largest at an end of the interval, so
        a class passes on some GPU only if it passes at its least or greatest expected end
        (:meth:`Feasible.end_range`). Tested there with a margin far above rounding (``PAIR_EPS``
        times the class's largest E_a + e_b); with ``bsbf_gain`` ≥ ½ every class present may pass
        (no shortcut)."""
        n = len(jt) - 1
        out = np.zeros(n + 1, dtype=bool)
        e_b, present = feasible.remaining(n, cycle.ctx.now)
        if not self.require_benefit and self.bsbf_gain <= 0:
            out[:n] = ok_c[:n] & present
            return out
        k = np.flatnonzero((ok_c[:n] | bsbf_c[:n]) & present)
        if len(k) == 0:
            return out
        if self.bsbf_gain >= 0.5:
            out[k] = True
            return out
        # T_seq − T_con (sjf_bsbf.pair_times) at both ends at once: rows least, greatest e_b
        e_a = cycle.req.expected_duration()
        e_b = e_b[:, k]
        ta, tb = np.maximum(jt[k], 1e-9), np.maximum(rt[k], 1e-9)
        eh_a, eh_b = e_a / ta, e_b / tb
        shorter = np.minimum(eh_a, eh_b)
        t_con = np.where(eh_a >= eh_b, 0.5 * e_a + shorter * (1.0 - 0.5 * ta), 0.5 * e_b + shorter * (1.0 - 0.5 * tb))
        work = e_a + e_b
        # the benefit plus the margin, which scales with the class's largest E_a + e_b (the bound
        # holds between the ends)
        slack = (e_b + 0.5 * e_a) - t_con + PAIR_EPS * work[1]
        may = (ok_c[k] & (slack.max(axis=0) > 0)) if self.require_benefit else ok_c[k]
        if self.bsbf_gain > 0:
            may = may | (bsbf_c[k] & ((slack - self.bsbf_gain * work).max(axis=0) > 0))
        out[k] = may
        return out

    def score_gpus(self, cycle):
        req = cycle.req
        if req.gpu_units > 0 or (req.exclusive and self._fractional_workload()):
            return self._score_fraction(cycle)
        free = cycle.free
        busy = pressure(cycle)
        if not busy and cycle.req.n_gpus <= cycle.state.n_free:
            cycle.notes["reason"] = "free GPUs outnumber the queue: a free GPU"
            return np.where(free, self.free_score, NEG_INF)  # only free GPUs qualify: first fit
        if len(cycle.state.gpu_types) == 1:
            score, ok = self._score_by_class(cycle)
        else:
            score, ok = self._score_per_gpu(cycle)
        cycle.notes["reason"] = "pressure: best predicted pair"
        if not free.any() and not ok.any():
            cycle.notes["wait_reason"] = self._no_pair(cycle.state, cycle.class_id, cycle.ctx.now)
        return score

    def _score_per_gpu(self, cycle):
        """The rule, one vector operation per step over the feasible GPUs (any mix of GPU types)."""
        free = cycle.free
        jt, rt = cycle.job_tput, cycle.res_tput
        combined = jt + rt
        ok = (combined >= self.min_combined) & (jt >= self.min_tput) & (rt >= self.min_tput)
        window = cycle.ctx.extra.get("window")
        if window is not None and len(window):
            ok &= combined >= self._best_partner(cycle, window) - self.partner_slack
        probing = self._probing_per_gpu(cycle)
        if probing is not None:
            ok &= ~probing
        e_a = cycle.req.expected_duration()
        e_b = np.maximum(cycle.state.gpu_end0[cycle.idx] - cycle.ctx.now, 1.0)
        gain = pair_benefit(e_a, e_b, jt, rt) / (e_a + e_b)
        if self.require_benefit:
            ok &= gain > 0
        if self.bsbf_gain > 0:
            # a job much shorter than its would-be partner gains far more by starting now than the
            # partner loses (SJF-BSBF's test), even when the pair adds little throughput
            ok |= ((gain >= self.bsbf_gain) & (combined >= 1.0) & (jt >= self.min_tput)
                   & (rt >= self.min_tput) & ~free & (True if probing is None else ~probing))
        # among the pairs worth making, the job's own speed counts double: it is the job being
        # placed now (queue order put it first), the resident has been running already
        value = combined if self.score_rule == "combined" else jt + 0.5 * rt
        return np.where(free, self.free_score, np.where(ok, value, NEG_INF)), ok

    def _probing_per_gpu(self, cycle):
        """:meth:`_probing` at each feasible GPU (its first resident's class; None: no GPU fails)."""
        state = cycle.state
        version = self._probe_version(state, cycle.ctx.now)
        if version is None:
            return None
        out = None
        c, resident = cycle.class_id, cycle.resident
        types = state.gpu_type_id[cycle.idx]
        for t in np.unique(types):
            gpu_type = state.gpu_types[t]
            probing = self._probing(state, gpu_type, len(self.pairs.matrix(gpu_type)), version)
            if probing is None or c >= len(probing):
                continue
            sel = (types == t) & (resident >= 0)
            if out is None:
                out = np.zeros(len(resident), dtype=bool)
            out[sel] = probing[c][resident[sel]]
        return out

    def _candidates(self, cycle, limit=8):
        """``--explain``: a GPU whose pair is left out by ``probe_once`` says so."""
        cands = super()._candidates(cycle, limit)
        probing = self._probing_per_gpu(cycle) if cands else None
        if probing is not None and probing.any():
            state = cycle.state
            at = {state.gpu_label(int(cycle.idx[pos])): pos for pos in np.flatnonzero(probing)}
            for cand in cands:
                if cand.where in at:
                    cand.note += " (a pair only predicted, shared on another GPU now: one probe at a time)"
        return cands

    def _score_by_class(self, cycle):
        """The same rule on one GPU type, where everything but the pair's benefit depends only on the
        resident's class: each test is computed once per class (a short vector, the trailing entry
        for a free GPU) and gathered per GPU; the benefit, which needs the resident's expected end,
        is computed only on the GPUs whose class passes the rest."""
        tests = self._class_tests(cycle)
        resident = cycle.resident  # class id per feasible GPU, -1 (the trailing entry) when free
        ok = self._qualifying(cycle, np.arange(len(resident)), resident, tests)
        return np.where(ok | cycle.free, tests[4][resident], NEG_INF), ok

    def _qualifying(self, cycle, pos, res, tests):
        """Whether the GPUs at feasible positions ``pos`` (resident classes ``res``, -1: free) pass
        the rule's pair tests: the class tests, and the SJF-BSBF benefit where they ask for it."""
        jt, rt, ok_c, bsbf_c, _value = tests
        if not (self.require_benefit or self.bsbf_gain > 0):
            return ok_c[res]
        need_c = (ok_c | bsbf_c) if self.require_benefit else bsbf_c & ~ok_c
        need_c[-1] = False
        ok = ok_c[res] if not self.require_benefit else np.zeros(len(res), dtype=bool)
        sel = np.flatnonzero(need_c[res])
        if len(sel):
            ok[sel] = self._pair_ok(cycle, pos[sel], res[sel], jt, rt, ok_c, bsbf_c)
        return ok

    def _class_tests(self, cycle):
        """Per resident class (trailing entry: a free GPU): the job's and the resident's predicted
        throughputs, the class-level tests (``ok_c``: combined, known-pair threshold, min_tput,
        window; ``bsbf_c``: the short-next-to-long exception's class part) and the score of a
        qualifying GPU (a free GPU's: ``free_score``). Kept from cycle to cycle: they depend on the
        class, its row and column of the pair table (a measured pair drops the two classes' entries,
        ``PairTable.changes_since``) and the window's best partners (their values are in the key)."""
        state = cycle.state
        gpu_type = state.gpu_types[0]
        mat = self.pairs.matrix(gpu_type)
        n_obs = self.pairs.n_observations
        extra = cycle.ctx.extra
        window = extra.get("window")
        version = self._probe_version(state, cycle.ctx.now)
        at = extra.get(("_tests_at", id(self)))  # what this cycle's earlier calls found
        if at is None or at[0] is not mat or at[1] != n_obs or at[2] is not window or at[5] != version:
            cache = self.__dict__.get("_tests_cache")
            if cache is None or cache[0] is not mat or cache[1] != (gpu_type, len(mat)):
                cache = self._tests_cache = [mat, (gpu_type, len(mat)), n_obs, {}, version]
            else:
                touched = set()  # the classes whose tests changed: those of a pair measured, or of a pair
                # only predicted that started or stopped sharing (probe_once)
                if cache[2] != n_obs:
                    changes = self.pairs.changes_since(cache[2])
                    touched = None if changes is None else {x for t, a, b in changes if t == gpu_type for x in (a, b)}
                    cache[2] = n_obs
                if cache[4] != version and touched is not None:
                    moved = None if version is None or cache[4] is None else self._probe_classes_since(cache[4])
                    touched = None if moved is None else touched | moved
                cache[4] = version
                if touched is None:
                    cache[3] = {}
                elif touched:
                    cache[3] = {key: found for key, found in cache[3].items() if key[0] not in touched}
            if len(cache[3]) > TESTS_KEPT:
                cache[3] = {}
            classes = frozenset(window) if window is not None and len(window) else None
            # the window's best partners are computed once per cycle (:meth:`_partner_by_class`)
            partners = None
            if classes is not None:
                self._partner_by_class(cycle, window)
                partners = extra[("_best_partner_key", id(self), gpu_type)]
            at = extra[("_tests_at", id(self))] = (mat, n_obs, window, (classes, partners), cache[3], version)
        tests = at[4]
        key = (cycle.class_id,) + at[3]
        found = tests.get(key)
        if found is None:
            found = tests[key] = self._compute_class_tests(cycle, cycle.class_id, mat)
            for array in found:
                array.flags.writeable = False  # shared by the decisions
        return found

    def _compute_class_tests(self, cycle, c, mat):
        """Class ``c``'s row of :meth:`_all_class_tests`, with a free GPU's entry appended (its
        partner runs alone at 1.0: combined 2.0, against ``min_combined`` and no window partner, 0)."""
        ok_all, bsbf_all = self._all_class_tests(cycle.state, cycle.ctx)
        jt = np.append(mat[c], 1.0)
        rt = np.append(mat[:, c], 1.0)
        free_ok = 2.0 >= self.min_combined and 1.0 >= self.min_tput and 2.0 >= 0.0 - self.partner_slack
        ok_c = np.append(ok_all[c], free_ok)
        bsbf_c = np.append(bsbf_all[c], False)  # a free GPU has no partner
        value = jt + rt if self.score_rule == "combined" else jt + 0.5 * rt
        value[-1] = self.free_score
        return jt, rt, ok_c, bsbf_c, value

    def _pair_ok(self, cycle, pos, res, jt, rt, ok_c, bsbf_c):
        """Whether the pairs at feasible positions ``pos`` (resident classes ``res``) qualify, given
        the class tests: the SJF-BSBF benefit decides (see :meth:`_score_per_gpu`)."""
        if not self.require_benefit and self.bsbf_gain <= 0:
            return ok_c[res]
        e_a = cycle.req.expected_duration()
        e_b = np.maximum(cycle.state.gpu_end0[cycle.idx[pos]] - cycle.ctx.now, 1.0)
        gain = pair_benefit(e_a, e_b, jt[res], rt[res]) / (e_a + e_b)
        ok = (ok_c[res] & (gain > 0)) if self.require_benefit else ok_c[res]
        if self.bsbf_gain > 0:
            ok |= (gain >= self.bsbf_gain) & bsbf_c[res]
        return ok

    def _partner_by_class(self, cycle, window, gpu_type=None):
        """Per resident class (trailing entry: a free GPU): the best combined throughput any waiting
        job would reach with it (computed once per cycle and GPU type)."""
        return self._partners(cycle.state, cycle.ctx, window, gpu_type)

    def _partners(self, state, ctx, window, gpu_type=None):
        """:meth:`_partner_by_class` on ``state`` in the cycle of ``ctx``."""
        name = gpu_type or state.gpu_types[0]
        cache = ctx.extra.setdefault("_best_partner", {})
        mat = self.pairs.matrix(name)
        # a waiting job whose pair with the resident is held back (``probe_once``: being measured
        # elsewhere) cannot take the slot: no slot is kept for it
        version = self._probe_version(state, ctx.now)
        best = cache.get((id(self), name, version))
        if best is None or len(best) != len(mat) + 1:
            classes = frozenset(window)
            # kept across cycles too, per set of window classes (a cycle's window is mostly the last's)
            kept = self.__dict__.setdefault("_partners_kept", {})
            key = (name, id(mat), len(mat), self.pairs.n_observations, classes, version)
            found = kept.get(key)
            if found is None or found[2] is not mat:
                w = np.fromiter(classes, dtype=np.intp)  # (each class once: the same maximum)
                combined = mat[w, :] + mat[:, w].T
                probing = self._probing(state, name, len(mat), version)
                if probing is not None:
                    combined = np.where(probing[w, :], -np.inf, combined)
                # trailing 0: a free GPU (resident -1) has no partner to keep it for
                # (at least 0: every window class held back from a resident keeps nothing for it)
                best = np.append(np.maximum(combined.max(axis=0), 0.0), 0.0)
                best.flags.writeable = False
                if len(kept) >= 256:
                    kept.clear()
                found = kept[key] = (best, best.tobytes(), mat)  # its values, for the token
            best = cache[(id(self), name, version)] = found[0]
            ctx.extra[("_best_partner_key", id(self), name)] = found[1]
        return best

    def _best_partner(self, cycle, window):
        """Per feasible GPU: the best combined throughput any waiting job would reach there."""
        state = cycle.state
        if len(state.gpu_types) == 1:
            return self._partner_by_class(cycle, window)[cycle.resident]
        types = state.gpu_type_id[cycle.idx]
        out = np.zeros(len(cycle.idx))
        for t in np.unique(types):
            sel = types == t
            out[sel] = self._partner_by_class(cycle, window, state.gpu_types[t])[cycle.resident[sel]]
        return out
