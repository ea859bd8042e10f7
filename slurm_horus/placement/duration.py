"""Duration estimates: how long a job will run, from what a live site knows, with their own spread.

One estimator for horusd and the simulator. A live site knows a job's time limit (if the user or
the partition gave one) and the run times of the jobs that finished before (sacct, ingested into
the history store); the simulator feeds the estimator the same way, from the jobs that finished
earlier in the run. Neither ever sees the job's own run time before it ends.

**The rule** (:meth:`DurationEstimator.estimate`):

1. History: the run times of finished jobs, kept per key, the last ``recent`` (10) of each. The
   first key with at least ``min_runs`` (1) run is used, most specific first: the same **user and
   class**, then the **class** (any user), then the **user** (any class), then the **site** (every
   finished job).
2. Estimate: the **median** of those recent runs (robust to the heavy tail and to a few crashed or
   killed runs; recent, so it follows a user's drift).
3. **Capped by the time limit**: Slurm kills a job at its limit, so it never runs longer.
4. No key has enough runs (a cold site): the **time limit** when the job has one, else
   ``default_duration`` (3,600 s; a setting: a site would use its partitions' ``DefaultTime``).

**The spread** (for decisions under uncertainty): run times are close to log-normal, so the spread is
``log_sigma``, a robust standard deviation of the log run times of the same sample (1.4826 × their
median absolute deviation), shrunk toward ``prior_log_sigma`` (1.5, wide) when the sample is small
(weight ``prior_runs`` = 2 runs), times ``spread_scale`` (1.7: the next run of a key strays further
than its past runs do; calibrated so that 80 % of run times fall in [low, high]); a fallback (limit
or default) carries ``prior_log_sigma``. ``low`` and ``high`` are the 10th and 90th percentiles of
that log-normal, both capped by the limit.

**Which key knows** (``adaptive``, the default since issue 13; ``--duration-levels fixed`` turns it off):
the order of step 1 is measured, not fixed. Each finished job is first estimated by every level that
has runs for it, as if it were still waiting, and per level the estimator keeps the correlation of
the logs of those estimates with the logs of the run times (:meth:`DurationEstimator.level_scores`).
Once two levels each estimated ``min_scored`` (20) finished jobs, they are tried in the order of
that correlation, best first, each in one of the places those levels hold in ``levels``. A key that
says nothing about run times (the simulator draws a Philly job's class at random; a site whose
classes are coarse) then falls behind one that does (the user), where a fixed order would use it
whenever the more specific key had no run yet. Correlation, not the error size: a level whose
estimate never moves (the site's median) has a small error on a uniform history but tells no two
jobs apart, which is all SJF's order reads. The simulator's JSON shows the order a run ended with
(``estimator.order``), horusd's ``ping`` the one it uses (``duration_order``; the site setting
``duration_levels``, ``measured`` by default). Chosen as the default on issue 13's tuning family
(V100 × Philly 1-GPU, estimated durations, 3 loads × 3 seeds: every SJF-style policy's mean JCT lower,
``horus`` by 14 %; docs/placement.md). What it costs: once the user's level comes first, each end of
a user's job re-estimates every waiting job of that user (:class:`QueueEstimates`); a FIFO queue pays
that once per group (a shared estimate), an SJF queue re-keys each job once per feed.

**Recent by start** (``recent_by``; ``--duration-recent``, the site setting ``duration_recent``):
which runs of a key are "the last ``recent``". By default (``end``) those that ended last, in the order
they were observed. The runs that end last are biased toward long ones: a long run that ends now
started long ago, with short ones that ended since. Under an SJF queue that bias can lock a user out:
the user's short jobs run first, the runs that then end are the long ones started with them, the
user's estimate jumps to theirs, every waiting job of that user goes to the back of a saturated queue,
none of them ends, and nothing corrects the estimate until the queue drains. With ``start`` the window
holds the runs that started last (a run whose start is not known counts as the latest; the simulator
gives a run's end less its run time, horusd the store's ``start_time``): a long run that started
before every kept run leaves them as they are. Not the default: chosen against on issue 13's tuning
family (docs/placement.md, "Recent by start").

Settings (``recent``, ``min_runs``, the level order, ``spread_scale``, ``adaptive``) were chosen on
Gavel's ``traces_msr`` and the error is reported on Pollux's ``philly.csv``
(``bench/bench_durations.py``; figures in ``docs/placement.md``).

Pure: no SQLite, no Slurm. :func:`estimator_from_records` takes plain records (the history store's
``jobs`` rows as dicts) so that horusd can feed it from sacct-ingested history.
"""

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .request import SharedEstimate

Z90 = 1.2815515655446004  # standard normal quantile of 0.9
MAD_TO_SIGMA = 1.4826
LEVELS = ("user+class", "class", "user", "site")
RECENT_BY = ("end", "start")
# how often horusd feeds its estimator afresh from the history store (service/history.py; as often as
# horus-ingest.timer stores new run times); the simulator learns run times as late (sim/engine.py)
FEED_EVERY_S = 300.0
# sacct states whose elapsed time is how long the job held its GPUs; a job that never really ran
# (NODE_FAIL, BOOT_FAIL, REVOKED, DEADLINE) or was cut by someone else's job (PREEMPTED) is not
COUNTED_STATES = frozenset(["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY"])


@dataclass(frozen=True)
class DurationEstimate:
    """A job's expected run time alone on its GPUs (seconds) and how sure the estimate is."""

    seconds: float
    log_sigma: float  # spread of log(run time): ~68 % of jobs within ×/÷ exp(log_sigma)
    low: float  # 10th percentile
    high: float  # 90th percentile (never above the time limit)
    source: str  # "user+class", "class", "user", "site", "limit" or "default"
    runs: int  # finished runs it rests on (0 for limit/default)

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "log_sigma": round(self.log_sigma, 4),
                "low": round(self.low, 3), "high": round(self.high, 3), "source": self.source, "runs": self.runs}


@dataclass
class DurationSettings:
    recent: int = 10  # runs kept per key (the most recent)
    min_runs: int = 1  # a key is used once it has this many runs
    levels: Tuple[str, ...] = LEVELS  # keys tried in this order (a subset of LEVELS)
    default_duration: float = 3600.0  # no history, no time limit
    prior_log_sigma: float = 1.5  # spread of a fallback; small samples are shrunk toward it
    prior_runs: float = 2.0  # weight of the prior spread, in runs
    spread_scale: float = 1.7  # factor on the spread of a sample (calibration: 80 % inside [low, high])
    # True (default): levels tried in the order their estimates earned on the jobs that finished
    # (module docstring, "Which key knows"); False: always ``levels``' order
    adaptive: bool = True
    min_scored: int = 20  # a level is moved only once it and the one it passes each predicted this many
    # which runs are "the most recent": "end", those that ended last; "start", those that started last
    # (a run whose start is not known counts as the latest); module docstring, "Recent by start"
    recent_by: str = "end"

    def __post_init__(self):
        unknown = [lv for lv in self.levels if lv not in LEVELS]
        if unknown:
            raise ValueError(f"unknown duration levels {unknown} (known: {', '.join(LEVELS)})")
        if self.recent < 1 or self.min_runs < 1 or self.min_runs > self.recent:
            raise ValueError("duration settings: need 1 <= min_runs <= recent")
        if not self.default_duration > 0:
            raise ValueError("duration settings: default_duration must be positive")
        if self.min_scored < 1:
            raise ValueError("duration settings: min_scored must be at least 1")
        if self.recent_by not in RECENT_BY:
            raise ValueError(f"duration settings: recent_by must be one of {', '.join(RECENT_BY)}")

    def describe(self) -> str:
        last = "last" if self.recent_by == "end" else "last-started"
        return (f"median of the {last} {self.recent} runs of the first of {' > '.join(self.levels)} with "
                f">= {self.min_runs} runs"
                + (" (this order to start with, then the order in which each level's estimates followed "
                   "the run times)" if self.adaptive and len(self.levels) > 1 else "")
                + f", capped by the time limit; else the time limit; else {self.default_duration:g} s")


def _key(level: str, user: str, job_class: str):
    if level == "user+class":
        return ("uc", user, job_class) if user and job_class else None
    if level == "class":
        return ("c", job_class) if job_class else None
    if level == "user":
        return ("u", user) if user else None
    return ("s",)


class DurationEstimator:
    """Online duration estimates: :meth:`observe` finished jobs, :meth:`estimate` waiting ones."""

    def __init__(self, settings: Optional[DurationSettings] = None):
        self.settings = settings or DurationSettings()
        # key -> its most recent run times: in end order (a deque), or with ``recent_by`` "start" a
        # list of (start, observation number, run time) sorted by start
        self._runs: Dict[tuple, object] = {}
        self._by_start = self.settings.recent_by == "start"
        self._stats: Dict[tuple, Tuple[float, float, int]] = {}  # key -> (median, log_sigma, n)
        self.observed = 0
        self.order: Tuple[str, ...] = tuple(self.settings.levels)  # the levels, in the order they are tried
        self.reorders = 0  # times the order changed (a queue of estimates re-estimates everything then)
        # per level, over the finished jobs it estimated (x = log of its estimate, y = log run time):
        # [n, Σx, Σy, Σx², Σy², Σxy], what the correlation of its estimates with the run times needs
        self._scores: Dict[str, List[float]] = {level: [0, 0.0, 0.0, 0.0, 0.0, 0.0]
                                                for level in self.settings.levels}

    def observe(self, user: str, job_class: str, run_time: float, start: Optional[float] = None):
        """A job finished after running ``run_time`` seconds (sacct's Elapsed) from ``start`` (sacct's
        Start, epoch seconds; read only with ``recent_by`` "start", None: not known)."""
        if not (run_time > 0) or not math.isfinite(run_time):
            return
        if start is not None and not math.isfinite(start):
            start = None
        self.observed += 1
        recent = self.settings.recent
        adaptive = self.settings.adaptive
        log_run = math.log(run_time)
        for level in self.settings.levels:
            key = _key(level, user or "", job_class or "")
            if key is None:
                continue
            if adaptive:  # what this level would have said of the job, before it learns the job
                found = self._median_of(key)
                if found is not None:
                    x, score = math.log(found), self._scores[level]
                    score[0] += 1
                    score[1] += x
                    score[2] += log_run
                    score[3] += x * x
                    score[4] += log_run * log_run
                    score[5] += x * log_run
            runs = self._runs.get(key)
            if self._by_start:
                if runs is None:
                    runs = self._runs[key] = []
                at = start if start is not None else (runs[-1][0] if runs else -math.inf)
                entry = (at, self.observed, float(run_time))
                bisect.insort(runs, entry)
                if len(runs) > recent and runs.pop(0) is entry:
                    continue  # it started before every kept run: nothing changes
            else:
                if runs is None:
                    runs = self._runs[key] = deque(maxlen=recent)
                runs.append(float(run_time))
            self._stats.pop(key, None)
        if adaptive:
            self._reorder()

    def _reorder(self):
        """Put the levels that estimated enough finished jobs (``min_scored``) in the order of how well
        their estimates followed the run times (:meth:`level_scores`, best first), each in one of the
        places those levels hold in ``levels``; the others keep theirs."""
        levels, least = self.settings.levels, self.settings.min_scored
        scored = [lv for lv in levels if self._scores[lv][0] >= least]
        if len(scored) < 2:
            return
        corr = {lv: _correlation(self._scores[lv]) for lv in scored}
        ranked = iter(sorted(scored, key=lambda lv: (-corr[lv], levels.index(lv))))
        order = tuple(next(ranked) if lv in scored else lv for lv in levels)
        if order != self.order:
            self.order = order
            self.reorders += 1

    @property
    def order_text(self) -> str:
        """The levels in the order they are tried now, as shown (``user+class > class > user > site``)."""
        return " > ".join(self.order)

    def level_scores(self) -> Dict[str, object]:
        """Per level: the correlation of the logs of its estimates with the logs of the run times, over
        the finished jobs it estimated before each ended (None: fewer than two), and ``order``, the
        order the levels are tried in now."""
        out: Dict[str, object] = {lv: (round(_correlation(sc), 4) if sc[0] >= 2 else None)
                                  for lv, sc in self._scores.items()}
        out["order"] = self.order_text
        return out

    def _kept(self, key) -> Optional[List[float]]:
        """The key's kept run times, sorted; None below ``min_runs``."""
        runs = self._runs.get(key)
        if not runs or len(runs) < self.settings.min_runs:
            return None
        # a handful of values: plain Python is several times faster than numpy here
        return sorted([run for _start, _k, run in runs] if self._by_start else runs)

    def _median_of(self, key) -> Optional[float]:
        """:meth:`_sample`'s median alone (what scoring a level reads; the key learns a run right
        after, so its spread would be computed for nothing)."""
        stats = self._stats.get(key)
        if stats is not None:
            return stats[0]
        values = self._kept(key)
        return None if values is None else _sorted_median(values)

    def _sample(self, key) -> Optional[Tuple[float, float, int]]:
        stats = self._stats.get(key)
        if stats is None:
            values = self._kept(key)
            if values is None:
                return None
            n = len(values)
            median = _sorted_median(values)
            mad_sigma = MAD_TO_SIGMA * _median([abs(math.log(v / median)) for v in values]) if n > 1 else 0.0
            s = self.settings
            sigma = s.spread_scale * math.sqrt((n * mad_sigma ** 2 + s.prior_runs * s.prior_log_sigma ** 2)
                                               / (n + s.prior_runs))
            stats = self._stats[key] = (median, sigma, n)
        return stats

    def _lookup(self, user: str, job_class: str):
        """(level, (median, log_sigma, runs)) of the first history with enough runs, or None."""
        for level in self.order:
            key = _key(level, user or "", job_class or "")
            found = self._sample(key) if key is not None else None
            if found is not None:
                return level, found
        return None

    def estimate(self, user: str = "", job_class: str = "", time_limit: Optional[float] = None) -> DurationEstimate:
        """The estimate for a job of ``user`` and ``job_class`` with ``time_limit`` seconds (None: none)."""
        limit = float(time_limit) if time_limit is not None and time_limit > 0 else None
        found = self._lookup(user, job_class)
        if found is not None:
            level, (median, sigma, n) = found
            return _bounded(median, sigma, limit, level, n)
        if limit is not None:
            return _bounded(limit, self.settings.prior_log_sigma, limit, "limit", 0)
        return _bounded(self.settings.default_duration, self.settings.prior_log_sigma, None, "default", 0)

    def seconds(self, user: str = "", job_class: str = "", time_limit: Optional[float] = None) -> Tuple[float, str]:
        """``(estimate(...).seconds, estimate(...).source)`` without the spread (the hot path)."""
        seconds, source, _ = self.seconds_spread(user, job_class, time_limit)
        return seconds, source

    def seconds_spread(self, user: str = "", job_class: str = "",
                       time_limit: Optional[float] = None) -> Tuple[float, str, float]:
        """``(seconds, source, log_sigma)`` of :meth:`estimate` without its percentiles (the hot path)."""
        limit = float(time_limit) if time_limit is not None and time_limit > 0 else None
        found = self._lookup(user, job_class)
        if found is not None:
            median, sigma = found[1][0], found[1][1]
            return (min(median, limit) if limit is not None else median), found[0], sigma
        if limit is not None:
            return limit, "limit", self.settings.prior_log_sigma
        return self.settings.default_duration, "default", self.settings.prior_log_sigma

    def estimate_request(self, req) -> DurationEstimate:
        """The estimate for a :class:`JobRequest` (its user, class and time limit)."""
        return self.estimate(req.user, req.job_class, req.time_limit)

    def observe_records(self, records: Iterable[Mapping], gpu_only: bool = True) -> int:
        """Feed finished jobs given as plain records (the history store's ``jobs`` rows).

        Keys read: ``user``, ``job_class``, ``elapsed_s`` (run time), ``state`` (only
        :data:`COUNTED_STATES` count; a missing state counts), ``n_gpus`` and ``shards`` (with
        ``gpu_only``, rows with ``n_gpus`` == 0 and no shard are CPU jobs and skipped), ``end_time`` (records are taken in end order, so
        "recent" means recently finished). Returns how many were observed.
        """
        rows = [r for r in records if _counts(r, gpu_only)]
        rows.sort(key=lambda r: _end(r.get("end_time")))
        for r in rows:
            # (a missing or unreadable start is NaN: observe takes it as not known)
            self.observe(str(r.get("user") or ""), str(r.get("job_class") or ""), _number(r.get("elapsed_s")),
                         _number(r.get("start_time")))
        return len(rows)


class QueueEstimates:
    """Keeps the predicted durations of waiting jobs current as the estimator learns.

    A scheduler re-reads its queue on every refresh, so a job that waits sees its estimate improve
    while it waits (the first jobs of a burst are queued before anything has ended). This does the
    same without re-estimating the whole queue at every end: each waiting job is indexed by the
    history key its estimate came from and the more specific ones; a finished job changes only its
    own user+class, class, user and site keys, so only the jobs indexed there (and those still on a
    fallback) are estimated again. Jobs of one user, class and time limit always carry the same
    estimate, so they are indexed and estimated as one group (one estimate per group, not per job);
    a group whose estimate changes hands it to its waiting jobs through ``queue.retime_all`` (their queue
    position may depend on it), or, in a queue whose order and decisions read no duration
    (``queue.fixed_keys``), its jobs carry one :class:`~slurm_horus.placement.request.SharedEstimate`
    and a new estimate is one ``queue.retime_shared``. ``queue`` is a :class:`~slurm_horus.placement.cycle.PendingQueue`
    (``add``, ``requests``, ``retime_all``); jobs the queue no longer holds (they started) are dropped lazily.
    """

    FALLBACK = ("fallback",)

    def __init__(self, estimator: DurationEstimator, queue):
        self.estimator = estimator
        self.queue = queue
        # jobs of one (user, class, time limit) always share an estimate: they are estimated as one
        # group, and the history keys index groups, not jobs
        self._groups: Dict[tuple, set] = {}  # group -> ids of its jobs (some may have left the queue)
        self._seconds: Dict[tuple, float] = {}  # group -> the estimate all its waiting jobs carry
        self._sigma: Dict[tuple, float] = {}  # group -> the estimate's spread (log-σ) they carry
        self._by_key: Dict[tuple, set] = {}  # history key -> groups whose estimate it may change
        # a queue whose order reads no duration: a group's waiting jobs carry one SharedEstimate
        # (``_groups`` maps the group to it), so a new estimate costs one assignment, whatever the
        # number of jobs (a user's estimate moves every waiting job of that user)
        self._shared = bool(getattr(queue, "fixed_keys", False))

    def _index(self, group: tuple, source: str, only=None):
        """File the group under the key its estimate came from and every more specific one (a run
        there, even another user's, would change it); a fallback under FALLBACK (any run does).
        ``only``: the one key to file it under again (its estimate still comes from the same level)."""
        by_key = self._by_key
        if only is not None:
            by_key.setdefault(only, set()).add(group)
            return
        if source not in LEVELS:
            by_key.setdefault(self.FALLBACK, set()).add(group)
            return
        user, job_class = group[0], group[1]
        for level in self.estimator.order:
            key = _key(level, user, job_class)
            if key is not None:
                by_key.setdefault(key, set()).add(group)
            if level == source:
                return

    def add(self, req) -> float:
        """Estimate ``req`` now, set its ``predicted_duration`` and queue it; returns the estimate."""
        seconds, source, sigma = self.estimator.seconds_spread(req.user, req.job_class, req.time_limit)
        group = (req.user or "", req.job_class or "", req.time_limit)
        members = self._groups.get(group)
        # (a group's estimate never differs here: it is re-estimated whenever it may change)
        if self._shared:
            if members is None:
                members = self._groups[group] = SharedEstimate(seconds, sigma)
            elif members.seconds != seconds or members.sigma != sigma:
                self.queue.retime_shared(members, seconds, sigma)
            if req.job_id in self.queue:
                self.queue.remove(req.job_id)  # (it would hand back the estimate attached below)
            req.shared_estimate = members
        req.predicted_duration, req.duration_sigma = seconds, sigma  # before queueing: the queue keys on it
        self.queue.add(req)
        if not self._shared:
            if members is None:
                members = self._groups[group] = set()
            else:
                if self._sigma[group] != sigma:
                    self._respread(group, members, sigma)
                if self._seconds[group] != seconds:
                    self._retime(group, members, seconds)
            members.add(req.job_id)
            self._seconds[group] = seconds
            self._sigma[group] = sigma
        self._index(group, source)
        return seconds

    def _respread(self, group: tuple, members: set, sigma: float) -> None:
        """Give the group's waiting jobs the estimate's spread ``sigma`` (their queue place stays)."""
        for req in self.queue.requests(members):
            if req is not None:
                req.duration_sigma = sigma
        self._sigma[group] = sigma

    def _retime(self, group: tuple, members: set, seconds: float) -> int:
        """Give the group's waiting jobs the estimate ``seconds``; forget those that left the queue."""
        ids = sorted(members)  # sorted: the same order on every run
        reqs = self.queue.requests(ids)
        gone = [job_id for job_id, req in zip(ids, reqs) if req is None]  # started meanwhile
        changed = [req for req in reqs if req is not None and seconds != req.predicted_duration]
        self.queue.retime_all(changed, seconds)
        members.difference_update(gone)
        self._seconds[group] = seconds
        return len(changed)

    def observe(self, user: str, job_class: str, run_time: float) -> int:
        """A job ended: learn its run time, re-estimate the waiting jobs it may change; how many moved."""
        return self.observe_many([(user, job_class, run_time)])

    def observe_many(self, runs: Sequence[tuple]) -> int:
        """:meth:`observe` for each (user, class, run time[, start]) in turn (a feed of run times, in end
        order), re-estimating each waiting group those runs may change once, after the last: the
        same estimates as one by one (they depend on the estimator's history only), each group's
        jobs re-timed (an SJF queue re-keys them) once per feed instead of once per run."""
        estimator = self.estimator
        reorders = estimator.reorders
        keys: Dict[tuple, None] = {}
        for user, job_class, run_time, *start in runs:
            estimator.observe(user, job_class, run_time, *start)
            for level in estimator.settings.levels:
                key = _key(level, user or "", job_class or "")
                if key is not None:
                    keys[key] = None
        if estimator.reorders != reorders:
            return self._reestimate_all()
        keys[self.FALLBACK] = None
        groups = set()
        for key in keys:
            groups.update(self._by_key.pop(key, ()))
        moved = 0
        for group in sorted(groups, key=_group_order):  # sorted: the same order on every run
            members = self._groups.get(group)
            if members is None:
                continue  # dropped: none of its jobs waits
            found = self._reestimate(group, members)
            if found is not None:
                moved += found[0]
                self._index(group, found[1])  # (taken out of every key read above: filed again)
        return moved

    def _reestimate(self, group: tuple, members: set) -> Optional[Tuple[int, str]]:
        """Estimate ``group`` again and give its waiting jobs the result: (jobs moved, the level the
        estimate came from), or None when none of its jobs waits any more (the group is dropped)."""
        seconds, source, sigma = self.estimator.seconds_spread(group[0], group[1], group[2])
        if self._shared:
            shared = members
            if not shared.jobs:
                del self._groups[group]
                return None
            moved = shared.jobs if seconds != shared.seconds else 0
            if seconds != shared.seconds or sigma != shared.sigma:
                self.queue.retime_shared(shared, seconds, sigma)
            return moved, source
        if sigma != self._sigma[group]:
            self._respread(group, members, sigma)
        moved = self._retime(group, members, seconds) if seconds != self._seconds[group] else 0
        if not members:
            del self._groups[group], self._seconds[group], self._sigma[group]
            return None
        return moved, source

    def _reestimate_all(self) -> int:
        """The estimator tries its levels in a new order: every group is estimated and filed again."""
        self._by_key.clear()
        moved = 0
        for group in sorted(self._groups, key=_group_order):  # sorted: the same order on every run
            members = self._groups[group]
            if not self._shared:
                ids = sorted(members)
                members.difference_update(j for j, req in zip(ids, self.queue.requests(ids)) if req is None)
            found = self._reestimate(group, members)
            if found is not None:
                moved += found[0]
                self._index(group, found[1])
        return moved


def _correlation(score: List[float]) -> float:
    """Pearson correlation from [n, Σx, Σy, Σx², Σy², Σxy]; 0 when either side does not vary (a level
    whose estimate never moves tells jobs apart no better than none)."""
    n, sx, sy, sxx, syy, sxy = score
    if n < 2:
        return 0.0
    vx, vy = sxx - sx * sx / n, syy - sy * sy / n
    if vx <= 1e-12 * max(1.0, sxx) or vy <= 1e-12 * max(1.0, syy):
        return 0.0
    return (sxy - sx * sy / n) / math.sqrt(vx * vy)


def _group_order(group: tuple):
    return (group[0], group[1], -1.0 if group[2] is None else float(group[2]))


def _source_key(source: str, group: tuple):
    return _key(source, group[0], group[1]) if source in LEVELS else QueueEstimates.FALLBACK


def _median(values: List[float]) -> float:
    return _sorted_median(sorted(values))


def _sorted_median(ordered: List[float]) -> float:
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2.0


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _end(value) -> float:
    """Sort key of an end time (epoch seconds); a missing or unreadable one sorts first."""
    number = _number(value)
    return number if math.isfinite(number) else -math.inf


def _counts(record: Mapping, gpu_only: bool) -> bool:
    state = str(record.get("state") or "").split(" ", 1)[0].upper()
    if state and state not in COUNTED_STATES:
        return False
    if gpu_only and record.get("n_gpus") is not None and _number(record.get("n_gpus")) == 0 \
            and not _number(record.get("shards")) > 0:
        return False  # a CPU job (a shard of a GPU counts as a GPU job)
    elapsed = _number(record.get("elapsed_s"))
    return elapsed > 0 and math.isfinite(elapsed)


def _bounded(center: float, sigma: float, limit: Optional[float], source: str, runs: int) -> DurationEstimate:
    seconds = min(center, limit) if limit is not None else center
    low = center * math.exp(-Z90 * sigma)
    high = center * math.exp(Z90 * sigma)
    if limit is not None:
        low, high = min(low, limit), min(high, limit)
    return DurationEstimate(seconds, sigma, low, high, source, runs)


def estimator_from_records(records: Iterable[Mapping], settings: Optional[DurationSettings] = None,
                           gpu_only: bool = True) -> DurationEstimator:
    """A fresh estimator fed with ``records`` (see :meth:`DurationEstimator.observe_records`)."""
    estimator = DurationEstimator(settings)
    estimator.observe_records(records, gpu_only=gpu_only)
    return estimator


def estimate_errors(estimates: Sequence[DurationEstimate], truths: Sequence[float]) -> Dict[str, object]:
    """How wrong the estimates were, against the true run times (seconds alone).

    ``mare``: median absolute relative error |estimate − truth| / truth; ``median_log_ratio``:
    median of log(estimate / truth) (> 0: over-estimates); ``within_2x``: share within a factor 2;
    ``rank_corr``: Spearman correlation of estimates and truths (what SJF's order needs);
    ``coverage_80``: share of truths inside [low, high] (nominal 0.8); ``spread_scale_80``: the factor
    on ``log_sigma`` that would have made that share 0.8; ``sources``: share per source.
    Truths are floored at 1 s (a 0-second job has no relative error).
    """
    n = min(len(estimates), len(truths))
    if n == 0:
        return {"jobs": 0}
    est = np.array([e.seconds for e in estimates[:n]], dtype=np.float64)
    true = np.maximum(np.asarray(truths[:n], dtype=np.float64), 1.0)
    low = np.array([e.low for e in estimates[:n]])
    high = np.array([e.high for e in estimates[:n]])
    sigma = np.array([e.log_sigma for e in estimates[:n]])
    rel = np.abs(est - true) / true
    log_ratio = np.log(np.maximum(est, 1e-9) / true)
    sources: Dict[str, int] = {}
    for e in estimates[:n]:
        sources[e.source] = sources.get(e.source, 0) + 1
    return {
        "jobs": n,
        "mare": float(np.median(rel)),
        "mean_abs_rel_error": float(rel.mean()),
        "median_log_ratio": float(np.median(log_ratio)),
        "within_2x": float((np.abs(log_ratio) <= math.log(2.0)).mean()),
        "rank_corr": _spearman(est, true),
        "coverage_80": float(((true >= low * (1 - 1e-9)) & (true <= high * (1 + 1e-9))).mean()),
        "spread_scale_80": float(np.quantile(np.abs(log_ratio) / (Z90 * np.maximum(sigma, 1e-9)), 0.8)),
        "sources": {k: round(v / n, 4) for k, v in sorted(sources.items(), key=lambda kv: -kv[1])},
    }


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    ranks = np.empty(len(x))
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(x)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1)
    return ranks


def _spearman(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    if len(a) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def replay_errors(jobs: Iterable[Tuple[float, float, str, str, Optional[float]]],
                  settings: Optional[DurationSettings] = None) -> Tuple[Dict[str, object], List[DurationEstimate]]:
    """Estimate every job of a history at its submission, learning from those that ended before.

    ``jobs``: (submit time, run time, user, class, time limit or None), any order. A job is
    observed at submit + run time (as if it started at once: queueing delays are not known here).
    Returns (:func:`estimate_errors` of the replay with ``order``, the levels' order at the end; the
    estimates in submission order).
    """
    import heapq

    ordered = sorted(jobs, key=lambda j: j[0])
    estimator = DurationEstimator(settings)
    ends: List[tuple] = []
    estimates = []
    for k, (submit, run, user, cls, limit) in enumerate(ordered):
        while ends and ends[0][0] <= submit:
            _, _, u, c, r, started = heapq.heappop(ends)
            estimator.observe(u, c, r, started)
        estimates.append(estimator.estimate(user, cls, limit))
        heapq.heappush(ends, (submit + run, k, user, cls, run, submit))
    errors = estimate_errors(estimates, [j[1] for j in ordered])
    errors["order"] = estimator.order_text  # the levels' order at the end of the history
    return errors, estimates
