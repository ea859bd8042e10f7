"""horusd's placer: the cluster state in memory, the placement core, the ledger, offers and claims.

The decision path reads memory only: a background thread re-reads ``sinfo``/``squeue --json`` and
hands the snapshot to :meth:`Placer.load_snapshot`, which builds a fresh :class:`ClusterState`
(snapshot.py) and puts back the placements squeue does not show yet (ledger.py). Each decision runs
the configured policy of the placement core (the very code the simulator measures) on that state.
Requests arrive typed (protocol.py); replies are formatted by replies.py.
"""

import logging
import threading
import time
import uuid
from typing import Callable, Optional

from ..placement.framework import SchedulingContext
from ..placement.request import JobRequest
from ..placement.state import ClassIndex, ClusterState
from ..jobclass import UNKNOWN_CLASS
from .ledger import Ledger, LedgerEntry
from .offers import OfferBook
from .protocol import Reply, Request, unchanged
from .replies import explain_candidates, placement_reply
from .snapshot import Snapshot, translate

log = logging.getLogger("horusd")


def new_decision_id():
    return "h" + uuid.uuid4().hex[:10]


class Placer:
    """Turns place requests into decisions and keeps the ledger. Thread-safe."""

    def __init__(self, policy, binding="indexed", gpu_type="v100", gpu_memory_mb: Callable[[str], float] = None,
                 max_jobs_per_gpu=2, share_unknown=False, slowdown_limit=1.5, ledger_ttl_s=60.0,
                 clock=time.time, known_classes=()):
        self.policy = policy
        self.binding = binding
        self.default_gpu_type = gpu_type
        self.gpu_memory_mb = gpu_memory_mb or (lambda _t: 16384.0)
        self.max_jobs_per_gpu = max_jobs_per_gpu
        self.share_unknown = share_unknown
        self.slowdown_limit = slowdown_limit
        self.clock = clock
        self.classes = ClassIndex(known_classes)
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

    @property
    def ledger_ttl_s(self):
        return self.ledger.ttl_s

    # ---- state ----------------------------------------------------------------------------------
    def load_snapshot(self, snapshot: Snapshot):
        """Build a fresh ClusterState from Slurm's view plus the ledger entries squeue does not show."""
        view = translate(snapshot, self.classes, self.max_jobs_per_gpu, self.default_gpu_type, self.gpu_memory_mb)
        with self.lock:
            self._apply_claims()  # into the old state and the ledger, which carries them over
            self.ledger.settle(view.placed_tokens, self.clock())
            self.ledger.reapply(view.state)
            self.state = view.state
            self.generation += 1
            self.snapshot_time = snapshot.taken_at
            self.pending_jobs = view.pending_jobs
            self.pending_gpus = view.pending_gpus
            if self.left_to_slurm_since is not None and snapshot.taken_at > self.left_to_slurm_since:
                self.left_to_slurm_since = None
        if self.on_change is not None:
            self.on_change()

    def state_age(self):
        return max(0.0, self.clock() - self.snapshot_time) if self.snapshot_time else float("inf")

    # ---- decisions ------------------------------------------------------------------------------
    def job_request(self, request: Request, decision_id) -> JobRequest:
        may_share = request.job_class != UNKNOWN_CLASS or self.share_unknown
        partitions = [p for p in request.partition.split(",") if p]
        return JobRequest(
            job_id=decision_id, job_class=request.job_class, gpus_per_node=request.gpus_per_node,
            nodes=request.nodes, partition=partitions[0] if partitions else "",
            extra_partitions=tuple(partitions[1:]), time_limit=request.time_limit_s, user=request.user,
            submit_time=self.clock(),
            # only typed shards let a second job join a GPU; indexed/node bindings hold whole GPUs
            exclusive=not may_share or self.binding != "shard",
        )

    def place(self, request: Request) -> Reply:
        """Decide for one place request."""
        if request.problem:
            return unchanged(request.problem)
        if request.records:
            self.offers.note_class(request.job_class)
        with self.lock:
            self._apply_claims()
            state = self.state
            if state is None:
                return unchanged("no cluster state yet")
            if self.left_to_slurm_since is not None:
                return unchanged("jobs left to Slurm may be starting: waiting for a fresh cluster state")
            decision_id = new_decision_id()
            req = self.job_request(request, decision_id)
            ctx = SchedulingContext(now=self.clock(), n_waiting=self.pending_jobs + 1,
                                    waiting_gpus=self.pending_gpus + req.n_gpus)
            decision = self.policy.decide(state, req, ctx, explain=request.explain)
            if not decision.placed:
                if request.records:
                    self._left_to_slurm()
                return unchanged(decision.reason, candidates=explain_candidates(decision))
            if decision.shared and decision.predicted_slowdown > self.slowdown_limit:
                if request.records:
                    self._left_to_slurm()
                return unchanged(f"predicted slowdown {decision.predicted_slowdown:.2f} over the limit")
            reply = placement_reply(state, decision, req, self.binding, decision_id, self.state_age())
            if request.records:
                self._record(state, req, decision, reply, request.uid)
            elif request.offer:
                self.offers.made(decision_id, req, decision, reply, self.clock())
            return reply

    def _record(self, state, req, decision, reply: Reply, uid, job_id=""):
        """Put a decision in the state and the ledger (caller holds the lock)."""
        running = self.policy.running_job(req, decision, self.clock())
        running.job_id = reply.id
        running.exclusive = reply.mode == "exclusive"  # whole GPUs: nobody may join
        state.place(running)
        self.generation += 1
        self.ledger.add(LedgerEntry(reply.id, running, self.clock() + self.ledger.ttl_s, uid=uid,
                                    token=reply.token_fields(), job_id=job_id))
        self.decisions += 1
        if self.on_change is not None:
            self.on_change()

    # ---- offers: the next placement of a 1-GPU job of each class, for job_submit.lua ----------
    def compute_offers(self):
        """({class: reply}, generation, last claim): where a 1-GPU job of each recently requested class
        would go now, the state generation they were computed on (publish them only if it is still
        current) and the last claim that state includes (job_submit.lua waits for its own).

        Not recorded: job_submit.lua takes one offer per published version and then *claims* it
        (:meth:`claim`), which records it; every other offer of that version is dead for it.
        """
        with self.lock:
            self._apply_claims()
            generation, last_claim = self.generation, self.offers.last_claim
            if self.state is None or self.left_to_slurm_since is not None:
                return {}, generation, last_claim
            classes = list(self.offers.requested_classes)
            self.offers.forget_older_than(self.clock() - self.ledger.ttl_s)
        offers = {}
        for job_class in classes:
            reply = self.place(Request("place", job_class=job_class, gpus_per_node=1, nodes=1, offer=True))
            if reply.placed and reply.binding != "node":
                offers[job_class] = reply
        return offers, generation, last_claim

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
