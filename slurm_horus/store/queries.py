"""Reads shared by the reports and the learning loop: which job held which GPU, and who co-ran.

A job's GPUs are (node, index) pairs: the indices sacct recorded (per-GPU GRES types, see
``collect/records.py``) on each of its nodes, plus every (node, index) where the collector saw it.
Two jobs *co-ran* when they held the same GPU during overlapping time; the overlap is taken from
sacct's start/end times.
"""

import heapq
import time
from collections import defaultdict
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..hostlist import expand_hostlist


@lru_cache(maxsize=4096)
def _expand_nodelist(text):
    """``n[1-3,5],gpu7`` -> (n1, n2, n3, n5, gpu7), cached: the reports expand the same lists often."""
    try:
        return tuple(expand_hostlist(text))
    except InputError:  # a stored row with a list no Slurm prints: keep it as one name
        return (text,)


@lru_cache(maxsize=4096)
def parse_indices(text):
    return tuple(int(x) for x in (text or "").split(",") if x.strip().isdigit())


JOB_FIELDS = ("cluster", "job_id", "name", "user", "account", "partition", "state", "exit_code",
              "start_time", "end_time", "elapsed_s", "nodes", "n_gpus", "shards", "gres_alloc",
              "gpu_indices", "job_class", "horus_id", "horus_tokens", "submit_time", "comment")


def jobs_since(db, since=None, until=None, where="", params=(), fields=JOB_FIELDS):
    """Job rows (dicts of ``fields``) that ran at some time in [since, until]."""
    return [dict(zip(fields, row)) for row in job_rows_since(db, since, until, where, params, fields)]


def job_rows_since(db, since=None, until=None, where="", params=(), fields=JOB_FIELDS):
    """:func:`jobs_since` as tuples of ``fields`` (a month of a large site is 300,000 rows: no dicts).

    Through the end-time index when the range holds a small part of the table, else by one scan: for
    a month of a large site (most of the table) the index's random lookups cost three times the scan.
    """
    clauses, args = ["start_time IS NOT NULL"], []
    table = "jobs"
    if since is not None:
        clauses.append("(end_time IS NULL OR end_time >= ?)")
        args.append(int(since))
        ending = db.execute("SELECT count(*) FROM jobs WHERE end_time >= ?", [int(since)]).fetchone()[0]
        if ending > db.execute("SELECT count(*) FROM jobs").fetchone()[0] // 4:
            table = "jobs NOT INDEXED"
    if until is not None:
        clauses.append("start_time <= ?")
        args.append(int(until))
    if where:
        clauses.append(where)
        args.extend(params)
    sql = f"SELECT {', '.join(fields)} FROM {table} WHERE {' AND '.join(clauses)}"
    return db.execute(sql, args).fetchall()


DURATION_FIELDS = ("user", "job_class", "elapsed_s", "state", "n_gpus", "shards", "start_time", "end_time")


def finished_gpu_jobs(db, limit=20000):
    """The ``limit`` GPU jobs (whole GPUs or shards) that ended last, oldest first: the run times the
    duration estimator learns from (``placement.duration.estimator_from_records``)."""
    sql = (f"SELECT {', '.join(DURATION_FIELDS)} FROM jobs WHERE end_time IS NOT NULL AND elapsed_s > 0 "
           "AND (n_gpus > 0 OR shards > 0) ORDER BY end_time DESC LIMIT ?")
    rows = [dict(zip(DURATION_FIELDS, row)) for row in db.execute(sql, (int(limit),))]
    rows.reverse()
    return rows


def sampled_gpus(db, job_ids=None):
    """{job_id: {(node, gpu_index)}} from the collector's per-job rows (their rollup)."""
    held = defaultdict(set)
    sql = "SELECT DISTINCT job_id, node, gpu_index FROM job_gpu_summary"
    rows = db.execute(sql).fetchall() if job_ids is None else [
        row for chunk in _chunks(list(job_ids), 500)
        for row in db.execute(f"{sql} WHERE job_id IN ({','.join('?' * len(chunk))})", chunk)
    ]
    for job_id, node, index in rows:
        held[job_id].add((node, index))
    return held


def _chunks(items, size):
    for offset in range(0, len(items), size):
        yield items[offset: offset + size]


def holds_gpus(job):
    """sacct recorded a GPU (or shard) allocation for the job: the only jobs placed on GPUs here."""
    return bool(job.get("n_gpus") or job.get("shards"))


HOLDS_GPUS_SQL = "(coalesce(n_gpus, 0) <> 0 OR coalesce(shards, 0) <> 0)"  # holds_gpus() as a WHERE clause


def job_gpus(job, sampled=None):
    """The (node, index) pairs a job held: the stored indices on each node (of a job sacct recorded
    GPUs for: an older ingest read them from users' comments too), plus sampled ones."""
    return set(_held(job, sampled))


def _held(job, sampled):
    """job_gpus() without a copy: a cached frozenset, or a new set where samples add to it."""
    pairs = _allocated(job.get("nodes") or "", job.get("gpu_indices")) if holds_gpus(job) else frozenset()
    seen = sampled.get(job["job_id"]) if sampled else None
    return pairs | seen if seen else pairs


@lru_cache(maxsize=65536)
def _allocated(nodes, gpu_indices):
    """sacct's indices on each node (a site has a few thousand distinct (nodes, indices) values)."""
    indices = parse_indices(gpu_indices)
    return frozenset((node, index) for node in _expand_nodelist(nodes) for index in indices)


def overlaps(jobs, sampled=None, now=None):
    """Yield (gpu, job_id, other_job_id, overlap_s) for every two jobs that held one GPU at once
    (``other_job_id`` started first). Jobs without a start are skipped; a running job ends ``now``."""
    now = int(now if now is not None else time.time())
    jobs = [job for job in jobs if job.get("start_time") is not None]
    ids = [job["job_id"] for job in jobs]
    found = overlap_arrays([_held(job, sampled) for job in jobs], [job["start_time"] for job in jobs],
                           [job.get("end_time") or now for job in jobs])
    gpus, gpu, later, earlier, overlap = found
    for k in range(len(overlap)):
        yield gpus[gpu[k]], ids[later[k]], ids[earlier[k]], overlap[k].item()


def gpu_lists(job_ids, nodes, gpu_indices, sampled=None):
    """Per job (parallel columns of jobs that hold GPUs, :data:`HOLDS_GPUS_SQL`): job_gpus() without
    copies (a cached frozenset, or a new set where samples add to it)."""
    lists = [_allocated(n or "", i) for n, i in zip(nodes, gpu_indices)]
    if sampled:
        for k, job_id in enumerate(job_ids):
            seen = sampled.get(job_id)
            if seen:
                lists[k] = lists[k] | seen
    return lists


PAIRED_RUN_MAX = 64


def overlap_arrays(held, starts, ends):
    """Every two jobs that held one GPU at once, as arrays: ``held[k]`` the GPUs of job k, which ran
    [starts[k], ends[k]). Returns (gpus, gpu, later, earlier, overlap): ``gpus`` the GPU names,
    then per overlap the GPU's position in ``gpus``, the positions of the job that started later (at
    the same start: the longer, then the later in ``held``) and of the other one, and the overlap
    (min of the ends - the later start, > 0).

    At a site's scale (hundreds of thousands of jobs a month) most jobs share with nobody: numpy sorts
    every (GPU, job) by GPU and start and splits it into runs of jobs that overlap one another (a run
    starts where no earlier job on the GPU is still running, so every overlap is within a run). In
    runs of up to PAIRED_RUN_MAX jobs every pair is checked at once; longer runs (a long job beside
    many short ones: their pairs grow as the square) are swept one by one, with a heap of the running
    jobs by end time.
    """
    empty = np.zeros(0, dtype=np.int64)
    gpu_ids, codes = {}, {}
    keys = []
    for gpus in held:
        code = codes.get(gpus) if isinstance(gpus, frozenset) else None
        if code is None:
            code = tuple(gpu_ids.setdefault(gpu, len(gpu_ids)) for gpu in gpus)
            if isinstance(gpus, frozenset):
                codes[gpus] = code
        keys.append(code)
    counts = np.fromiter((len(code) for code in keys), dtype=np.int64, count=len(keys))
    if not counts.sum():
        return list(gpu_ids), empty, empty, empty, empty
    job = np.repeat(np.arange(len(keys)), counts)
    g = np.fromiter((gpu for code in keys for gpu in code), dtype=np.int64, count=int(counts.sum()))
    starts, ends = np.asarray(starts), np.asarray(ends)
    s, e = starts[job], ends[job]
    order = np.lexsort((job, e, s, g))  # by GPU, then (start, end, position)
    sf, ef = s[order].astype(np.float64), e[order].astype(np.float64)
    base = min(sf.min(), ef.min())
    width = max(sf.max(), ef.max()) - base + 1.0
    shifted_end = (ef - base) + g[order] * width  # each GPU's times in a band of its own
    shifted_start = (sf - base) + g[order] * width
    latest = np.maximum.accumulate(shifted_end)
    running_before = np.concatenate(([-np.inf], latest[:-1]))
    run = np.cumsum(running_before <= shifted_start)  # a new run: nothing earlier still running
    size = np.bincount(run)[run]
    first_of_run = np.flatnonzero(np.diff(run, prepend=0))
    place = np.arange(len(run)) - first_of_run[run - 1]  # the position within its run
    # within runs of up to PAIRED_RUN_MAX jobs, all pairs (p, p - d) at once, one distance d at a time
    parts = []
    candidates = np.flatnonzero((size > 1) & (size <= PAIRED_RUN_MAX))
    d = 1
    while len(candidates):
        candidates = candidates[place[candidates] >= d]
        later, earlier = order[candidates], order[candidates - d]
        overlap = np.minimum(e[later], e[earlier]) - s[later]
        positive = overlap > 0
        parts.append((g[later][positive], job[later][positive], job[earlier][positive], overlap[positive]))
        d += 1
    crowded = np.flatnonzero(size > PAIRED_RUN_MAX)
    if len(crowded) or not parts:
        parts.append(_sweep(order[crowded], run[crowded], g, job, s, e))
    gpu, later, earlier, overlap = (np.concatenate(column) for column in zip(*parts))
    return list(gpu_ids), gpu, later, earlier, overlap


def _sweep(members, runs, g, job, s, e):
    """The overlaps within runs longer than PAIRED_RUN_MAX (``members`` in run order), one at a time."""
    found = []
    k = 0
    while k < len(members):
        first = k
        while k < len(members) and runs[k] == runs[first]:
            k += 1
        running = []  # heap of (end, position in `job`)
        for i in members[first:k]:
            start, end = s[i], e[i]
            while running and running[0][0] <= start:
                heapq.heappop(running)
            for other_end, other in running:
                overlap = min(end, other_end) - start
                if overlap > 0:
                    found.append((g[i], job[i], job[other], overlap))
            heapq.heappush(running, (end, i))
    if not found:
        return (np.zeros(0, dtype=np.int64),) * 3 + (np.zeros(0, dtype=e.dtype),)
    gpu, later, earlier, overlap = zip(*found)
    return np.array(gpu), np.array(later), np.array(earlier), np.array(overlap, dtype=e.dtype)


def co_runs(jobs, sampled=None, now=None):
    """Pairs of jobs that held one GPU at overlapping times.

    Returns {(job_id_a, job_id_b): {"overlap_s": s, "gpus": {(node, index)}}} with a < b, overlap the
    largest per-GPU overlap (a multi-GPU pair overlaps on each GPU for the same time span).
    """
    pairs = {}
    for gpu, job_id, other, overlap in overlaps(jobs, sampled, now):
        key = (job_id, other) if job_id < other else (other, job_id)
        entry = pairs.get(key)
        if entry is None:
            entry = pairs[key] = {"overlap_s": 0, "gpus": set()}
        if overlap > entry["overlap_s"]:
            entry["overlap_s"] = overlap
        entry["gpus"].add(gpu)
    return pairs


def shared_gpu_seconds(held, starts, ends):
    """Per job (the columns of :func:`overlap_arrays`): GPU-seconds during which another job held the
    same GPU (summed over GPUs and partners), as an array."""
    _gpus, _gpu, later, earlier, overlap = overlap_arrays(held, starts, ends)
    weights = overlap.astype(np.float64)
    return np.bincount(later, weights, minlength=len(held)) + np.bincount(earlier, weights, minlength=len(held))


def corunners_of(pairs):
    """{job_id: {other_job_id: overlap_s}} from :func:`co_runs` output."""
    result = defaultdict(dict)
    for (a, b), entry in pairs.items():
        result[a][b] = entry["overlap_s"]
        result[b][a] = entry["overlap_s"]
    return result
