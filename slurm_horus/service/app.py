"""``horus serve``: wire the site config, the Slurm reader, the placement core and the sockets.

Lifecycle: read config → build the interference model and the policy → first refresh from Slurm →
listen. A background thread refreshes the cluster state every ``refresh_s``; SIGHUP (or a
``{"op": "reload"}`` on the controller socket) re-reads the site file and the fitted model and swaps
them in between two requests, so no request is dropped. SIGTERM/SIGINT stop cleanly.
"""

import logging
import os
import resource
import signal
import threading
import time

from ..config import load_config
from ..errors import HorusError
from ..placement.policies import PolicyModels, make_policy
from ..slurm.parse import parse_sinfo, parse_squeue
from ..slurm.runner import run_slurm
from .daemon import Placer, Snapshot, unchanged
from .history import History
from .lua_twin import encode_kv_reply, offers_header
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

_KNOWN_GPU_TYPES = ("a100", "a10", "a30", "a40", "h100", "h200", "k80", "l4", "l40", "p100", "rtx3090", "t4",
                    "v100")


def _offers_version_in(path):
    """The version of an offers file left by an earlier horusd (0 if none or unreadable)."""
    try:
        with open(path) as existing:
            version, _claimed, _generated = offers_header(existing.readline().rstrip("\n"))
    except OSError:
        return 0
    return int(version or 0)


class SlurmReader:
    """Reads the cluster from ``sinfo --json`` and ``squeue --json`` (22.05 has no scontrol --json).

    Jobs come and go every few seconds, nodes rarely: ``sinfo`` is re-read only every
    ``nodes_every`` reads (and on the first), which halves what a refresh costs slurmctld.
    """

    def __init__(self, slurm_conf=None, timeout_s=10.0, nodes_every=5):
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s
        self.nodes_every = nodes_every
        self._reads = 0
        self._nodes = None

    def read(self):
        taken_at = time.time()
        if self._nodes is None or self._reads % self.nodes_every == 0:
            self._nodes = parse_sinfo(run_slurm(["sinfo", "--json"], slurm_conf=self.slurm_conf,
                                                timeout=self.timeout_s).stdout)
        self._reads += 1
        nodes = self._nodes
        jobs = parse_squeue(run_slurm(["squeue", "--json"], slurm_conf=self.slurm_conf, timeout=self.timeout_s).stdout)
        features = {}
        for node in nodes:
            for feature in getattr(node, "features", ()) or ():
                if feature.lower() in _KNOWN_GPU_TYPES:
                    features[node.name] = feature.lower()
        return Snapshot(nodes=nodes, jobs=jobs, taken_at=taken_at, features=features)


def build_placer(config, predictor_factory=None, history=None):
    """A Placer for the site config. Models: the newest one stored in the history database when it
    is of the kind a policy asks for (a refit learned the site's own pairs), else the built-in priors."""
    from ..interference import build_model, gpu_memory_mb

    cache = {}

    def factory(kind):
        if predictor_factory is not None:
            return predictor_factory(kind)
        if kind not in cache:
            cache[kind] = (history.active_model(kind) if history is not None else None) or build_model(kind)
        return cache[kind]

    placer_classes = None
    placer = Placer(None, binding=config.binding, gpu_type=config.gpu_type, gpu_memory_mb=gpu_memory_mb,
                    max_jobs_per_gpu=config.max_jobs_per_gpu, share_unknown=config.share_unknown,
                    slowdown_limit=config.slowdown_limit)
    placer_classes = placer.classes
    models = PolicyModels(placer_classes, factory)
    try:
        placer.policy = make_policy(config.policy, models)
    except ValueError as exc:
        raise HorusError(f"policy: {exc}") from None
    return placer


class Horusd:
    def __init__(self, config, reader=None, predictor_factory=None):
        self.config = config
        self.reader = reader or SlurmReader()
        self.predictor_factory = predictor_factory
        self.history = History(config.db, refit_s=config.refit_s, gpu_type=config.gpu_type,
                               on_refit=lambda: threading.Thread(target=self.reload, daemon=True).start())
        self.placer = build_placer(config, predictor_factory, self.history)
        self.frontend = Frontend(self.decide, config.socket, tcp=config.tcp or None, after_reply=self.after_reply)
        self._decision_ms = 0.0
        self.stopping = threading.Event()
        self.wake = threading.Event()  # set: refresh now instead of at the next tick
        self.placer.on_left_to_slurm = self.wake.set
        self.offers_changed = threading.Event()
        self.placer.on_change = self.state_changed
        self.placer.on_claimed = self.claimed
        self.offers_path = config.socket + ".offers"
        # versions only grow, across restarts too: job_submit.lua takes one offer per version, and
        # a horusd that restarts must not reuse a version a slurmctld has already taken from
        self.offers_version = max(int(time.time() * 1000), _offers_version_in(self.offers_path))
        self.offers_live = False  # the offers file holds offers (not only a header)
        self._offers_file = threading.Lock()
        self.refresh_errors = 0
        self.refresh_interval = config.refresh_s
        self._refresher = None
        self._threads = []  # vital background threads: if one dies, horusd exits (its supervisor restarts it)
        self.fatal = None  # why horusd must exit
        self._reload_lock = threading.Lock()  # SIGHUP, a refit and the controller socket may all ask at once
        self.frontend.on_fatal = self._die

    # ---- requests -------------------------------------------------------------------------------
    def decide(self, message):
        op = message.get("op")
        if op == "ping":
            return {"ok": True, "state_age_s": round(self.placer.state_age(), 3),
                    "decisions": self.placer.decisions, "ledger": len(self.placer.ledger),
                    "refresh_interval_s": round(self.refresh_interval, 3), "policy": self.config.policy,
                    "pid": os.getpid()}
        if op == "reload":
            self.reload()
            return {"ok": True, "reloaded": True}
        if op == "confirm":
            return self.placer.confirm(message)
        if op == "claim":
            self.placer.claim(message)
            return None  # a notification: nothing is sent back
        if op != "place":
            return {"ok": False, "error": f"unknown op {op!r}"}
        placer = self.placer  # one consistent placer per request, even during a reload
        if placer.state_age() > max(30.0, 10 * self.config.refresh_s, 3 * self.refresh_interval):
            return unchanged("cluster state is stale")
        started = time.perf_counter()
        reply = placer.place(message)
        self._decision_ms = (time.perf_counter() - started) * 1000
        if self.config.offers and not message.get("dry_run"):
            self._spend_offers(message, reply)
        return reply

    def claimed(self, message, offer):
        """A claim was recorded (by whichever thread read the state next): history row and log line."""
        self.history.record({"op": "place", "user": message.get("user")}, offer)
        log.info("horus: decision user=%s class=%s action=claim nodes=%s tres=%s slowdown=%s: offer %s taken",
                 message.get("user"), offer.get("class"), ",".join(offer.get("nodes") or ()), offer.get("tres"),
                 offer.get("slowdown"), offer.get("id"))

    def _spend_offers(self, message, reply):
        """Offers published before this decision do not know it: none may be taken after its reply.

        job_submit.lua runs one submission at a time and learns from the reply which offers version
        is spent (``offers_version``), which costs nothing here. Any other client (horus-sbatch) is
        followed by submissions that never saw its reply: for those the offers are withdrawn now.
        Read under the file lock: a publish in progress (computed before this decision) is spent too.
        """
        if message.get("reply") == "kv":
            with self._offers_file:
                reply["offers_version"] = self.offers_version
        elif reply.get("action") == "place":
            with self._offers_file:
                if self.offers_live:
                    self._write_offers({})

    def after_reply(self, message, reply):
        """Called by the front once the reply is sent: the log line and the history row wait until
        then, so that job_submit.lua (and slurmctld's job lock) do not wait for them."""
        if message.get("op") != "place":
            return
        self.history.record(message, reply)
        log.info("horus: decision user=%s class=%s action=%s nodes=%s tres=%s slowdown=%s in %.2f ms: %s",
                 message.get("user"), reply.get("class"), reply.get("action"), ",".join(reply.get("nodes") or ()),
                 reply.get("tres"), reply.get("slowdown"), self._decision_ms, reply.get("reason"))

    # ---- offers -------------------------------------------------------------------------------
    def publish_offers(self):
        """Write the next placement per job class where job_submit.lua reads it (atomically).

        Line 1: ``version=N;claimed=ID;generated=EPOCH`` (ID: the last claim the offers know of);
        then ``CLASS<TAB>key=value;...`` (the reply format).
        The Lua takes at most one offer per version, so two jobs never get the same offer. Offers
        computed on a state that changed meanwhile are not written: that change has asked for new
        ones, and the Lua's rules (docs/horusd.md) keep it from the older ones.
        """
        placer = self.placer
        if self.config.offers:
            offers, generation, last_claim = placer.compute_offers()
        else:
            offers, generation, last_claim = {}, placer.generation, ""
        with self._offers_file:
            if generation != placer.generation:
                return False
            self._write_offers(offers, last_claim)
        return True

    def state_changed(self):
        """The placer's state changed (a decision, a claim, a refresh): new offers a few ms later.
        A publish already computing on the old state will not write (see publish_offers)."""
        self.offers_changed.set()

    def _write_offers(self, offers, last_claim=""):
        """Caller holds ``_offers_file``."""
        self.offers_version += 1
        lines = [f"version={self.offers_version};claimed={last_claim};generated={time.time():.3f}"]
        lines += [f"{job_class}\t{encode_kv_reply(reply)}" for job_class, reply in sorted(offers.items())]
        tmp = f"{self.offers_path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # slurmctld's user reads it, whatever our umask
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)
        # unlink, then rename: renaming over an existing file makes ext4 flush the new one first
        # (auto_da_alloc), 4x the cost. Meanwhile a reader finds no file, i.e. no offer: it asks.
        try:
            os.unlink(self.offers_path)
        except FileNotFoundError:
            pass
        os.rename(tmp, self.offers_path)
        self.offers_live = bool(offers)

    def _offers_loop(self):
        while not self.stopping.is_set():
            self.offers_changed.wait(1.0)
            if self.stopping.is_set():
                return
            # the submission that caused this is still in slurmctld and sbatch: let it finish
            # before taking the CPU (this VM has two), and fold a burst into one recomputation
            time.sleep(OFFER_DELAY_S)
            self.placer.apply_claims()  # before clearing: recording them signals a change again
            self.offers_changed.clear()
            try:
                self.publish_offers()
            except Exception as exc:  # offers are an optimisation: the socket path still works
                log.warning("horus: could not publish offers to %s: %s", self.offers_path, exc)

    # ---- state ----------------------------------------------------------------------------------
    def refresh_once(self):
        snapshot = self.reader.read()
        self.placer.load_snapshot(snapshot)

    def _refresh_loop(self):
        last_cost = 0.0
        while not self.stopping.is_set():
            # never spend more than ~5 % of the time refreshing: a huge queue makes squeue --json
            # slow, and slurmctld answers every submission more slowly while it serves us
            self.refresh_interval = refresh_interval(self.config.refresh_s, last_cost)
            self.wake.wait(self.refresh_interval)
            self.wake.clear()
            if self.stopping.is_set():
                return
            started = _cpu_seconds()
            try:
                self.refresh_once()
                last_cost = _cpu_seconds() - started
                self.refresh_errors = 0
            except Exception as exc:  # Slurm slow or down: keep the old state, it ages out
                self.refresh_errors += 1
                if self.refresh_errors in (1, 10) or self.refresh_errors % 100 == 0:
                    log.warning("horus: refresh failed (%d in a row): %s", self.refresh_errors, exc)

    def reload(self):
        """Re-read the site file and model; swap them in without dropping requests. One at a time."""
        with self._reload_lock:
            self._reload()

    def _reload(self):
        config = load_config()
        placer = build_placer(config, self.predictor_factory, self.history)
        old = self.placer
        placer.on_left_to_slurm = self.wake.set
        placer.on_change = self.state_changed
        placer.on_claimed = self.claimed
        with old.lock:
            old._apply_claims()
            placer.requested_classes = old.requested_classes.copy()
            placer.offered = old.offered.copy()  # a claim may arrive for an offer made before the reload
            placer.claims = old.claims  # one queue: a claim sent to the old placer meanwhile is not lost
            placer.last_claim = old.last_claim
            placer.ledger = dict(old.ledger)
        self.config = config
        try:
            snapshot = self.reader.read()
            placer.load_snapshot(snapshot)
        except Exception as exc:
            log.warning("horus: reload kept the old state: %s", exc)
            placer.state, placer.snapshot_time = old.state, old.snapshot_time
        self.placer = placer
        log.info("horus: reloaded config (policy=%s binding=%s)", config.policy, config.binding)

    # ---- lifecycle ------------------------------------------------------------------------------
    def _die(self, reason):
        """A vital thread died: stop, and make serve_forever exit non-zero."""
        self.fatal = self.fatal or reason
        self.stopping.set()

    def vital_threads_alive(self):
        return self.frontend.alive() and self.history.alive() and all(t.is_alive() for t in self._threads)

    def start(self):
        raise_fd_limit()
        try:
            self.refresh_once()
        except Exception as exc:
            log.warning("horus: first refresh failed, answering 'unchanged' until Slurm answers: %s", exc)
        self.history.start(on_death=self._die)
        self.frontend.start()
        self._refresher = run_in_background(self._refresh_loop, "horusd-refresh", on_death=self._die)
        self._threads = [self._refresher, run_in_background(self._offers_loop, "horusd-offers", on_death=self._die)]
        log.info("horus: horusd listening on %s (policy=%s binding=%s)", self.config.socket, self.config.policy,
                 self.config.binding)

    def stop(self):
        self.stopping.set()
        self.wake.set()
        self.offers_changed.set()
        try:
            os.unlink(self.offers_path)
        except OSError:
            pass
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
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload, daemon=True).start())
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.run_until_stopped()
