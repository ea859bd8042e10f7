"""Reads shared by the reports and the learning loop: which job held which GPU, and who co-ran.

A job's GPUs are (node, index) pairs: the indices sacct recorded (per-GPU GRES types, see
``collect/records.py``) on each of its nodes, plus every (node, index) where the collector saw it.
Two jobs *co-ran* when they held the same GPU during overlapping time; the overlap is taken from
sacct's start/end times.
"""

import re
import time
from collections import defaultdict

_BRACKET = re.compile(r"^(?P<prefix>[^\[]*)\[(?P<body>[^\]]*)\](?P<suffix>.*)$")


def expand_nodelist(text):
    """``n[1-3,5],gpu7`` -> [n1, n2, n3, n5, gpu7] (the hostlist forms sacct prints)."""
    if not text:
        return []
    names, depth, current = [], 0, ""
    parts = []
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in filter(None, (p.strip() for p in parts)):
        match = _BRACKET.match(part)
        if not match:
            names.append(part)
            continue
        for item in match.group("body").split(","):
            low, sep, high = item.partition("-")
            if sep and low.isdigit() and high.isdigit():
                width = len(low)
                names.extend(f"{match.group('prefix')}{i:0{width}d}{match.group('suffix')}"
                             for i in range(int(low), int(high) + 1))
            else:
                names.append(f"{match.group('prefix')}{item}{match.group('suffix')}")
    return names


def parse_indices(text):
    return [int(x) for x in (text or "").split(",") if x.strip().isdigit()]


JOB_FIELDS = ("cluster", "job_id", "name", "user", "account", "partition", "state", "exit_code",
              "start_time", "end_time", "elapsed_s", "nodes", "n_gpus", "shards", "gres_alloc",
              "gpu_indices", "job_class", "horus_id", "horus_tokens", "submit_time")


def jobs_since(db, since=None, until=None, where="", params=()):
    """Job rows (dicts) that ran at some time in [since, until]."""
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
    sql = f"SELECT {', '.join(JOB_FIELDS)} FROM jobs WHERE {' AND '.join(clauses)}"
    return [dict(zip(JOB_FIELDS, row)) for row in db.execute(sql, args)]


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


def job_gpus(job, sampled=None):
    """The (node, index) pairs a job held: sacct's indices on each node, plus sampled ones."""
    pairs = set()
    for node in expand_nodelist(job.get("nodes")):
        for index in parse_indices(job.get("gpu_indices")):
            pairs.add((node, index))
    if sampled:
        pairs |= sampled.get(job["job_id"], set())
    return pairs


def _interval(job, now):
    start = job.get("start_time")
    end = job.get("end_time") or now
    return start, end


def co_runs(jobs, sampled=None, now=None):
    """Pairs of jobs that held one GPU at overlapping times.

    Returns {(job_id_a, job_id_b): {"overlap_s": s, "gpus": {(node, index)}}} with a < b, overlap the
    largest per-GPU overlap (a multi-GPU pair overlaps on each GPU for the same time span).
    """
    now = int(now if now is not None else time.time())
    by_gpu = defaultdict(list)
    for job in jobs:
        if job.get("start_time") is None:
            continue
        for gpu in job_gpus(job, sampled):
            by_gpu[gpu].append(job)
    pairs = {}
    for gpu, holders in by_gpu.items():
        holders.sort(key=lambda j: j["start_time"])
        active = []
        for job in holders:
            start, end = _interval(job, now)
            active = [other for other in active if _interval(other, now)[1] > start]
            for other in active:
                overlap = min(end, _interval(other, now)[1]) - start
                if overlap <= 0:
                    continue
                key = tuple(sorted((job["job_id"], other["job_id"])))
                entry = pairs.setdefault(key, {"overlap_s": 0, "gpus": set()})
                entry["overlap_s"] = max(entry["overlap_s"], overlap)
                entry["gpus"].add(gpu)
            active.append(job)
    return pairs


def corunners_of(pairs):
    """{job_id: {other_job_id: overlap_s}} from :func:`co_runs` output."""
    result = defaultdict(dict)
    for (a, b), entry in pairs.items():
        result[a][b] = entry["overlap_s"]
        result[b][a] = entry["overlap_s"]
    return result
