"""horusd's link to the history database: record decisions, load the model in force, refit on a timer,
feed the duration estimator (the run times of the finished jobs ``horus ingest`` stored) and, at the
same 5-minute feed, learn the pairs measured since (the policy is rebuilt with them).

Nothing here runs on the decision path: decisions are queued and written by one background thread
(SQLite connections stay in the thread that opened them), and a database that cannot be opened only
costs a warning — horusd goes on deciding with the built-in priors.

With a backup controller, horusd runs beside each slurmctld and only the one beside the controller in
control writes (``is_active``): the passive one records nothing, refits nothing and keeps the file
closed, so the history database has one writer.
"""

import logging
import os
import queue
import threading
import time

from ..placement.duration import FEED_EVERY_S
from .threads import run_in_background

log = logging.getLogger("horusd")

_STOP = object()
DURATIONS_RELOAD_S = FEED_EVERY_S  # how often the duration estimator is fed again (horus-ingest.timer: 5 min)
DURATION_JOBS = 20000  # the most recently ended GPU jobs it learns from (it keeps 10 per key)
PAIRS_WINDOW_S = 7 * 86400  # the feed derives the pairs measured by jobs that ran this recently (a refit: all)


class History:
    def __init__(self, db_path, refit_s=0.0, gpu_type="v100", on_refit=None, is_active=lambda: True,
                 on_durations=None, durations_s=DURATIONS_RELOAD_S, duration_settings=None, on_pairs=None,
                 learn_pairs=True):
        self.db_path = db_path
        self.is_active = is_active
        self.refit_s = refit_s
        self.gpu_type = gpu_type
        self.on_refit = on_refit  # called after a refit stored a new model (horusd reloads)
        self.on_durations = on_durations  # called with a freshly fed DurationEstimator
        self.durations_s = durations_s
        self.duration_settings = duration_settings  # the estimator's DurationSettings (None: defaults)
        self.on_pairs = on_pairs  # called when the pairs measured here changed (horusd rebuilds its policy)
        self.learn_pairs_at_feed = learn_pairs  # the site's learn_pairs: the feed derives pairs too
        self.told_pairs = None  # {(gpu type, class, co-runner class): norm_tput} the last local_pairs gave
        self.pending = queue.Queue(maxsize=10000)
        self.recorded = 0
        self.failed = False
        self._thread = None
        self._stopping = threading.Event()

    # ---- the model in force ---------------------------------------------------------------------
    def active_model(self, kind):
        """The newest stored model if it is of predictor ``kind``, else None (use the priors)."""
        try:
            from ..interference import model_from_dict
            from ..store.db import open_db
            from ..store.models import load_model

            stored = load_model(open_db(self.db_path))
        except Exception as exc:  # a broken or unreadable DB must not stop horusd
            log.warning("horus: cannot read models from %s (%s); using the built-in priors", self.db_path, exc)
            return None
        if stored is None or stored[1] != kind:
            return None
        model_id, name, created, state = stored
        log.info("horus: using stored model %s (%s, %s)", model_id, name, created)
        return model_from_dict(state)

    def local_pairs(self):
        """The pairs measured on this cluster (the screened observations a refit learns from, one per
        pair), or none when the store cannot be read: the policy is told them as the simulator tells
        its policy each measurement (``Policy.observe``), so that they count as measured (known) and
        not as predicted."""
        if not os.path.isfile(self.db_path):
            return []  # nothing ingested yet (and a reader creates no database)
        try:
            from ..learn.loop import local_observations
            from ..store.db import open_db

            db = open_db(self.db_path, create=False)
            try:
                found = local_observations(db)
            finally:
                db.conn.close()
        except Exception as exc:  # a broken or unreadable DB must not stop horusd
            log.warning("horus: cannot read measured pairs from %s (%s); none counts as measured", self.db_path, exc)
            return []
        self.told_pairs = _by_pair(found)
        return found

    def learn_pairs(self, db, now=None):
        """The feed's part for pairs (every ``durations_s``, 5 min): derive the pairs measured by the jobs
        that ran within ``PAIRS_WINDOW_S`` (the model refit derives from the whole history), screen
        them as a refit does, and when the pairs measured here are not those the policy was told, say
        so (``on_pairs``: horusd rebuilds its policy, which reads them). Returns whether they changed.
        A pair is then known minutes after its jobs were ingested instead of at the next refit; the
        simulator learns at this cadence too (``SimOptions.learn_pairs_every_s``)."""
        from ..learn.loop import derive_observations, local_observations

        now = time.time() if now is None else now
        try:
            derive_observations(db, self.gpu_type, since=now - PAIRS_WINDOW_S, now=now, replace=False)
            found = _by_pair(local_observations(db))
        except Exception as exc:
            log.warning("horus: could not derive measured pairs: %s", exc)
            return False
        if found == (self.told_pairs or {}):
            return False
        log.info("horus: %d pairs measured here (%d before): the policy is rebuilt", len(found),
                 len(self.told_pairs or {}))
        self.told_pairs = found
        if self.on_pairs is not None:
            self.on_pairs()
        return True

    # ---- durations ------------------------------------------------------------------------------
    def duration_estimator(self, db=None):
        """A DurationEstimator fed with the store's finished GPU jobs, or None when the store cannot
        be read (horusd goes on with what it had: time limits only, at worst)."""
        try:
            from ..placement.duration import estimator_from_records
            from ..store.db import open_db
            from ..store.queries import finished_gpu_jobs

            rows = finished_gpu_jobs(db if db is not None else open_db(self.db_path), DURATION_JOBS)
        except Exception as exc:
            log.warning("horus: cannot read run times from %s (%s); durations from time limits", self.db_path, exc)
            return None
        return estimator_from_records(rows, self.duration_settings)

    def load_durations(self, db=None):
        """Feed the estimator afresh and hand it over (``on_durations``)."""
        estimator = self.duration_estimator(db)
        if estimator is not None and self.on_durations is not None:
            self.on_durations(estimator)
        return estimator

    # ---- decisions ------------------------------------------------------------------------------
    def record(self, user, reply):
        """Queue the decision ``reply`` (its wire dict) made for ``user`` (dry runs are not recorded);
        a passive horusd (beside a standby controller) records nothing."""
        if self.failed or reply.get("action") != "place" or not self.is_active():
            return
        try:
            self.pending.put_nowait((user, reply))
        except queue.Full:
            pass  # the writer is far behind: losing a history row is better than blocking a decision

    def _write(self, db, user, reply):
        from ..store.decisions import record_decision

        record_decision(
            db, reply["id"], job_class=reply.get("class"), user=user, policy=reply.get("policy"),
            mode=reply.get("mode"), nodes=reply.get("nodes") or (), gpus=reply.get("gpus"),
            predicted_slowdown=reply.get("slowdown"), corunners=reply.get("corunner_slowdowns"),
            detail={"binding": reply.get("binding"), "tres": reply.get("tres"), "reason": reply.get("reason")})
        self.recorded += 1

    def _run(self):
        from ..store.db import open_db

        db = None
        next_refit = next_durations = None
        while not self._stopping.is_set():
            if not self.is_active():
                if db is not None:  # passive now: the other horusd writes
                    db.conn.close()
                    db = None
                self._drop_queued()
                self._stopping.wait(1.0)
                continue
            if db is None:
                try:
                    db = open_db(self.db_path)
                except Exception as exc:
                    log.warning("horus: history database %s unusable (%s): decisions are not recorded",
                                self.db_path, exc)
                    self.failed = True
                    return
                next_refit = time.monotonic() + self.refit_s if self.refit_s > 0 else None
                next_durations = time.monotonic() + self.durations_s if self.durations_s > 0 else None
            try:
                item = self.pending.get(timeout=1.0)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if item is not None:
                try:
                    self._write(db, *item)
                except Exception as exc:
                    log.warning("horus: could not record decision %s: %s", item[1].get("id"), exc)
            if next_refit is not None and time.monotonic() >= next_refit:
                next_refit = time.monotonic() + self.refit_s
                self._refit(db)
            if next_durations is not None and time.monotonic() >= next_durations:
                next_durations = time.monotonic() + self.durations_s
                self.load_durations(db)
                if self.learn_pairs_at_feed:
                    self.learn_pairs(db)
        if db is not None:
            db.conn.close()

    def _drop_queued(self):
        try:
            while self.pending.get_nowait() is not _STOP:
                pass
            self._stopping.set()
        except queue.Empty:
            pass

    def _refit(self, db):
        try:
            from ..learn.loop import refit

            result = refit(db, default_gpu_type=self.gpu_type)
        except Exception as exc:
            log.warning("horus: refit failed: %s", exc)
            return
        log.info("horus: refit stored model %s from %s local observations", result.get("model_id"),
                 result.get("n_observations"))
        if self.on_refit is not None:
            self.on_refit()

    def start(self, on_death=None):
        self._thread = run_in_background(self._run, "horusd-history", on_death=on_death)

    def alive(self):
        """The writer runs, or ended on purpose (stopped, or no usable database)."""
        return self._thread is None or self._thread.is_alive() or self.failed or self._stopping.is_set()

    def stop(self, timeout=5.0):
        self._stopping.set()
        try:
            self.pending.put_nowait(_STOP)
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(timeout)


def _by_pair(observations):
    return {(o.gpu_type, o.job_class, o.corunner_class): o.norm_tput for o in observations}
