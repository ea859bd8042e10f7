"""horusd's placer: the cluster state in memory, the placement core, the ledger, offers, claims, the queue.

The decision path reads memory only: a background thread re-reads ``sinfo``/``squeue --json`` and
hands the snapshot to :meth:`Placer.load_snapshot`, which builds a fresh :class:`ClusterState`
and the queue of kept jobs (snapshot.py) and puts back the placements squeue does not show yet
(ledger.py). Each decision runs the configured policy of the placement core (the very code the
simulator measures) on that state. Requests arrive typed (protocol.py); replies are formatted by
replies.py.

**The queue.** A GPU job that cannot be placed at submission (no room, a pair over the slowdown
limit, or other jobs already waiting) is *kept*: job_submit.lua gives it a movable shape and a begin
time ``lease_s`` ahead, and horusd runs the placement core's scheduling cycle
(:func:`~slurm_horus.placement.cycle.run_cycle`, the very one the simulator runs) over the kept
jobs whenever the cluster changes and at least every ``cycle_s``; :meth:`Placer.cycle` returns the
jobs to start and where, which horusd applies with ``scontrol update`` (mover.py).

**Durations.** Every job horusd decides about, at submission or in the queue, carries the duration
estimate of the placement core's one estimator (``placement/duration.py``, the one the simulator
uses): the median recent run time of the user's jobs of that class, else of the class, the user, the
site, capped by the time limit; else the time limit. horusd feeds it from the history store (the
jobs ``horus ingest`` put there, read by history.py) and swaps it in whole (:meth:`Placer.set_durations`);
running jobs are expected to end at their start plus that estimate (never after Slurm's end time).
"""

import difflib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional

from ..jobclass import UNKNOWN_CLASS
from ..placement.cycle import CycleOptions, PendingQueue, may_reclaim, reclaim_for, run_cycle
from ..placement.duration import DurationEstimator
from ..placement.framework import SchedulingContext
from ..placement.request import JobRequest
from ..placement.state import ClassIndex, ClusterState
from .ledger import Ledger, LedgerEntry
from .offers import OfferBook
from .protocol import Reply, Request, unchanged
from .replies import candidate_counts, explain_candidates, keep_reply, placement_reply
from ..slurm.partitions import Preemption
from .snapshot import KeptJob, Snapshot, reserve_where_slurm_starts, translate

log = logging.getLogger("horusd")


# kept jobs beyond this are left to Slurm: renewing a lease costs ~1-4 ms per job of scontrol (and
# 0.3 ms inside slurmctld) every lease_s / 2, measured by bench/bench_live_queue.py --phases D
MAX_KEPT = 1000
ENDED_KEPT = 10000  # jobs EpilogSlurmctld said ended, remembered at most
ENDED_KEPT_S = 60.0  # ... for this long (a COMPLETING record lasts as long as the epilogs)
# A decision asked for on the user socket (horus-sbatch) is submitted at once or never: it holds its
# GPUs briefly, and one uid's unconfirmed ones together hold at most this many GPUs.
USER_LEDGER_TTL_S = 15.0
MAX_USER_HELD_GPUS = 4


def new_decision_id():
    return "h" + uuid.uuid4().hex[:10]


@dataclass
class Move:
    """A kept job the cycle placed: what to tell Slurm."""

    kept: KeptJob
    reply: Reply


class Placer:
    """Turns place requests into decisions and keeps the ledger. Thread-safe."""

    def __init__(self, policy, binding="indexed", gpu_type="v100", gpu_memory_mb: Callable[[str], float] = None,
                 max_jobs_per_gpu=2, share_unknown=False, slowdown_limit=1.5, ledger_ttl_s=60.0,
                 clock=time.time, known_classes=(), queue=True, lease_s=30.0):
        self.policy = policy
        self.binding = binding
        self.default_gpu_type = gpu_type
        self.gpu_memory_mb = gpu_memory_mb or (lambda _t: 16384.0)
        self.max_jobs_per_gpu = max_jobs_per_gpu
        self.share_unknown = share_unknown
        self.slowdown_limit = slowdown_limit
        self.clock = clock
        self.classes = ClassIndex(known_classes)
        # the classes the interference model knows (build_placer fills it); a class outside it is
        # treated as unknown: a GPU of its own unless share_unknown (empty: every class is known)
        self.known_classes = set(known_classes)
        self.lock = threading.Lock()
        self.ledger = Ledger(ledger_ttl_s)
        self.offers = OfferBook()
        self.state: Optional[ClusterState] = None
        self.snapshot_time = 0.0
        self.pending_jobs = 0
        self.pending_gpus = 0  # GPUs asked for by jobs Slurm still queues: the "pressure" of the policies
        # A GPU job left to Slurm for lack of room may start on any GPU Slurm frees before our next
        # refresh; pinning another job meanwhile could pin it behind that one. So until a refresh
        # newer than this moment, every job is left to Slurm too (None: no such job pending).
        self.left_to_slurm_since = None
        self.on_left_to_slurm = None  # callback: ask the refresher for an early refresh
        self.on_change = None  # callback: state changed (a decision, a claim, a refresh): republish offers
        self.on_claimed = None  # callback(claim request, offer reply) once a claim is recorded
        self.generation = 0  # counts changes of the state: offers computed on an older one are void
        self.decisions = 0
        self.gres_prefix = "gres:"  # how tres_per_node spells GRES on this Slurm (from each snapshot)
        # the queue (module docstring)
        self.queue_on = queue
        self.lease_s = lease_s
        self.queue: Optional[PendingQueue] = None  # kept jobs horusd may place now, in the policy's order
        self.kept: Dict[str, KeptJob] = {}  # Slurm job id -> every kept job of the last snapshot
        self.unseen_keeps: Dict[str, float] = {}  # decision id -> expiry: kept jobs squeue does not show yet
        self.unshaped: set = set()  # kept jobs that ask for no GPU (a shard move cut short): restore them
        self.cycle_options = CycleOptions(max_slowdown=slowdown_limit)
        self.preemption = Preemption()  # jobs Slurm may start by preempting are never kept
        self.on_kept = None  # callback: a job was kept (horusd reads squeue soon, to learn its job id)
        # what horusd knows of run times (the history store's finished jobs; empty: time limits only)
        self.durations = DurationEstimator()
        self.kept_decisions = 0
        self.started_from_queue = 0
        # jobs EpilogSlurmctld said ended -> until when squeue's COMPLETING record of them is not read as
        # holding GPUs (slurmctld frees them once the epilogs are done: that is a moment, not a wait)
        self.ended: Dict[str, float] = {}

    @property
    def ledger_ttl_s(self):
        return self.ledger.ttl_s

    # ---- state ----------------------------------------------------------------------------------
    def set_durations(self, estimator: DurationEstimator):
        """Swap in an estimator fed with fresh history (the next snapshot re-estimates the queue)."""
        with self.lock:
            self.durations = estimator

    def expected_duration(self, user, job_class, time_limit_s) -> float:
        """The estimator's answer (seconds alone) for a job of ``user`` and ``job_class``."""
        return self.durations.seconds(user, job_class, time_limit_s)[0]

    def end_jobs(self, job_ids) -> int:
        """EpilogSlurmctld said these jobs ended: their GPUs are free from now on, although squeue
        shows them COMPLETING until their epilogs are done (horus_epilog.lua waits for horusd's
        answer, so jobs moved onto those GPUs start in slurmctld's pass at their completion).
        Returns how many of them the state held."""
        with self.lock:
            now = self.clock()
            self.ended = {job_id: until for job_id, until in self.ended.items() if until > now}
            released = 0
            for job_id in {str(j) for j in job_ids}:
                if len(self.ended) < ENDED_KEPT:
                    self.ended[job_id] = now + ENDED_KEPT_S
                if self.state is not None and job_id in self.state.jobs:
                    self.state.release(job_id)
                    released += 1
            if released:
                self.generation += 1
        if released and self.on_change:
            self.on_change()
        return released

    def _completing_ended(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` without the COMPLETING records of jobs EpilogSlurmctld said ended."""
        if not self.ended:
            return snapshot
        now = self.clock()
        ended = {job_id for job_id, until in self.ended.items() if until > now}
        jobs = [job for job in snapshot.jobs if not (job.state == "COMPLETING" and str(job.job_id) in ended)]
        return snapshot if len(jobs) == len(snapshot.jobs) else replace(snapshot, jobs=jobs)

    def load_snapshot(self, snapshot: Snapshot):
        """Build a fresh ClusterState from Slurm's view plus the ledger entries squeue does not show."""
        if self.ended:
            with self.lock:
                snapshot = self._completing_ended(snapshot)
        view = translate(snapshot, self.classes, self.max_jobs_per_gpu, self.default_gpu_type, self.gpu_memory_mb,
                         needs_shards=self.binding == "shard", expected_s=self.expected_duration)
        queue = PendingQueue(self.policy)
        with self.lock:
            self._apply_claims()  # into the old state and the ledger, which carries them over
            now = self.clock()
            self.ledger.settle(view.placed_tokens, now)
            self.ledger.reapply(view.state)
            for job in view.unpinned:  # after every pinned job and ledger entry: what is left, Slurm takes
                reserve_where_slurm_starts(view.state, job, snapshot.taken_at)
            # a kept job the cycle placed a moment ago may still show as kept: the ledger has it
            self.kept = {job_id: kept for job_id, kept in view.kept.items() if kept.decision_id not in self.ledger}
            for kept in self.kept.values():
                if kept.placeable:
                    req = kept.request  # estimated again at every refresh, as the history grows
                    req.predicted_duration, _, req.duration_sigma = self.durations.seconds_spread(
                        req.user, req.job_class, req.time_limit)
                    queue.add(req)
            self.queue = queue
            # a job the cycle is moving asks for no GPU between the mover's two updates: a squeue read
            # in that moment is not a move cut short (the ledger has it; a refused move is restored by the mover)
            self.unshaped = {job_id for job_id, decision_id in view.unshaped.items() if decision_id not in self.ledger}
            self.unseen_keeps = {d: t for d, t in self.unseen_keeps.items() if d not in view.kept_tokens and t > now}
            self.state = view.state
            self.generation += 1
            self.snapshot_time = snapshot.taken_at
            if snapshot.slurm_version is not None:
                self.gres_prefix = snapshot.slurm_version.gres_prefix
            self.pending_jobs = view.pending_jobs
            self.pending_gpus = view.pending_gpus
            self.preemption = snapshot.preemption
            if self.left_to_slurm_since is not None and snapshot.taken_at > self.left_to_slurm_since:
                self.left_to_slurm_since = None
        if self.on_change is not None:
            self.on_change()

    def state_age(self):
        return max(0.0, self.clock() - self.snapshot_time) if self.snapshot_time else float("inf")

    # ---- decisions ------------------------------------------------------------------------------
    def class_known(self, job_class):
        """Whether the interference model knows ``job_class`` (always, when no model classes are set)."""
        if job_class == UNKNOWN_CLASS:
            return False
        return not self.known_classes or job_class in self.known_classes

    def class_fields(self, job_class):
        """``class_known`` and, for a class the model does not know, the closest known names."""
        known = self.class_known(job_class)
        if known or job_class == UNKNOWN_CLASS:
            return {"class_known": known}
        return {"class_known": False,
                "class_suggestions": difflib.get_close_matches(job_class, sorted(self.known_classes), n=3, cutoff=0.6)}

    def job_request(self, request: Request, decision_id) -> JobRequest:
        # a class the model does not know is treated as unknown: a GPU of its own unless share_unknown
        may_share = self.class_known(request.job_class) or self.share_unknown
        partitions = [p for p in request.partition.split(",") if p]
        seconds, _, sigma = self.durations.seconds_spread(request.user, request.job_class, request.time_limit_s)
        return JobRequest(
            job_id=decision_id, job_class=request.job_class, gpus_per_node=request.gpus_per_node,
            nodes=request.nodes, partition=partitions[0] if partitions else "",
            extra_partitions=tuple(partitions[1:]), time_limit=request.time_limit_s, user=request.user,
            submit_time=self.clock(), predicted_duration=seconds, duration_sigma=sigma,
            # only a shard lets a second job join a GPU, and a shard is one GPU: indexed/node bindings
            # and multi-GPU jobs hold whole GPUs (the policy must not pair them: Slurm could not)
            exclusive=(not may_share or self.binding != "shard" or request.gpus_per_node * request.nodes > 1)
            and not request.shards,
            gpu_type=request.gpu_type,
            # --gres=shard:N: N units of one GPU's shards, placed by capacity (placement/fragmentation.py)
            gpu_units=request.shards,
        )

    def _known_pair(self, job_class):
        fields = self.class_fields(job_class)
        return fields["class_known"], fields.get("class_suggestions") or []

    def note_left_to_slurm(self):
        """job_submit.lua left a GPU job to Slurm (an array, --nodelist, --exclusive, opted out...): it
        may start on any free GPU before our next refresh, so pin nothing until that refresh."""
        with self.lock:
            self._left_to_slurm()

    def queue_waiting(self) -> bool:
        """Jobs wait in horusd's queue (or were kept a moment ago and squeue does not show them yet):
        a new job joins them rather than overtake them (caller holds the lock)."""
        return bool(self.queue) or bool(self.unseen_keeps)

    def place(self, request: Request) -> Reply:
        """Decide for one place request: place it now, keep it for the queue, or leave it to Slurm."""
        if request.problem:
            return unchanged(request.problem)
        if request.opted_out:
            return unchanged("the user opted out (--horus-off, HORUS_OFF or horus=off): left to Slurm, never shared")
        with self.lock:
            return self._place(request)

    def _place(self, request: Request) -> Reply:
        """:meth:`place`, the caller holding the lock."""
        if request.records and not request.from_user:  # only job_submit.lua's classes get offers
            self.offers.note_class(request.job_class)
        self._apply_claims()
        state = self.state
        if state is None:
            return unchanged("no cluster state yet")
        if request.gpu_type and request.gpu_type not in state.gpu_types:
            return unchanged(f"no GPU of type {request.gpu_type} here (horusd knows "
                             f"{', '.join(state.gpu_types) or 'none'}): left to Slurm")
        decision_id = new_decision_id()
        req = self.job_request(request, decision_id)
        if request.from_user and request.records and \
                self.ledger.held_for_user(request.uid, self.clock()) + req.n_gpus > MAX_USER_HELD_GPUS:
            return unchanged(f"uid {request.uid} holds {MAX_USER_HELD_GPUS} GPUs in unconfirmed decisions already")
        # a job Slurm could start by preempting others is left to Slurm: kept, it would not preempt
        # a job asking shards is never kept: the movable kept shape (gres:shard:1) would change
        # its request; when there is no room now it is left to Slurm (fail open)
        keeping = request.records and request.keep and self.queue_on and not request.shards and \
            len(self.kept) + len(self.unseen_keeps) < MAX_KEPT and not self.preemption.may_preempt(request.partition)
        if self.queue_on and request.records and self.queue_waiting():
            if keeping:
                return self._keep(req, "jobs wait in horusd's queue: this one joins them", request.held)
            if not request.keep:  # horus-sbatch: no overtaking either; job_submit.lua will keep it
                return unchanged("jobs wait in horusd's queue: this one joins them when submitted")
        if self.left_to_slurm_since is not None:
            why = "jobs left to Slurm may be starting: waiting for a fresh cluster state"
            if keeping:
                return self._keep(req, why, request.held)
            if request.records:
                # this job goes to Slurm unpinned too: only a state read after it may end the pause
                self._left_to_slurm()
            return unchanged(why)
        ctx = SchedulingContext(now=self.clock(), n_waiting=self.pending_jobs + 1,
                                waiting_gpus=self.pending_gpus + req.n_gpus)
        decision = self.policy.decide(state, req, ctx, explain=request.explain)
        # only for job_submit.lua (slurmctld): a request on the user socket is not trusted to take
        # other jobs off the state
        if not decision.placed and request.records and not request.from_user and not keeping and \
                may_reclaim(self.policy) and self.preemption.may_preempt(request.partition):
            decision = self._reclaim(state, req, ctx, decision, request.explain)
        if not decision.placed:
            if keeping:
                return self._keep(req, decision.reason, request.held)
            if request.records:
                self._left_to_slurm()
            return unchanged(decision.reason, candidates=explain_candidates(decision),
                             **candidate_counts(decision, state), **self.class_fields(req.job_class))
        # a job asking shards asked for a share of a GPU: the limit guards the interference
        # model's pairing of whole-GPU jobs, not capacity the user chose to share
        if decision.shared and not req.gpu_units and decision.predicted_slowdown > self.slowdown_limit:
            why = f"predicted slowdown {decision.predicted_slowdown:.2f} over the limit"
            if keeping:
                return self._keep(req, why, request.held)
            if request.records:
                self._left_to_slurm()
            return unchanged(why)
        reply = placement_reply(state, decision, req, self.binding, decision_id, self.state_age(),
                                self.gres_prefix)
        reply.class_known, reply.class_suggestions = self._known_pair(req.job_class)
        if request.records:
            self._record(state, req, decision, reply, request.uid, from_user=request.from_user)
        elif request.offer:
            self.offers.made(decision_id, req, decision, reply, self.clock())
        return reply

    def _reclaim(self, state, req, ctx, failed, explain):
        """The policy's reclaim (DeepBoot), taken by the scheduling cycle's own step
        (:func:`~slurm_horus.placement.cycle.reclaim_for`, as in the simulator) for a job Slurm may
        start by preemption (caller holds the lock). The victims leave the state and the job is pinned
        to their GPUs, so Slurm's preemption (REQUEUE, with the partition's GraceTime) takes exactly
        those jobs, not the ones it would pick itself. Slurm 22.05 cannot take single GPUs from a
        running job: a shrink becomes a requeue of the job. When the job does not fit even so, the
        victims are put back and Slurm decides."""
        taken = []

        def preempt(job_id):
            if job_id in state.jobs:
                taken.append(state.release(job_id))

        decision = reclaim_for(state, self.policy, req, ctx, failed, preempt, explain=explain)
        if not decision.placed:
            for job in taken:
                state.place(job)
            return decision
        if taken:
            self.generation += 1
            decision.reason = f"reclaimed the GPUs of job {','.join(job.job_id for job in taken)}; {decision.reason}"
            log.info("horus: reclaim: partition %s takes the GPUs of %s (Slurm preempts them)",
                     req.partition, ",".join(job.job_id for job in taken))
        return decision

    def _keep(self, req: JobRequest, reason, held=False) -> Reply:
        """Keep the job for the queue (caller holds the lock): the reply tells job_submit.lua how. A held
        job (sbatch -H) waits for its user: it joins the queue only once released, and the jobs that
        come after it do not wait behind it meanwhile."""
        reply = keep_reply(req, self.binding, req.job_id, self.lease_s, reason, self.gres_prefix)
        self.kept_decisions += 1
        if self.on_kept is not None:
            self.on_kept()  # a fresh state soon: the kept job's id, or room that freed meanwhile
        if held:
            return reply
        self.unseen_keeps[req.job_id] = self.clock() + self.ledger.ttl_s
        self.generation += 1  # offers computed while the queue was empty are void
        if self.on_change is not None:
            self.on_change()
        return reply

    # ---- the queue: one scheduling cycle over the kept jobs -------------------------------------
    def cycle(self) -> List[Move]:
        """Run the placement core's scheduling cycle over the kept jobs that may start now; each job
        it starts is recorded (state, ledger) and returned as a Move for Slurm."""
        moves = []
        with self.lock:
            self._apply_claims()
            if self.state is None or not self.queue:
                return moves
            state = self.state

            def start(req, decision):
                kept = self.kept.get(req.job_id)
                if kept is None:
                    return False
                reply = placement_reply(state, decision, req, self.binding, kept.decision_id, self.state_age(),
                                        self.gres_prefix)
                self._record(state, req, decision, reply, None, job_id=req.job_id)
                del self.kept[req.job_id]
                moves.append(Move(kept, reply))
                return True

            self.cycle_options.max_slowdown = self.slowdown_limit  # the same limit as at submission
            run_cycle(state, self.policy, self.queue, self.clock(), start, options=self.cycle_options)
            self.started_from_queue += len(moves)
        return moves

    def forget(self, decision_id):
        """A placement Slurm refused (the job was cancelled meanwhile...): out of the state and the
        ledger; the next refresh shows the job as it is."""
        with self.lock:
            entry = self.ledger.remove(decision_id)
            if entry is not None and self.state is not None and entry.job.job_id in self.state.jobs:
                self.state.release(entry.job.job_id)
                self.generation += 1

    def take_unshaped(self):
        """Kept jobs found asking for no GPU (only a shard move cut short leaves one): to restore."""
        with self.lock:
            unshaped, self.unshaped = sorted(self.unshaped), set()
            return unshaped

    def kept_job_ids(self):
        with self.lock:
            return sorted(self.kept, key=int)

    def queue_summary(self):
        """For ``ping`` and ``horus doctor``: the kept jobs, how many may start, the oldest one's age."""
        with self.lock:
            now = self.clock()
            submitted = [k.request.submit_time for k in self.kept.values() if k.request.submit_time]
            return {"kept": len(self.kept), "waiting": len(self.queue or ()), "unseen": len(self.unseen_keeps),
                    "oldest_s": round(now - min(submitted), 1) if submitted else 0.0,
                    "started_from_queue": self.started_from_queue, "kept_decisions": self.kept_decisions}

    def _record(self, state, req, decision, reply: Reply, uid, job_id="", from_user=False):
        """Put a decision in the state and the ledger (caller holds the lock). A decision asked for on
        the user socket is submitted at once or never: it holds its GPUs only USER_LEDGER_TTL_S."""
        running = self.policy.running_job(req, decision, self.clock())
        running.job_id = reply.id
        running.exclusive = reply.mode == "exclusive"  # whole GPUs: nobody may join
        state.place(running)
        self.generation += 1
        ttl = USER_LEDGER_TTL_S if from_user else self.ledger.ttl_s
        self.ledger.add(LedgerEntry(reply.id, running, self.clock() + ttl, uid=uid, from_user=from_user,
                                    token=reply.token_fields(), job_id=job_id))
        self.decisions += 1
        if self.on_change is not None:
            self.on_change()

    # ---- offers: the next placement of a 1-GPU job of each class, for job_submit.lua ----------
    def compute_offers(self):
        """({class: reply}, generation, last claim, joint): where a 1-GPU job of each recently requested
        class would go now, the state generation they were computed on (publish them only if it is
        still current), the last claim that state includes (job_submit.lua waits for its own), and how
        many of the offers, the first ones in order, are joint.

        *Joint* offers are computed each as if the joint offers before it were taken, so job_submit.lua
        may take any of them together, one per class, without waiting for its claims to be recorded
        (a burst of several classes then asks horusd nothing). Taking only some of them leaves more
        room than each assumed: none can overfill a GPU. A class whose joint offer would share a GPU
        while the cluster has a free one (the offers before it took those) gets an offer computed on
        the state alone instead, after the joint ones: taken alone it would pair a job needlessly, and
        job_submit.lua takes it only as the first offer of its version.

        Not recorded: job_submit.lua takes an offer and then *claims* it (:meth:`claim`), which
        records it. Computed under the lock (the phantoms of the joint offers must not be seen by
        anything else).
        """
        def offer(job_class):
            reply = self._place(Request("place", job_class=job_class, gpus_per_node=1, nodes=1, offer=True))
            return reply if reply.placed and reply.binding != "node" else None

        with self.lock:
            self._apply_claims()
            generation, last_claim = self.generation, self.offers.last_claim
            if self.state is None or self.left_to_slurm_since is not None or self.queue_waiting():
                return {}, generation, last_claim, 0  # waiting jobs go first: nobody may overtake them
            self.offers.forget_older_than(self.clock() - self.ledger.ttl_s)
            state, joint, alone, phantoms = self.state, {}, [], []
            free = state.n_free  # before the phantoms
            try:
                for job_class in list(self.offers.requested_classes):
                    reply = offer(job_class)
                    if reply is None:
                        continue
                    req, decision, _reply, _made = self.offers.offered[reply.id]
                    if phantoms and free and decision.shared:
                        self.offers.take(reply.id)  # never published: it cannot be claimed
                        alone.append(job_class)
                        continue
                    joint[job_class] = reply
                    phantom = self.policy.job_record(req, decision, self.clock())  # not a job that runs
                    phantom.job_id = f"offer-{reply.id}"
                    phantom.exclusive = reply.mode == "exclusive"
                    phantoms.append(state.place(phantom))
            finally:
                for phantom in reversed(phantoms):
                    state.release(phantom.job_id)
            offers = dict(joint)
            for job_class in alone:
                reply = offer(job_class)
                if reply is not None:
                    offers[job_class] = reply
        return offers, generation, last_claim, len(joint)

    def claim(self, request: Request):
        """job_submit.lua applied an offer (it does not wait for an answer). Queued, not applied yet:
        recording it, and what follows (history row, log line, new offers), would take the CPU from
        the submission still in flight. Whatever reads the state next applies the queued claims first."""
        self.offers.claims.append(request)
        if self.on_change is not None:
            self.on_change()

    def apply_claims(self):
        with self.lock:
            self._apply_claims()

    def _apply_claims(self):
        """Record the queued claims as if they had been asked (caller holds the lock)."""
        while self.offers.claims:
            request = self.offers.claims.popleft()
            offer_id = request.decision_id
            found = self.offers.take(offer_id)
            if found is None or self.state is None or offer_id in self.ledger:
                log.warning("horus: claim of unknown or spent offer %s", offer_id)
                continue
            req, decision, reply, _made = found
            if not all(g < self.state.n_gpus for g in decision.gpu_ids):
                continue
            self._record(self.state, req, decision, reply, request.uid)
            self.offers.last_claim = offer_id
            if self.on_claimed is not None:
                self.on_claimed(request, reply)

    def confirm(self, request: Request) -> Reply:
        """job_submit.lua asks whether a horus-sbatch decision is ours; the reply carries its token fields."""
        decision_id = request.decision_id
        with self.lock:
            entry = self.ledger.get(decision_id)
            if entry is None:
                return unchanged(f"no decision {decision_id} in the ledger")
            if entry.uid is not None and entry.uid != request.uid:
                return unchanged(f"decision {decision_id} belongs to another user")
            return Reply("confirm", id=decision_id, **entry.token)

    def _left_to_slurm(self):
        self.left_to_slurm_since = self.clock()
        self.generation += 1
        if self.on_left_to_slurm is not None:
            self.on_left_to_slurm()
        if self.on_change is not None:
            self.on_change()  # withdraw the offers
