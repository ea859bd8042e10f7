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
              "gpu_indices", "job_class", "horus_id", "horus_tokens", "submit_time")


def jobs_since(db, since=None, until=None, where="", params=(), fields=JOB_FIELDS):
    """Job rows (dicts of ``fields``) that ran at some time in [since, until]."""
    clauses, args = ["start_time IS NOT NULL"], []
    if since is not None:
        clauses.append("(end_time IS NULL OR end_time >= ?)")
        args.append(int(since))
    if until is not None:
        clauses.append("start_time <= ?")
        args.append(int(until))
    if where:
        clauses.append(where)
        args.extend(params)
    sql = f"SELECT {', '.join(fields)} FROM jobs WHERE {' AND '.join(clauses)}"
    return [dict(zip(fields, row)) for row in db.execute(sql, args)]


def sampled_gpus(db, job_ids=None):
    """{job_id: {(node, gpu_index)}} from the collector's per-job rows."""
    held = defaultdict(set)
    sql = "SELECT DISTINCT job_id, node, gpu_index FROM job_gpu_use"
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


def job_gpus(job, sampled=None):
    """The (node, index) pairs a job held: the stored indices on each node (of a job sacct recorded
    GPUs for: an older ingest read them from users' comments too), plus sampled ones."""
    pairs = set()
    indices = parse_indices(job.get("gpu_indices")) if holds_gpus(job) else ()
    for node in _expand_nodelist(job.get("nodes") or ""):
        for index in indices:
            pairs.add((node, index))
    if sampled:
        pairs |= sampled.get(job["job_id"], set())
    return pairs


def overlaps(jobs, sampled=None, now=None):
    """Yield (gpu, job_id, other_job_id, overlap_s) for every two jobs that held one GPU at once.

    One sweep per GPU over its jobs in start order, with a heap of the running ones by end time.
    """
    now = int(now if now is not None else time.time())
    by_gpu = defaultdict(list)
    for job in jobs:
        start = job.get("start_time")
        if start is None:
            continue
        span = (start, job.get("end_time") or now, job["job_id"])
        for gpu in job_gpus(job, sampled):
            by_gpu[gpu].append(span)
    for gpu, spans in by_gpu.items():
        spans.sort()
        running = []  # heap of (end, job_id)
        for start, end, job_id in spans:
            while running and running[0][0] <= start:
                heapq.heappop(running)
            for other_end, other in running:
                overlap = min(end, other_end) - start
                if overlap > 0:
                    yield gpu, job_id, other, overlap
            heapq.heappush(running, (end, job_id))


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


def shared_gpu_seconds(jobs, sampled=None, now=None):
    """{job_id: GPU-seconds during which another job held the same GPU} (summed over GPUs and partners)."""
    shared = defaultdict(float)
    for _, job_id, other, overlap in overlaps(jobs, sampled, now):
        shared[job_id] += overlap
        shared[other] += overlap
    return shared


def corunners_of(pairs):
    """{job_id: {other_job_id: overlap_s}} from :func:`co_runs` output."""
    result = defaultdict(dict)
    for (a, b), entry in pairs.items():
        result[a][b] = entry["overlap_s"]
        result[b][a] = entry["overlap_s"]
    return result
