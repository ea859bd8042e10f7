"""horusd's brain: cluster state in memory, a ledger of its own decisions, the placement core.

The decision path reads memory only: a background thread re-reads ``sinfo --json`` and
``squeue --json`` every ``refresh_s`` and swaps in a new :class:`ClusterState`; each decision runs
the configured policy of the placement core (the very code the simulator measures) on that state
and records itself in the **ledger**, so that a burst of submissions between two refreshes does not
pile onto one GPU. A ledger entry lives until squeue shows the job that carries its ``horus:<id>``
token in admin_comment (or until it expires: the job may have been rejected by Slurm); from then on
the queue itself holds the job on its GPUs, the token's ``gpus=`` while it is pending (Slurm starts
it there), ``gres_detail`` once it runs.

Job classes: from the hints (``HORUS_CLASS``, or ``HORUS_MODEL`` + ``HORUS_BATCH_SIZE``), the
request's ``job_class`` (horus-sbatch), or ``class=NAME`` in the job comment. A job of unknown
class runs exclusive unless ``share_unknown`` says otherwise.
"""

import logging
import re
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

from ..placement.framework import SchedulingContext
from ..placement.request import JobRequest
from ..placement.state import ClassIndex, ClusterState, RunningJob
from ..tokens import gpu_list, parse_gpu_list, parse_horus_tokens
from .lua_twin import gpu_request

log = logging.getLogger("horusd")

UNKNOWN_CLASS = "unknown"
MAX_OFFER_CLASSES = 64  # the classes that asked most recently get offers
# A decision asked for on the user socket (horus-sbatch) is submitted at once or never: it holds its
# GPUs briefly, and one uid's unconfirmed ones together hold at most this many GPUs.
USER_LEDGER_TTL_S = 15.0
MAX_USER_HELD_GPUS = 4
RUNNING_STATES = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}
_CLASS_IN_COMMENT = re.compile(r"(?:^|[\s,;])(?:horus_)?class=([A-Za-z0-9_.\-]+)")
_SAFE_CLASS = re.compile(r"^[A-Za-z0-9_.\-]+$")
# squeue's state_reason of pending jobs that will not start soon (held, waiting on a job or a time)
_NOT_STARTING_SOON = ("JobHeld", "Dependency", "BeginTime")


def job_class_of(message):
    """The job class a request names, or UNKNOWN_CLASS."""
    hints = message.get("hints") or {}
    name = hints.get("HORUS_CLASS") or message.get("job_class")
    if not name and hints.get("HORUS_MODEL"):
        name = str(hints["HORUS_MODEL"]).lower()
        if hints.get("HORUS_BATCH_SIZE"):
            name += f"-bs{hints['HORUS_BATCH_SIZE']}"
    if not name:
        found = _CLASS_IN_COMMENT.search(message.get("comment") or "")
        name = found.group(1) if found else None
    if not name or not _SAFE_CLASS.match(str(name)):
        return UNKNOWN_CLASS
    return str(name)


@dataclass
class LedgerEntry:
    decision_id: str
    job: RunningJob
    expires: float
    uid: Optional[int] = None  # who asked (a horus-sbatch decision is confirmed for this uid only)
    from_user: bool = False  # asked on the user socket (horus-sbatch), not by job_submit.lua
    token_fields: Dict[str, object] = field(default_factory=dict)  # mode, slowdown, class


@dataclass
class Snapshot:
    """What one refresh read from Slurm (already parsed)."""

    nodes: list  # slurm.parse.NodeInfo
    jobs: list  # slurm.parse.QueueJob
    taken_at: float
    features: Dict[str, str] = field(default_factory=dict)  # node -> gpu type from its features


def node_gpu_count(node):
    return sum(item.count for item in node.gres if item.name == "gpu")


def node_usable(node):
    state = (node.state or "").lower()
    flags = {f.upper() for f in node.state_flags}
    return state not in ("down", "drained", "draining", "drain", "fail", "future", "unknown") and \
        not flags & {"DRAIN", "DOWN", "FAIL", "NOT_RESPONDING"}


def _global_gpu_ids(state, node_indices):
    """[(node name, per-node GPU indices)] -> sorted global GPU ids of ``state``; nodes it does not
    know (down, drained, without GPUs) and indices past a node's GPU count are skipped."""
    gpus = set()
    for node_name, indices in node_indices:
        node_id = state.node_ids.get(node_name)
        if node_id is None:
            continue
        node = state.nodes[node_id]
        gpus.update(node.first_gpu + i for i in indices if i < node.n_gpus)
    return tuple(sorted(gpus))


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
        self.ledger_ttl_s = ledger_ttl_s
        self.clock = clock
        self.classes = ClassIndex(known_classes)
        self.known_classes = set(known_classes)
        self.lock = threading.Lock()
        self.ledger: Dict[str, LedgerEntry] = {}
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
        # classes job_submit.lua asked for, least recently first: they get offers
        self.requested_classes: "OrderedDict[str, None]" = OrderedDict()
        # offer id -> (JobRequest, Decision, reply, made at), oldest first, until claimed or stale
        self.offered: "OrderedDict[str, tuple]" = OrderedDict()
        self.generation = 0  # counts changes of the state: offers computed on an older one are void
        self.claims = deque()  # offers job_submit.lua took, not applied yet (see claim)
        self.last_claim = ""  # id of the offer claimed last: the offers file says which claims it knows
        self.on_claimed = None  # callback(claim message, offer reply) once a claim is recorded
        self.decisions = 0

    # ---- state ----------------------------------------------------------------------------------
    def load_snapshot(self, snapshot: Snapshot):
        """Build a fresh ClusterState from Slurm's view plus the still-unseen ledger entries."""
        state = ClusterState(max_jobs_per_gpu=self.max_jobs_per_gpu, classes=self.classes)
        for node in snapshot.nodes:
            count = node_gpu_count(node)
            if count == 0 or not node_usable(node):
                continue
            gpu_type = snapshot.features.get(node.name) or self.default_gpu_type
            state.add_node(node.name, gpu_type, count, self.gpu_memory_mb(gpu_type), node.partitions or ("default",))
        state.build()
        seen_tokens = set()
        pending = pending_gpus = 0
        for job in snapshot.jobs:
            decision_id, fields = parse_horus_tokens(job.admin_comment)
            if decision_id:
                seen_tokens.add(decision_id)
            if job.state == "PENDING":
                pending += 1
                pending_gpus += sum(item.count for item in job.gres_requested if item.name == "gpu")
                reserved = self._pinned_pending_job(state, job, fields, snapshot.taken_at)
                if reserved is not None:
                    state.place(reserved)
            if job.state not in RUNNING_STATES:
                continue
            running = self._running_job_from_queue(state, job, snapshot.taken_at)
            if running is not None:
                state.place(running)
        with self.lock:
            self._apply_claims()  # into the old state and the ledger, which carries them over
            now = self.clock()
            for decision_id in list(self.ledger):
                entry = self.ledger[decision_id]
                if decision_id in seen_tokens or entry.expires < now:
                    del self.ledger[decision_id]
                    continue
                if all(g < state.n_gpus for g in entry.job.gpus):
                    state.place(RunningJob(**{**entry.job.__dict__, "class_id": -1}))
            self.state = state
            self.generation += 1
            self.snapshot_time = snapshot.taken_at
            self.pending_jobs = pending
            self.pending_gpus = pending_gpus
            if self.left_to_slurm_since is not None and snapshot.taken_at > self.left_to_slurm_since:
                self.left_to_slurm_since = None
        if self.on_change is not None:
            self.on_change()

    def _running_job_from_queue(self, state, job, now):
        by_node = job.gres_by_node()
        gpus = _global_gpu_ids(state, [(node_name, item.indices) for node_name, items in by_node for item in items
                                       if item.name in ("gpu", "shard") and item.count > 0])
        if not gpus:
            return None
        holds_whole_gpu = any(item.name == "gpu" and item.count > 0 for _n, items in by_node for item in items)
        end = float(job.end_time) if job.end_time else now + 3600.0
        return RunningJob(str(job.job_id), self._class_of_running(job), gpus, float(job.start_time or now),
                          end, exclusive=holds_whole_gpu, user=job.user, partition=job.partition)

    def _pinned_pending_job(self, state, job, fields, now):
        """A queued job that a decision pinned (its token's ``gpus=``) holds those GPUs in our state
        until it runs: Slurm starts it there, and squeue showing its token has ended its ledger entry.
        Held or dependent jobs may wait for hours: they reserve nothing."""
        if not fields.get("gpus") or job.state_reason.startswith(_NOT_STARTING_SOON):
            return None
        gpus = _global_gpu_ids(state, parse_gpu_list(fields["gpus"]))
        if not gpus:
            return None
        limit_s = job.time_limit * 60.0 if job.time_limit else 3600.0
        return RunningJob(str(job.job_id), self._class_of_running(job), gpus, now, now + limit_s,
                          exclusive=fields.get("mode") == "exclusive", user=job.user, partition=job.partition)

    def _class_of_running(self, job):
        _decision_id, fields = parse_horus_tokens(job.admin_comment)
        if fields.get("class") and _SAFE_CLASS.match(fields["class"]):
            return fields["class"]
        return job_class_of({"comment": job.comment})

    # ---- decisions ------------------------------------------------------------------------------
    def state_age(self):
        return max(0.0, self.clock() - self.snapshot_time) if self.snapshot_time else float("inf")

    def place(self, message, record=True):
        """Decide for one request; returns the reply dict (see protocol.py)."""
        request, why = requested_gpus(message)
        if request is None:
            return unchanged(why)
        job_class = job_class_of(message)
        from_user = message.get("peer") == "user"
        if record and not message.get("dry_run") and not from_user:
            self._note_class(job_class)
        may_share = job_class != UNKNOWN_CLASS or self.share_unknown
        with self.lock:
            self._apply_claims()
            state = self.state
            if state is None:
                return unchanged("no cluster state yet")
            if self.left_to_slurm_since is not None:
                return unchanged("jobs left to Slurm may be starting: waiting for a fresh cluster state")
            decision_id = "h" + uuid.uuid4().hex[:10]
            time_limit = message.get("time_limit_min")
            req = JobRequest(
                job_id=decision_id, job_class=job_class, gpus_per_node=request["gpus_per_node"],
                nodes=request["nodes"], partition=message.get("partition") or "",
                time_limit=float(time_limit) * 60 if time_limit else None,
                user=str(message.get("user") or ""), submit_time=self.clock(),
                # only typed shards let a second job join a GPU; indexed/node bindings hold whole GPUs
                exclusive=not may_share or self.binding != "shard",
            )
            if req.partition and "," in req.partition:
                first, *rest = [p for p in req.partition.split(",") if p]
                req.partition, req.extra_partitions = first, tuple(rest)
            uid = _int_or_none(message.get("uid"))
            if from_user and record and not message.get("dry_run") and \
                    self._held_for_user(uid) + req.n_gpus > MAX_USER_HELD_GPUS:
                return unchanged(f"uid {uid} holds {MAX_USER_HELD_GPUS} GPUs in unconfirmed decisions already")
            ctx = SchedulingContext(now=self.clock(), n_waiting=self.pending_jobs + 1,
                                    waiting_gpus=self.pending_gpus + req.n_gpus)
            decision = self.policy.decide(state, req, ctx, explain=bool(message.get("explain")))
            recording = record and not message.get("dry_run")
            if not decision.placed:
                if recording:
                    self._left_to_slurm()
                return unchanged(decision.reason, candidates=explain_candidates(decision))
            if decision.shared and decision.predicted_slowdown > self.slowdown_limit:
                if recording:
                    self._left_to_slurm()
                return unchanged(f"predicted slowdown {decision.predicted_slowdown:.2f} over the limit")
            reply = self._reply(state, decision, req, job_class, decision_id)
            if recording:
                self._record(state, req, decision, reply, uid, from_user=from_user)
            elif message.get("offer"):
                self.offered[decision_id] = (req, decision, reply, self.clock())
            return reply

    def _note_class(self, job_class):
        """``job_class`` asked just now: it gets offers; the class that asked least recently makes room."""
        self.requested_classes[job_class] = None
        self.requested_classes.move_to_end(job_class)
        while len(self.requested_classes) > MAX_OFFER_CLASSES:
            self.requested_classes.popitem(last=False)

    def _held_for_user(self, uid):
        """GPUs held by ``uid``'s unconfirmed decisions from the user socket (caller holds the lock)."""
        now = self.clock()
        return sum(len(e.job.gpus) for e in self.ledger.values() if e.from_user and e.uid == uid and e.expires >= now)

    def _record(self, state, req, decision, reply, uid, from_user=False):
        """Put a decision in the state and the ledger (caller holds the lock)."""
        running = self.policy.running_job(req, decision, self.clock())
        running.exclusive = reply["mode"] == "exclusive"  # whole GPUs: nobody may join
        state.place(running)
        self.generation += 1
        ttl = USER_LEDGER_TTL_S if from_user else self.ledger_ttl_s
        self.ledger[reply["id"]] = LedgerEntry(
            reply["id"], running, self.clock() + ttl, uid=uid, from_user=from_user,
            token_fields={k: reply[k] for k in ("mode", "slowdown", "class", "gpulist")})
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
            generation, last_claim = self.generation, self.last_claim
            if self.state is None or self.left_to_slurm_since is not None:
                return {}, generation, last_claim
            classes = list(self.requested_classes)
            oldest_kept = self.clock() - self.ledger_ttl_s
            # every publish adds one offer per class: drop from the old end, never scan them all
            while self.offered and next(iter(self.offered.values()))[3] < oldest_kept:
                self.offered.popitem(last=False)
        offers = {}
        for job_class in classes:
            reply = self.place({"op": "place", "gpus_per_node": 1, "num_nodes": 1, "job_class": job_class,
                                "offer": True}, record=False)
            if reply.get("action") == "place" and reply.get("binding") != "node":
                offers[job_class] = reply
        return offers, generation, last_claim

    def claim(self, message):
        """job_submit.lua applied an offer (it does not wait for an answer). Queued, not applied yet:
        recording it, and what follows (history row, log line, new offers), would take the CPU from
        the submission still in flight. Whatever reads the state next applies the queued claims first."""
        self.claims.append(message)
        if self.on_change is not None:
            self.on_change()

    def apply_claims(self):
        with self.lock:
            self._apply_claims()

    def _apply_claims(self):
        """Record the queued claims as if they had been asked (caller holds the lock)."""
        while self.claims:
            message = self.claims.popleft()
            offer_id = str(message.get("id") or "")
            found = self.offered.pop(offer_id, None)
            if found is None or self.state is None or offer_id in self.ledger:
                log.warning("horus: claim of unknown or spent offer %s", offer_id)
                continue
            req, decision, reply, _made = found
            if not all(g < self.state.n_gpus for g in decision.gpu_ids):
                continue
            self._record(self.state, req, decision, reply, _int_or_none(message.get("uid")))
            self.last_claim = offer_id
            if self.on_claimed is not None:
                self.on_claimed(message, reply)

    def confirm(self, message):
        """job_submit.lua asks whether a horus-sbatch decision is ours; the reply carries its token fields."""
        decision_id = str(message.get("id") or "")
        with self.lock:
            entry = self.ledger.get(decision_id)
            if entry is None:
                return unchanged(f"no decision {decision_id} in the ledger")
            uid = _int_or_none(message.get("uid"))
            if entry.uid is not None and entry.uid != uid:
                return unchanged(f"decision {decision_id} belongs to another user")
            return {"ok": True, "action": "confirm", "id": decision_id, **entry.token_fields}

    def _left_to_slurm(self):
        self.left_to_slurm_since = self.clock()
        self.generation += 1
        if self.on_left_to_slurm is not None:
            self.on_left_to_slurm()
        if self.on_change is not None:
            self.on_change()  # withdraw the offers

    def _reply(self, state, decision, req, job_class, decision_id):
        node_gpus = decision.gpus
        index_sets = {tuple(sorted(v)) for v in node_gpus.values()}
        binding = self.binding
        if binding == "shard" and (req.n_gpus > 1 or req.exclusive):
            binding_used = "indexed"  # multi-GPU and exclusive jobs hold whole GPUs
        else:
            binding_used = binding
        if binding_used in ("indexed", "shard") and len(index_sets) > 1:
            binding_used = "node"  # one tres_per_node string cannot name different GPUs per node
        indices = sorted(next(iter(index_sets)))
        if binding_used == "shard":
            tres = ",".join(f"gres:shard:g{i}:1" for i in indices)
        elif binding_used == "indexed":
            tres = ",".join(f"gres:gpu:g{i}:1" for i in indices)
        else:
            tres = f"gres:gpu:{req.gpus_per_node}"
        # shared: joins a GPU that runs another job; shareable: alone on a shard, others may join
        mode = "shared" if decision.shared else ("shareable" if binding_used == "shard" else "exclusive")
        partition = ""
        if req.extra_partitions:
            node = state.nodes[state.node_ids[decision.nodes[0]]]
            if req.partition not in node.partitions:
                partition = next(p for p in req.extra_partitions if p in node.partitions)
        return {
            "ok": True, "action": "place", "id": decision_id, "decision_id": decision_id,
            # tres: job_desc's tres_per_node (job_submit.lua); gres: the same as sbatch --gres
            "nodes": list(decision.nodes), "gpus": node_gpus, "gpulist": gpu_list(node_gpus), "tres": tres,
            "gres": ",".join(item[len("gres:"):] for item in tres.split(",")), "job_class": job_class,
            "binding": binding_used, "mode": mode, "class": job_class,
            "slowdown": round(decision.predicted_slowdown, 3),
            "predicted_slowdown": round(decision.predicted_slowdown, 3),
            "corunner_slowdowns": {k: round(1.0 / v, 3) if v > 0 else None
                                   for k, v in decision.corunner_norm_tput.items()},
            "reason": decision.reason, "policy": decision.policy, "partition": partition or None,
            "age": round(self.state_age(), 3),
            "candidates": explain_candidates(decision),
        }


def explain_candidates(decision):
    """The candidates a policy weighed, in the shape ``horus-sbatch --explain`` prints."""
    chosen = {f"{node}:gpu{index}" for node, indices in decision.gpus.items() for index in indices}
    out = []
    for candidate in decision.candidates:
        node, _, gpu = candidate.where.partition(":gpu")
        out.append({
            "node": node, "gpus": [int(gpu)] if gpu.isdigit() else [],
            "predicted_slowdown": round(1.0 / candidate.job_tput, 3) if candidate.job_tput > 0 else None,
            "why": f"{candidate.note}; score {candidate.score:.3f}", "chosen": candidate.where in chosen,
        })
    return out


def requested_gpus(message):
    """({"gpus_per_node", "nodes"}, None) from a request, or (None, why) when it asks for no GPU or
    makes no sense. job_submit.lua sends the counts it read (its Python twin is gpu_request);
    other clients may send the raw TRES strings instead."""
    if "gpus_per_node" in message:
        try:
            nodes = message.get("num_nodes")
            request = {"gpus_per_node": int(message["gpus_per_node"]), "nodes": 1 if nodes is None else int(nodes)}
        except (TypeError, ValueError):
            return None, "bad gpus_per_node or num_nodes"
    else:
        request, why = gpu_request({k: message.get(k) for k in
                                    ("tres_per_node", "tres_per_job", "tres_per_task", "min_nodes", "num_tasks")})
        if request is None:
            return None, why or "no gpu requested"
    if request["gpus_per_node"] < 1 or request["nodes"] < 1:
        return None, "no gpu requested"
    return request, None


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def unchanged(reason, **extra):
    reply = {"ok": True, "action": "unchanged", "reason": reason}
    reply.update(extra)
    return reply
