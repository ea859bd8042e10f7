"""Report contents as plain dicts (the terminal, JSON and HTML renderers all print these).

Flags (jobstats-like), per job:

* ``idle_gpu``: a GPU whose mean SM utilization stayed below IDLE_UTIL over at least MIN_SAMPLES;
* ``low_util``: mean SM utilization over all its GPUs below LOW_UTIL;
* ``memory_far_below``: peak GPU memory below MEMORY_FRACTION of the GPUs' memory it was given;
* ``fine_shared``: ran alone, yet its utilization and peak memory would have left room for a second
  job (below SHAREABLE_UTIL and SHAREABLE_MEMORY);
* ``hurt_by_pair``: an observation says it kept less than 1/slowdown_limit of its solo speed.
"""

import time
from collections import defaultdict

from ..store.decisions import decision
from ..store.models import model_history
from ..store.queries import co_runs, corunners_of, holds_gpus, job_gpus, jobs_since, sampled_gpus, shared_gpu_seconds

IDLE_UTIL = 1.0
LOW_UTIL = 30.0
MEMORY_FRACTION = 0.25
SHAREABLE_UTIL = 50.0
SHAREABLE_MEMORY = 0.5
MIN_SAMPLES = 3
MAX_POINTS = 240


def _downsample(points, limit=MAX_POINTS):
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)]


def _job_row(db, job_id):
    fields = ("cluster", "job_id", "name", "user", "account", "partition", "qos", "state", "exit_code",
              "exit_signal", "submit_time", "start_time", "end_time", "elapsed_s", "nodes", "n_gpus",
              "shards", "gres_alloc", "gpu_indices", "job_class", "horus_id", "horus_tokens", "comment",
              "admin_comment")
    row = db.execute(f"SELECT {', '.join(fields)} FROM jobs WHERE job_id = ? ORDER BY cluster LIMIT 1",
                     [job_id]).fetchone()
    return None if row is None else dict(zip(fields, row))


def _gpu_usage(db, job_id):
    """Per (node, gpu) series and summary from job_gpu_use joined with the GPU's own sample."""
    rows = db.execute(
        "SELECT u.node, u.gpu_index, u.ts, u.sm_util, u.mem_used_mb, u.shared, g.mem_total_mb, g.gpu_util "
        "FROM job_gpu_use u LEFT JOIN gpu_samples g "
        "ON g.node = u.node AND g.gpu_index = u.gpu_index AND g.ts = u.ts "
        "WHERE u.job_id = ? ORDER BY u.node, u.gpu_index, u.ts", [job_id]).fetchall()
    series = defaultdict(list)
    for node, index, ts, sm, mem, shared, total, gpu_util in rows:
        series[(node, index)].append((ts, sm, mem, shared, total, gpu_util))
    gpus = []
    for (node, index), points in sorted(series.items()):
        sms = [p[1] for p in points if p[1] is not None]
        mems = [p[2] for p in points if p[2] is not None]
        totals = [p[4] for p in points if p[4]]
        gpus.append({
            "node": node, "gpu_index": index, "samples": len(points),
            "mean_sm_util": round(sum(sms) / len(sms), 1) if sms else None,
            "max_sm_util": max(sms) if sms else None,
            "max_mem_mb": round(max(mems), 1) if mems else None,
            "mem_total_mb": max(totals) if totals else None,
            "shared_fraction": round(sum(p[3] for p in points) / len(points), 3),
            "series": _downsample([[p[0], p[1], p[2], p[5]] for p in points]),
        })
    return gpus


def _observed(db, job_id):
    rows = db.execute("SELECT corunner_job_id, corunner_class, norm_tput FROM observations WHERE job_id = ?",
                      [job_id]).fetchall()
    return {row[0]: {"corunner_class": row[1], "norm_tput": row[2]} for row in rows}


def _predicted_slowdown(db, job):
    """From the decision horus recorded (a token alone proves nothing: an older ingest read tokens
    from users' comments too)."""
    if job.get("horus_id"):
        made = decision(db, job["horus_id"])
        if made and made["predicted_slowdown"] is not None:
            return made["predicted_slowdown"]
    return None


def job_flags(gpus, corunners, observed, slowdown_limit=1.5):
    flags = []
    measured = [g for g in gpus if g["samples"] >= MIN_SAMPLES and g["mean_sm_util"] is not None]
    if any(g["mean_sm_util"] < IDLE_UTIL for g in measured):
        flags.append("idle_gpu")
    if measured:
        mean = sum(g["mean_sm_util"] for g in measured) / len(measured)
        if mean < LOW_UTIL:
            flags.append("low_util")
        mem = [(g["max_mem_mb"], g["mem_total_mb"]) for g in measured if g["max_mem_mb"] is not None and g["mem_total_mb"]]
        if mem and all(used < MEMORY_FRACTION * total for used, total in mem):
            flags.append("memory_far_below")
        if not corunners and mean < SHAREABLE_UTIL and mem and \
                all(used < SHAREABLE_MEMORY * total for used, total in mem):
            flags.append("fine_shared")
    if any(o["norm_tput"] < 1.0 / slowdown_limit for o in observed.values()):
        flags.append("hurt_by_pair")
    return flags


def job_report(db, job_id, slowdown_limit=1.5, now=None):
    """Everything about one job; None when the job is not in the store."""
    job = _job_row(db, job_id)
    if job is None:
        return None
    now = int(now if now is not None else time.time())
    start = job["start_time"] or now
    neighbours = jobs_since(db, start, job["end_time"] or now)
    if not any(n["job_id"] == job_id for n in neighbours):
        neighbours.append({k: job.get(k) for k in job})
    sampled = sampled_gpus(db, [n["job_id"] for n in neighbours])
    pairs = co_runs(neighbours, sampled, now)
    mine = corunners_of(pairs).get(job_id, {})
    by_id = {n["job_id"]: n for n in neighbours}
    observed = _observed(db, job_id)
    corunners = []
    for other, overlap in sorted(mine.items()):
        key = tuple(sorted((job_id, other)))
        info = by_id[other]
        obs = observed.get(other)
        corunners.append({
            "job_id": other, "name": info["name"], "user": info["user"], "job_class": info["job_class"],
            "overlap_s": overlap, "gpus": sorted(f"{n}:{i}" for n, i in pairs[key]["gpus"]),
            "start_time": info["start_time"], "end_time": info["end_time"],
            "observed_slowdown": round(1 / obs["norm_tput"], 3) if obs else None,
        })
    gpus = _gpu_usage(db, job_id)
    predicted = _predicted_slowdown(db, job)
    observed_slowdowns = [1 / o["norm_tput"] for o in observed.values() if o["norm_tput"]]
    return {
        "job": job,
        "gpu_list": sorted(f"{n}:{i}" for n, i in job_gpus(job, sampled)),
        "steps": [dict(zip(("step_id", "name", "state", "exit_code", "elapsed_s"), row)) for row in db.execute(
            "SELECT step_id, name, state, exit_code, elapsed_s FROM steps WHERE job_id = ? AND cluster = ? "
            "ORDER BY step_id", [job_id, job["cluster"]])],
        "gpus": gpus,
        "corunners": corunners,
        "predicted_slowdown": predicted,
        "observed_slowdown": round(max(observed_slowdowns), 3) if observed_slowdowns else None,
        "flags": job_flags(gpus, corunners, observed, slowdown_limit),
    }


GROUP_COLUMNS = {"users": "user", "accounts": "account", "partitions": "partition"}


def group_report(db, by, since=None, until=None, slowdown_limit=1.5, now=None):
    """GPU-hours allocated/used, mean utilization, GPU-hours saved by sharing, jobs hurt, per group.

    Allocated GPU-hours: elapsed x GPUs (a shard job counts its one GPU: it held a slice of it).
    Used: allocated x mean SM utilization where the collector measured it. Saved: each GPU-second a
    job shared with another job saves half a GPU-second for each (the GPU would otherwise have been
    needed twice; with more than two sharers this undercounts).
    """
    now = int(now if now is not None else time.time())
    column = GROUP_COLUMNS[by]
    fields = ("job_id", "start_time", "end_time", "nodes", "gpu_indices", "n_gpus", "shards", column)
    jobs = [j for j in jobs_since(db, since, until, fields=fields) if holds_gpus(j)]
    util = dict(db.execute("SELECT job_id, avg(sm_util) FROM job_gpu_use GROUP BY job_id").fetchall())
    # sacct's per-GPU types already say where indexed jobs ran; samples are needed for the others.
    sampled = sampled_gpus(db, [j["job_id"] for j in jobs if not j["gpu_indices"]])
    # A GPU-second held together with one other job counts half for each (one GPU did two jobs' work).
    saved = {job_id: seconds / 2.0 for job_id, seconds in shared_gpu_seconds(jobs, sampled, now).items()}
    hurt = {row[0] for row in db.execute(
        "SELECT DISTINCT job_id FROM observations WHERE norm_tput < ?", [1.0 / slowdown_limit])}
    groups = {}
    for job in jobs:
        key = job[column] or "(none)"
        g = groups.setdefault(key, {by[:-1]: key, "jobs": 0, "gpu_hours": 0.0, "used_gpu_hours": 0.0,
                                    "measured_gpu_hours": 0.0, "saved_gpu_hours": 0.0, "shared_jobs": 0,
                                    "hurt_jobs": 0})
        end = job["end_time"] or now
        hours = max(0, end - job["start_time"]) / 3600.0 * max(1, job["n_gpus"] or 0)
        g["jobs"] += 1
        g["gpu_hours"] += hours
        if util.get(job["job_id"]) is not None:
            g["measured_gpu_hours"] += hours
            g["used_gpu_hours"] += hours * util[job["job_id"]] / 100.0
        g["saved_gpu_hours"] += saved.get(job["job_id"], 0.0) / 3600.0
        g["shared_jobs"] += job["job_id"] in saved
        g["hurt_jobs"] += job["job_id"] in hurt
    rows = []
    for g in sorted(groups.values(), key=lambda r: -r["gpu_hours"]):
        g["mean_util"] = round(100 * g["used_gpu_hours"] / g["measured_gpu_hours"], 1) \
            if g["measured_gpu_hours"] else None
        for k in ("gpu_hours", "used_gpu_hours", "measured_gpu_hours", "saved_gpu_hours"):
            g[k] = round(g[k], 3)
        rows.append(g)
    return {"by": by, "since": since, "until": until, "rows": rows}


def cluster_report(db, since=None, until=None, bucket_s=None, now=None):
    """Utilization over time (``bucket_s`` buckets; default: about 120 over the sampled span, at least
    a minute), sharing rate and model accuracy."""
    now = int(now if now is not None else time.time())
    clauses, args = [], []
    if since is not None:
        clauses.append("ts >= ?")
        args.append(since)
    if until is not None:
        clauses.append("ts <= ?")
        args.append(until)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    if bucket_s is None:
        first, last = db.execute(f"SELECT min(ts), max(ts) FROM gpu_samples {where}", args).fetchone()
        bucket_s = max(60, int(((last or 0) - (first or 0)) / 120) + 1)
    timeline = [
        {"t": int(row[0]), "mean_gpu_util": round(row[1], 1) if row[1] is not None else None,
         "gpus": row[2], "busy_fraction": round(row[3], 3)}
        for row in db.execute(
            f"SELECT CAST(ts / ? AS INTEGER) * ?, avg(gpu_util), count(DISTINCT node || ':' || gpu_index), "
            f"avg(job_ids IS NOT NULL) FROM gpu_samples {where} GROUP BY 1 ORDER BY 1",
            [bucket_s, bucket_s] + args)
    ]
    jobs = [j for j in jobs_since(db, since, until) if holds_gpus(j)]
    pairs = co_runs(jobs, sampled_gpus(db), now)
    sharing = {job_id for pair in pairs for job_id in pair}
    models = model_history(db)
    states = dict(db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
    return {
        "since": since, "until": until, "bucket_s": bucket_s, "gpu_jobs": len(jobs), "shared_jobs": len(sharing),
        "sharing_rate": round(len(sharing) / len(jobs), 3) if jobs else None,
        "states": states, "timeline": timeline, "models": models,
        "observations": db.execute("SELECT count(*) FROM observations").fetchone()[0],
    }
