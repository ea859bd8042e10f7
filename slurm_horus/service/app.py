"""``horus serve``: wire the site config, the Slurm reader, the placement core and the sockets.

Lifecycle: read config → build the interference model and the policy → first refresh from Slurm →
listen. A background thread refreshes the cluster state every ``refresh_s``; another runs the
scheduling cycle over the jobs horusd keeps (after every refresh, at least every ``cycle_s``) and
starts what it places (mover.py); a third renews the kept jobs' lease; SIGHUP (or a
``{"op": "reload"}`` on the controller socket) re-reads the site file, the fitted model and the run
times of the history store (the duration estimator; also every 5 minutes) and swaps
them in between two requests, so no request is dropped. SIGTERM/SIGINT stop cleanly.

Failover: with a backup controller (``SlurmctldHost`` twice), horusd runs beside each slurmctld, each
told which one it serves (``controller_host``, default: this host's short name). Every
``CONTROLLER_CHECK_S`` each asks ``scontrol ping`` which controller is in control (the first that
answers, in SlurmctldHost order). Only the horusd beside it answers: the other one leaves every job
to Slurm ("standby"), publishes no offers, reads no state, runs no cycle, renews no lease and writes
nothing to the history database. When control moves, the new active horusd starts from an empty
ledger and rebuilds its cluster state and its queue from squeue (the jobs the other one placed or
kept carry their ``horus:`` tokens there) before it answers.
"""

import logging
import os
import resource
import signal
import socket
import threading
import time

from ..config import load_config
from ..errors import HorusError
from ..placement.pairs import joinable_share
from ..placement.policies import PolicyModels, make_policy
from ..slurm import queries
from ..slurm.parse import active_controller
from ..slurm.partitions import Preemption, read_preemption
from .daemon import Placer
from .history import History
from .mover import Mover
from .offers import OffersFile
from .protocol import error, parse_request, unchanged
from .snapshot import Snapshot
from .threads import run_in_background
from .server import Frontend, raise_fd_limit

log = logging.getLogger("horusd")

OFFER_DELAY_S = 0.003
# The refresher waits ~20x what a refresh cost slurmctld (~5 % of its time), between refresh_s and
# this bound. The cost is CPU time (squeue/sinfo's and our parsing), not wall time: time spent waiting
# on a slurmctld that restarts or hangs is no work of its, and must not stop the refreshes.
REFRESH_COST_FACTOR = 20
MAX_REFRESH_INTERVAL_S = 30.0


def refresh_interval(refresh_s, cost_s):
    """Seconds to wait before the next refresh after one that cost ``cost_s`` seconds of CPU."""
    return min(max(refresh_s, REFRESH_COST_FACTOR * cost_s), max(refresh_s, MAX_REFRESH_INTERVAL_S))


def _cpu_seconds():
    """CPU time of this thread plus that of the finished child processes (squeue, sinfo)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime
# an early refresh (a job was kept, or left to Slurm) starts this long after the last one at the
# soonest, and no sooner than the last one took: a burst of submissions folds into few squeue calls
MIN_REFRESH_GAP_S = 0.1
CONTROLLER_CHECK_S = 2.0  # how often each horusd asks which slurmctld is in control (failover)

_KNOWN_GPU_TYPES = ("a100", "a10", "a30", "a40", "h100", "h200", "k80", "l4", "l40", "p100", "rtx3090", "t4",
                    "v100")


class SlurmReader:
    """Reads the cluster from ``squeue --json`` and the nodes (``sinfo --json`` on 22.05,
    ``scontrol --json show nodes`` later; see slurm.queries.SlurmSource), on any supported Slurm.

    Jobs come and go every few seconds, nodes rarely: nodes are re-read only every
    ``nodes_every`` reads (and on the first), which halves what a refresh costs slurmctld.
    The snapshot names the Slurm version the JSON came from: decisions are spelled for it.
    """

    def __init__(self, slurm_conf=None, timeout_s=10.0, nodes_every=5):
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s
        self.source = queries.SlurmSource(slurm_conf, timeout_s)
        self.nodes_every = nodes_every
        self._reads = 0
        self._nodes = None
        self._preemption = Preemption()

    def read(self):
        taken_at = time.time()
        if self._nodes is None or self._reads % self.nodes_every == 0:
            self._nodes = self.source.nodes()
            try:
                self._preemption = read_preemption(self.slurm_conf, self.timeout_s)
            except HorusError as exc:
                log.warning("horus: cannot read Slurm's preemption settings (%s): assuming none", exc)
        self._reads += 1
        nodes = self._nodes
        jobs = self.source.jobs()
        features = {}
        for node in nodes:
            for feature in getattr(node, "features", ()) or ():
                if feature.lower() in _KNOWN_GPU_TYPES:
                    features[node.name] = feature.lower()
        return Snapshot(nodes=nodes, jobs=jobs, taken_at=taken_at, features=features, preemption=self._preemption,
                        slurm_version=self.source.version)


def check_serve_config(config):
    """Raise HorusError for what ``horus serve`` refuses in a configuration (an unknown policy or
    policy option, a bad tcp address); ``horus doctor`` runs the very same check."""
    from ..placement.state import ClassIndex

    try:  # no model is built: the check is about names and options
        make_policy(config.policy, PolicyModels(ClassIndex(), lambda kind: None))
    except (ValueError, TypeError) as exc:
        raise HorusError(f"policy {config.policy!r}: {exc}") from None
    if config.tcp:
        _host, sep, port = config.tcp.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise HorusError(f"tcp: expected host:port, got {config.tcp!r}")


def duration_settings(config):
    """The duration estimator's settings for the site config (``duration_levels``, ``duration_recent``)."""
    from ..placement.duration import DurationSettings

    return DurationSettings(adaptive=config.duration_levels == "measured", recent_by=config.duration_recent)


def build_placer(config, predictor_factory=None, history=None):
    """A Placer for the site config. Models: the newest one stored in the history database when it
    is of the kind a policy asks for (a refit learned the site's own pairs), else the built-in priors."""
    from ..interference import build_model, gpu_memory_mb
    from ..placement.duration import DurationEstimator

    cache = {}

    def factory(kind):
        if predictor_factory is not None:
            return predictor_factory(kind)
        if kind not in cache:
            cache[kind] = (history.active_model(kind) if history is not None else None) or build_model(kind)
        return cache[kind]

    placer = Placer(None, binding=config.binding, gpu_type=config.gpu_type, gpu_memory_mb=gpu_memory_mb,
                    max_jobs_per_gpu=config.max_jobs_per_gpu, share_unknown=config.share_unknown,
                    slowdown_limit=config.slowdown_limit, queue=config.queue,
                    lease_s=min(max(config.lease_s, 5.0), 3600.0))
    placer.durations = DurationEstimator(duration_settings(config))  # (time limits only until history is read)
    models = PolicyModels(placer.classes, factory)
    try:
        placer.policy = make_policy(config.policy, models)
    except ValueError as exc:
        raise HorusError(f"policy: {exc}") from None
    if history is not None:  # the pairs measured on this cluster count as measured, as in the simulator
        for seen in history.local_pairs():
            placer.policy.observe(seen.gpu_type, seen.job_class, seen.corunner_class, seen.norm_tput)
    # the classes the policy's model knows: any other class is treated as unknown (a GPU of its own)
    for table in placer.policy.pair_tables():
        placer.known_classes |= set(getattr(getattr(table.predictor, "index", None), "names", ()))
    return placer


def _slurm_controllers():
    return queries.controllers(timeout=5.0)


class Horusd:
    def __init__(self, config, reader=None, predictor_factory=None, controllers=_slurm_controllers):
        check_serve_config(config)
        self.config = config
        self.reader = reader or SlurmReader()
        self.predictor_factory = predictor_factory
        # failover: the SlurmctldHost this horusd serves, and whether that slurmctld is in control
        self.controllers = controllers
        self.controller_host = config.controller_host or socket.gethostname().split(".")[0]
        self.active = True
        self.in_control = None  # the controller in control, when there is a backup
        self._rebuilding = False  # took over, state not read from squeue yet
        # a refit stored a new model, or the feed found the pairs measured here changed: rebuild
        self.history = History(config.db, refit_s=config.refit_s, gpu_type=config.gpu_type,
                               learn_pairs=config.learn_pairs,
                               on_refit=lambda: self.reload_soon("a model refit"),
                               # (the feed has just handed over fresh run times: not read again)
                               on_pairs=lambda: self.reload_soon("new pairs measured", read_durations=False),
                               is_active=lambda: self.active, on_durations=self.set_durations,
                               duration_settings=duration_settings(config))
        self.placer = build_placer(config, predictor_factory, self.history)
        self.durations = None  # the duration estimator fed from the history store (None: not read yet)
        self.frontend = Frontend(self.decide, config.socket, tcp=config.tcp or None, after_reply=self.after_reply)
        self._decision_ms = 0.0
        self.stopping = threading.Event()
        self.wake = threading.Event()  # set: refresh now instead of at the next tick
        self.ended_notices = 0  # jobs EpilogSlurmctld said ended (ping: is it set up?); the worker's alone
        self._cycle_lock = threading.Lock()  # the cycle thread and job_ended's cycle, one at a time
        self._moved_during_renewal = None  # while a lease renewal runs: the kept jobs moved meanwhile
        self.offers_changed = threading.Event()
        self.cycle_wanted = threading.Event()  # set: run the scheduling cycle now
        self.mover = Mover(getattr(self.reader, "slurm_conf", None))
        self.released_by_switch = set()  # kept jobs let go while the kill switch is on
        self._wire(self.placer)
        self.offers_file = OffersFile(config.socket + ".offers")
        self.refresh_errors = 0
        self.refresh_interval = config.refresh_s
        self._refresher = None
        self._threads = []  # vital background threads: if one dies, horusd exits (its supervisor restarts it)
        self.fatal = None  # why horusd must exit
        self._reload_lock = threading.Lock()  # SIGHUP, a refit and the controller socket may all ask at once
        self.reloads = 0  # reloads done (SIGHUP, reload, a refit, the feed's new pairs): ping says
        self.frontend.on_fatal = self._die
        self._joinable = (None, {})  # (what it was computed for, joinable_shares' answer)

    def joinable_shares(self):
        """Per GPU type of the cluster, the share of the (job class, resident class) pairs of the
        classes the model knows where a job may join under ``slowdown_limit`` (:func:`joinable_share`):
        on a GPU type whose pairs the model lacks, its guesses are cautious, the limit keeps most pairs
        apart, and pairs are measured only where jobs share (``horus doctor`` warns; docs/horusd.md).
        Kept until the model, the measured pairs or the GPU types change; {} when it cannot be told."""
        placer = self.placer
        try:
            tables = placer.policy.pair_tables() if placer.policy is not None else []
            if not tables or placer.state is None:
                return {}
            table, limit = tables[0], float(self.config.slowdown_limit)
            # the table itself, not its id: a reload's new table may reuse a freed one's id
            key = (table, table.n_observations, tuple(placer.state.gpu_types), limit)
            kept = self._joinable[0]
            if kept is None or kept[0] is not table or kept[1:] != key[1:]:
                names = sorted(placer.known_classes)
                shares = {gpu: joinable_share(table, names, gpu, limit) for gpu in placer.state.gpu_types}
                self._joinable = (key, {gpu: round(v, 3) for gpu, v in shares.items() if v is not None})
            return self._joinable[1]
        except Exception as exc:  # a ping always answers
            log.warning("horus: ping could not tell the joinable pairs: %s", exc)
            return {}

    def set_durations(self, estimator):
        """A duration estimator fed with fresh history: the placer uses it from its next decision."""
        self.durations = estimator
        self.placer.set_durations(estimator)
        log.info("horus: duration estimates from %d finished GPU jobs of the history store", estimator.observed)

    def _wire(self, placer):
        placer.on_left_to_slurm = self.wake.set
        placer.on_kept = self.wake.set  # squeue names the kept job's id: then the cycle may place it
        placer.on_change = self.state_changed
        placer.on_claimed = self.claimed

    # ---- requests -------------------------------------------------------------------------------
    def decide(self, message):
        """One decoded request line -> the reply's wire dict (None: a claim, answered with nothing)."""
        request = parse_request(message)
        op = request.op
        if op == "ping":
            # no state read yet (a standby horusd, a first refresh that failed): inf is no JSON number
            return {"ok": True, "state_age_s": round(min(self.placer.state_age(), 1e9), 3),
                    "decisions": self.placer.decisions, "ledger": len(self.placer.ledger),
                    "refresh_interval_s": round(self.refresh_interval, 3), "policy": self.config.policy,
                    "pid": os.getpid(), "queue": self.placer.queue_summary(), "lease_s": self.placer.lease_s,
                    "active": self.active, "controller": self.controller_host, "in_control": self.in_control,
                    "jobs": len(self.placer.state.jobs) if self.placer.state is not None else 0,
                    "duration_history_jobs": self.placer.durations.observed,
                    "duration_order": self.placer.durations.order_text,
                    "pairs_measured": len(self.history.told_pairs or ()),
                    "policy_counters": self.placer.policy.counters() if self.placer.policy is not None else {},
                    "reloads": self.reloads, "ended_notices": self.ended_notices,
                    "slowdown_limit": self.config.slowdown_limit,
                    "joinable_under_slowdown_limit": self.joinable_shares()}
        if not self.active and op != "reload":
            if op in ("claim", "left"):
                return None  # notifications
            if op == "ended":
                return {"ok": True, "moved": 0}
            if op == "place":
                return unchanged(f"standby: slurmctld on {self.controller_host} is not in control "
                                 f"({self.in_control or 'none'} is)").wire()
            return error("standby")
        if op == "reload":
            try:
                self.reload()
            except Exception as exc:  # (a site file being edited): say why; the running one stays
                log.warning("horus: reload failed, the running config and policy stay: %s", exc)
                return error(f"reload failed, the running config and policy stay: {exc}")
            return {"ok": True, "reloaded": True}
        if op == "confirm":
            return self.placer.confirm(request).wire()
        if op == "claim":
            self.placer.claim(request)
            return None  # a notification: nothing is sent back
        if op == "left":
            self.placer.note_left_to_slurm()  # a GPU job job_submit.lua left to Slurm (a notification)
            return None
        if op == "ended":
            return self.job_ended(request.job_ids)  # EpilogSlurmctld (answered by the server's worker)
        if op != "place":
            return error(f"unknown op {message.get('op')!r}")
        placer = self.placer  # one consistent placer per request, even during a reload
        if placer.state_age() > max(30.0, 10 * self.config.refresh_s, 3 * self.refresh_interval):
            return unchanged("cluster state is stale").wire()
        started = time.perf_counter()
        reply = placer.place(request)
        self._decision_ms = (time.perf_counter() - started) * 1000
        if self.config.offers and not request.dry_run:
            self._spend_offers(request, reply)
        return reply.wire()

    def claimed(self, request, offer):
        """A claim was recorded (by whichever thread read the state next): history row and log line."""
        self.history.record(request.user, offer.wire())
        log.info("horus: decision user=%s class=%s action=claim nodes=%s tres=%s slowdown=%s: offer %s taken",
                 request.user, offer.job_class, ",".join(offer.nodes), offer.tres, offer.slowdown, offer.id)

    def _spend_offers(self, request, reply):
        """Offers published before this decision do not know it: none may be taken after its reply.

        job_submit.lua runs one submission at a time and learns from the reply which offers version
        is spent (``offers_version``), which costs nothing here. Any other client (horus-sbatch) is
        followed by submissions that never saw its reply: for those the offers are withdrawn now.
        Read under the file lock: a publish in progress (computed before this decision) is spent too.
        """
        if request.kv:
            with self.offers_file.lock:
                reply.offers_version = self.offers_file.version
        elif reply.placed:
            with self.offers_file.lock:
                self.offers_file.withdraw()

    def after_reply(self, message, reply):
        """Called by the front once the reply is sent: the log line and the history row wait until
        then, so that job_submit.lua (and slurmctld's job lock) do not wait for them."""
        if message.get("op") != "place" or not reply:
            return
        if not message.get("dry_run"):
            self.history.record(message.get("user"), reply)
        log.info("horus: decision user=%s class=%s action=%s nodes=%s tres=%s slowdown=%s in %.2f ms: %s",
                 message.get("user"), reply.get("class"), reply.get("action"), ",".join(reply.get("nodes") or ()),
                 reply.get("tres"), reply.get("slowdown"), self._decision_ms, reply.get("reason"))

    # ---- offers -------------------------------------------------------------------------------
    def publish_offers(self):
        """Write the next placement per job class where job_submit.lua reads it (offers.py).

        The Lua takes at most one offer per version, so two jobs never get the same offer. Offers
        computed on a state that changed meanwhile are not written: that change has asked for new
        ones, and the Lua's rules (docs/horusd.md) keep it from the older ones.
        """
        placer = self.placer
        if self.config.offers:
            offers, generation, last_claim, joint = placer.compute_offers()
        else:
            offers, generation, last_claim, joint = {}, placer.generation, "", 0
        with self.offers_file.lock:
            if generation != placer.generation:
                return False
            self.offers_file.write({job_class: reply.wire() for job_class, reply in offers.items()}, last_claim,
                                   joint)
        return True

    def state_changed(self):
        """The placer's state changed (a decision, a claim, a refresh): new offers a few ms later.
        A publish already computing on the old state will not write (see publish_offers)."""
        self.offers_changed.set()

    def _offers_loop(self):
        while not self.stopping.is_set():
            self.offers_changed.wait(1.0)
            if self.stopping.is_set():
                return
            if not self.active:
                self.offers_changed.clear()
                continue
            # the submission that caused this is still in slurmctld and sbatch: let it finish
            # before taking the CPU (this VM has two), and fold a burst into one recomputation
            time.sleep(OFFER_DELAY_S)
            self.placer.apply_claims()  # before clearing: recording them signals a change again
            self.offers_changed.clear()
            try:
                self.publish_offers()
            except Exception as exc:  # offers are an optimisation: the socket path still works
                log.warning("horus: could not publish offers to %s: %s", self.offers_file.path, exc)

    # ---- state ----------------------------------------------------------------------------------
    def job_ended(self, job_ids):
        """EpilogSlurmctld said jobs ended (``job_submit_lua/horus_epilog.lua``): their GPUs are free
        in horusd's state now, the cycle moves kept jobs onto them before the answer (the epilog waits
        for it, so slurmctld starts them in its pass at those jobs' completion), and the queue is read
        again soon."""
        self.ended_notices += max(len(job_ids), 1)
        released = self.placer.end_jobs(job_ids)
        self.wake.set()
        moved = self.run_cycle_once() if released else 0
        return {"ok": True, "moved": moved}

    def refresh_once(self):
        snapshot = self.reader.read()
        self.placer.load_snapshot(snapshot)
        self.cycle_wanted.set()  # jobs may have ended: the queue may move

    def _refresh_loop(self):
        last_cost, last_wall, started_at = 0.0, 0.0, 0.0
        while not self.stopping.is_set():
            # never spend more than ~5 % of the time refreshing: a huge queue makes squeue --json
            # slow, and slurmctld answers every submission more slowly while it serves us
            self.refresh_interval = refresh_interval(self.config.refresh_s, last_cost)
            if self.wake.wait(self.refresh_interval):  # early: fold a burst of wake-ups into one read
                time.sleep(max(0.0, started_at + max(MIN_REFRESH_GAP_S, 2 * last_wall) - time.monotonic()))
            self.wake.clear()
            if self.stopping.is_set():
                return
            if not self.active:  # standby: the active horusd reads the state; ours is rebuilt at takeover
                continue
            started, started_at = _cpu_seconds(), time.monotonic()
            try:
                self.refresh_once()
                self._rebuilt()
                last_cost = _cpu_seconds() - started
                # the gap between early refreshes: wall time, but bounded like the interval (a refresh
                # that waited on a restarting slurmctld must not space the next ones out for long)
                last_wall = min(time.monotonic() - started_at, MAX_REFRESH_INTERVAL_S / 20)
                self.refresh_errors = 0
            except Exception as exc:  # Slurm slow or down: keep the old state, it ages out
                self.refresh_errors += 1
                if self.refresh_errors in (1, 10) or self.refresh_errors % 100 == 0:
                    log.warning("horus: refresh failed (%d in a row): %s", self.refresh_errors, exc)

    # ---- the queue ------------------------------------------------------------------------------
    def run_cycle_once(self):
        """One pass: the kill switch, or the scheduling cycle and its moves (only the active horusd).
        Returns how many kept jobs it moved."""
        with self._cycle_lock:
            return self._run_cycle()

    def _run_cycle(self):
        placer = self.placer
        if not self.active:
            return 0
        if os.path.exists(self.config.disable_file):
            # switched off: Slurm starts every kept job on its own, now (no waiting for the lease)
            kept = [job_id for job_id in placer.kept_job_ids() if job_id not in self.released_by_switch]
            if kept:
                self.mover.release(kept)
                self.released_by_switch.update(kept)
                if self._moved_during_renewal is not None:  # a renewal under way must not hold them back
                    self._moved_during_renewal.update(kept)
                log.warning("horus: kill switch %s: %d kept jobs left to Slurm", self.config.disable_file, len(kept))
            return 0
        self.released_by_switch.clear()
        unshaped = placer.take_unshaped()
        if unshaped:
            log.warning("horus: kept jobs %s ask for no GPU (a move cut short): their shard back", ",".join(unshaped))
            self.mover.restore([(job_id, f"{self.placer.gres_prefix}shard:1") for job_id in unshaped])
        moves = placer.cycle()
        if moves:
            log.info("horus: cycle placed %d kept jobs: %s", len(moves),
                     " ".join(f"{m.kept.job_id}->{m.reply.gpulist}" for m in moves))
            refused = set(self.mover.start(moves, hold_s=placer.lease_s))
            for decision_id in refused:
                placer.forget(decision_id)
            for move in moves:
                if move.reply.id not in refused:
                    self.history.record(move.kept.request.user, move.reply.wire())
                    if self._moved_during_renewal is not None:
                        self._moved_during_renewal.add(move.kept.job_id)
            self.wake.set()  # read the queue again soon: the moves show there
            return len(moves) - len(refused)
        return 0

    def renew_leases(self):
        """Push every kept job's begin time a lease ahead (not while the kill switch is on).

        The renewal is one scontrol, seconds for thousands of jobs, and the cycle goes on meanwhile: a
        job it moves after the kept list was read may get its renewal after its move's
        ``StartTime=now``, and would wait out a whole lease where it was placed. So the jobs moved
        during the renewal are started again (``StartTime=now``) once it is done, between cycles
        (never between a move's two updates)."""
        if not self.active:
            return
        with self._cycle_lock:  # no cycle half-way: a job is either still kept or moved for good
            kept = self.placer.kept_job_ids()
            self._moved_during_renewal = set()
        try:
            if kept and not os.path.exists(self.config.disable_file):
                self.mover.renew(kept, self.placer.lease_s)
        finally:
            with self._cycle_lock:
                moved, self._moved_during_renewal = self._moved_during_renewal, None
                late = sorted(moved & set(kept))
                if late:
                    log.info("horus: kept jobs %s were moved while their lease was renewed: started again",
                             ",".join(late))
                    self.mover.release(late)

    def _lease_loop(self):
        # at start (a restarted horusd takes its queue back), then every lease_s / 2: renewing
        # MAX_KEPT jobs takes a few seconds, well inside the other half
        while not self.stopping.is_set():
            try:
                self.renew_leases()
            except Exception:  # a lease not renewed runs out: Slurm starts the job, nothing is lost
                log.exception("horus: lease renewal failed")
            self.stopping.wait(self.placer.lease_s / 2)

    def _cycle_loop(self):
        while not self.stopping.is_set():
            self.cycle_wanted.wait(self.config.cycle_s)
            self.cycle_wanted.clear()
            if self.stopping.is_set():
                return
            try:
                self.run_cycle_once()
            except Exception:  # the queue must not stop: a kept job's lease runs out on its own anyway
                log.exception("horus: scheduling cycle failed")

    def reload_soon(self, why, read_durations=True):
        """Reload in a thread of its own (SIGHUP, a refit, the feed); a reload that fails (a site file
        being edited, say) is one warning line, and the running config and policy stay."""
        def run():
            try:
                self.reload(read_durations)
            except Exception as exc:
                log.warning("horus: reload after %s failed, the running config and policy stay: %s", why, exc)

        threading.Thread(target=run, name="horusd-reload", daemon=True).start()

    def reload(self, read_durations=True):
        """Re-read the site file and model (and the run times, unless ``read_durations`` is false);
        swap them in without dropping requests. One at a time."""
        with self._reload_lock:
            self._reload(read_durations)

    def _reload(self, read_durations=True):
        config = load_config()
        placer = build_placer(config, self.predictor_factory, self.history)
        self.history.duration_settings = duration_settings(config)  # (the duration settings may have changed)
        self.history.learn_pairs_at_feed = config.learn_pairs
        if read_durations:  # the run times ingested since
            self.durations = self.history.duration_estimator() or self.durations
        if self.durations is not None:
            placer.set_durations(self.durations)
        old = self.placer
        self._wire(placer)
        with old.lock:
            old._apply_claims()
            placer.policy.carry_over(old.policy)  # what it learned while it ran (horus-risk's budget spent)
            placer.offers.carry_over(old.offers)
            placer.ledger.entries = dict(old.ledger.entries)
            placer.unseen_keeps = dict(old.unseen_keeps)
        self.config = config
        try:
            snapshot = self.reader.read()
            placer.load_snapshot(snapshot)
        except Exception as exc:
            log.warning("horus: reload kept the old state: %s", exc)
            placer.state, placer.snapshot_time = old.state, old.snapshot_time
        self.placer = placer
        self.reloads += 1
        log.info("horus: reloaded config (policy=%s binding=%s)", config.policy, config.binding)

    # ---- failover -------------------------------------------------------------------------------
    def check_controller(self):
        """Is the slurmctld this horusd serves the one in control? Switches to active or standby."""
        try:
            controllers = self.controllers()
        except Exception as exc:  # Slurm's CLI unusable: keep the current role
            log.warning("horus: cannot ask which controller is in control (%s)", exc)
            return self.active
        if len(controllers) < 2 or self.controller_host not in {c.host for c in controllers}:
            self.in_control, active = None, True  # no backup controller (or not beside one): always answer
        else:
            self.in_control = active_controller(controllers)
            active = self.in_control == self.controller_host
        if active != self.active:
            self._switch(active)
        return active

    def _switch(self, active):
        if active:
            placer = self.placer
            with placer.lock:
                # decisions of the other horusd are in squeue by now, and so are the jobs it kept
                placer.ledger.entries.clear()
                placer.unseen_keeps.clear()
                placer.snapshot_time = 0.0  # "stale" until rebuilt: nothing is placed on the old view
            self.active = True
            self._rebuilding = True
            try:
                self.refresh_once()
                self._rebuilt()
            except Exception as exc:  # the new controller may still be taking over: the refresher retries
                log.warning("horus: slurmctld on %s is in control, but squeue failed (%s): answering "
                            "'unchanged' until it answers", self.controller_host, exc)
                self.wake.set()
        else:
            self.active = False
            log.info("horus: standby: slurmctld on %s is not in control (%s is); leaving jobs to Slurm",
                     self.controller_host, self.in_control or "none")
            with self.offers_file.lock:
                try:
                    self.offers_file.write({})  # a header only: no offer may be taken here
                except OSError:
                    pass

    def _rebuilt(self):
        if self._rebuilding:
            self._rebuilding = False
            log.info("horus: slurmctld on %s is in control: answering; state rebuilt from squeue (%d jobs, "
                     "%d kept)", self.controller_host, len(self.placer.state.jobs) if self.placer.state else 0,
                     len(self.placer.kept))

    def _controller_loop(self):
        while not self.stopping.wait(CONTROLLER_CHECK_S):
            self.check_controller()

    # ---- lifecycle ------------------------------------------------------------------------------
    def _die(self, reason):
        """A vital thread died: stop, and make serve_forever exit non-zero."""
        self.fatal = self.fatal or reason
        self.stopping.set()

    def vital_threads_alive(self):
        return self.frontend.alive() and self.history.alive() and all(t.is_alive() for t in self._threads)

    def start(self):
        raise_fd_limit()
        self.check_controller()
        self.history.load_durations()  # before the first cycle: a restarted horusd knows its run times
        try:
            if self.active:
                self.refresh_once()
        except Exception as exc:
            log.warning("horus: first refresh failed, answering 'unchanged' until Slurm answers: %s", exc)
        self.history.start(on_death=self._die)
        self.frontend.start()
        self._refresher = run_in_background(self._refresh_loop, "horusd-refresh", on_death=self._die)
        self._threads = [self._refresher, run_in_background(self._offers_loop, "horusd-offers", on_death=self._die),
                         run_in_background(self._cycle_loop, "horusd-cycle", on_death=self._die),
                         run_in_background(self._lease_loop, "horusd-lease", on_death=self._die),
                         run_in_background(self._controller_loop, "horusd-controller", on_death=self._die)]
        log.info("horus: horusd listening on %s (policy=%s binding=%s)", self.config.socket, self.config.policy,
                 self.config.binding)

    def stop(self):
        self.stopping.set()
        self.wake.set()
        self.offers_changed.set()
        self.cycle_wanted.set()
        self.offers_file.remove()
        self.history.stop()
        self.frontend.stop()

    def run_until_stopped(self):
        """Wait for a stop (signal) or a dead vital thread; then stop. Raises HorusError in the latter
        case, so that ``horus serve`` exits non-zero and systemd (Restart=on-failure) restarts it."""
        try:
            while not self.stopping.wait(1.0):
                if not self.vital_threads_alive():
                    self.fatal = self.fatal or "a vital thread is gone"
                    break
        finally:
            self.stop()
        if self.fatal:
            log.critical("horus: horusd exits: %s", self.fatal)
            raise HorusError(f"horusd stopped: {self.fatal}", exit_code=70)

    def serve_forever(self):
        self.start()
        signal.signal(signal.SIGHUP, lambda *_: self.reload_soon("SIGHUP"))
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.run_until_stopped()
