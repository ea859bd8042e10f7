"""Report contents as plain dicts (the terminal, JSON and HTML renderers all print these).

Job ids are written as Slurm writes them: ``1234`` (a job, or every task of array 1234) and
``1234_7`` (task 7 of array 1234); :func:`find_jobs` turns them into job rows.

Efficiencies, as seff and reportseff show them: CPU (CPU time used / (elapsed x cores)), host memory
(the largest resident memory of any step / the memory the job was given) and time (elapsed / time
limit).

Flags (jobstats-like), per job, each with a plain-language note and advice (:data:`FLAG_NOTES`):

* ``idle_gpu``: a GPU whose mean SM utilization stayed below IDLE_UTIL over at least MIN_SAMPLES;
* ``low_util``: mean SM utilization over all its GPUs below LOW_UTIL;
* ``memory_far_below``: peak GPU memory below MEMORY_FRACTION of the GPUs' memory it was given;
* ``fine_shared``: ran alone, yet its utilization and peak memory would have left room for a second
  job (below SHAREABLE_UTIL and SHAREABLE_MEMORY);
* ``hurt_by_pair``: an observation says it kept less than 1/slowdown_limit of its solo speed;
* ``low_cpu_eff``: it used less than LOW_CPU_EFF of 2 or more CPU cores;
* ``memory_overrequested``: its peak resident memory stayed below MEMORY_FRACTION of 1 GiB or more;
* ``time_limit_far``: it completed in less than TIME_FRACTION of a time limit of 10 minutes or more.
"""

import math
import re
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
LOW_CPU_EFF = 25.0
TIME_FRACTION = 0.25
UNLIMITED_MIN = 365 * 24 * 60  # sacct's time limit of a job without one (INFINITE partitions)

# flag -> (what happened, what to do about it): what a user reads at job end (see mail_line)
FLAG_NOTES = {
    "idle_gpu": ("At least one of the job's GPUs stayed idle (mean utilization under 1 %).",
                 "Ask for only the GPUs the code uses (--gres=gpu:N), or make it use all of them "
                 "(one process per GPU, e.g. torch DistributedDataParallel)."),
    "low_util": ("Its GPUs were busy less than 30 % of the time.",
                 "Feed the GPU faster (more data-loader workers, larger batches), or give the job a class "
                 "(horus-sbatch --horus-class) so that slurm-horus can share the GPU with a job that fits."),
    "memory_far_below": ("It used less than a quarter of its GPUs' memory.",
                         "A GPU shard would do: with a job class slurm-horus may share the GPU."),
    "fine_shared": ("It ran alone, yet it left room for a second job on its GPU.",
                    "Submit it with horus-sbatch and a job class (--horus-class) so that it can share a GPU "
                    "and start sooner."),
    "hurt_by_pair": ("Sharing its GPU slowed it down more than the site allows.",
                     "slurm-horus has learned this pair and will keep them apart; for timing runs use "
                     "horus-sbatch --horus-off (never shared)."),
    "low_cpu_eff": ("It used {cpu_eff:.0f} % of its {n_cpus} CPU cores.",
                    "Ask for fewer cores (--cpus-per-task), or use them (e.g. data-loader workers = cores)."),
    "memory_overrequested": ("Its peak memory ({max_rss}) was {mem_eff:.0f} % of the {mem} it asked for.",
                             "Ask for less memory next time: --mem={mem_advice} leaves a 25 % margin."),
    "time_limit_far": ("It finished in {time_eff:.0f} % of its {limit} time limit.",
                       "A shorter --time={time_advice} lets the backfill scheduler start it sooner."),
}


def _downsample(points, limit=MAX_POINTS):
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)]


_ROW_FIELDS = ("cluster", "job_id", "array_job_id", "array_task_id", "name", "user", "account", "partition", "qos",
               "state", "exit_code", "exit_signal", "submit_time", "start_time", "end_time", "elapsed_s",
               "time_limit_min", "nodes", "n_cpus", "mem_mb", "cpu_time_s", "max_rss_mb", "n_gpus", "shards",
               "gres_alloc", "gpu_indices", "job_class", "horus_id", "horus_tokens", "comment", "admin_comment")
_JOB_SPEC = re.compile(r"^(\d+)(?:_(\d+))?$")


def _job_row(db, job_id):
    row = db.execute(f"SELECT {', '.join(_ROW_FIELDS)} FROM jobs WHERE job_id = ? ORDER BY cluster LIMIT 1",
                     [job_id]).fetchone()
    return None if row is None else dict(zip(_ROW_FIELDS, row))


def job_name(job):
    """The id Slurm shows for a job row: ``1234`` or ``1234_7`` for an array task."""
    if job.get("array_job_id") is not None and job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def parse_job_spec(text):
    """``1234`` -> (1234, None); ``1234_7`` -> (1234, 7); anything else: ValueError."""
    match = _JOB_SPEC.match(str(text).strip())
    if not match:
        raise ValueError(f"job id: expected N or N_T (task T of array N), got {text!r}")
    return int(match.group(1)), (int(match.group(2)) if match.group(2) is not None else None)


def find_jobs(db, spec):
    """The job rows a job id names: ``N_T`` that task; ``N`` every task of array N when it is one
    (as reportseff reads a base id), else job N. [] when none is in the store."""
    base, task = parse_job_spec(spec)
    select = f"SELECT {', '.join(_ROW_FIELDS)} FROM jobs"
    if task is not None:
        rows = db.execute(f"{select} WHERE array_job_id = ? AND array_task_id = ? ORDER BY cluster LIMIT 1",
                          [base, task]).fetchall()
    else:
        rows = db.execute(f"{select} WHERE array_job_id = ? ORDER BY array_task_id, job_id", [base]).fetchall()
        if not rows:
            rows = db.execute(f"{select} WHERE job_id = ? ORDER BY cluster LIMIT 1", [base]).fetchall()
    return [dict(zip(_ROW_FIELDS, row)) for row in rows]


def _gpu_usage(db, job_id, start=None, end=None):
    """Per (node, gpu) series and summary from job_gpu_use joined with the GPU's own sample; only the
    samples taken while the job ran (a collector may still see its id a moment after it ended), to
    the second sacct records."""
    rows = db.execute(
        "SELECT u.node, u.gpu_index, u.ts, u.sm_util, u.mem_used_mb, u.shared, g.mem_total_mb, g.gpu_util "
        "FROM job_gpu_use u LEFT JOIN gpu_samples g "
        "ON g.node = u.node AND g.gpu_index = u.gpu_index AND g.ts = u.ts "
        "WHERE u.job_id = ? AND u.ts >= ? AND u.ts < ? ORDER BY u.node, u.gpu_index, u.ts",
        [job_id, start or 0, end + 1 if end else 1e18]).fetchall()  # sacct's end is cut to the second
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


def _mib(mb):
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


def hms(seconds):
    """``[D-]H:MM:SS``, the way sacct writes durations; '-' when unknown."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def efficiency(job):
    """CPU, host-memory and time efficiency of a finished job (percent; None when unknown)."""
    elapsed, cpus = job.get("elapsed_s") or 0, job.get("n_cpus") or 0
    limit = job.get("time_limit_min")
    limit = limit if limit and limit < UNLIMITED_MIN else None
    core_walltime = elapsed * cpus
    cpu_time, rss, mem = job.get("cpu_time_s"), job.get("max_rss_mb"), job.get("mem_mb")
    return {
        "cpu_eff": round(100.0 * cpu_time / core_walltime, 1) if cpu_time is not None and core_walltime else None,
        "core_walltime_s": core_walltime or None, "cpu_time_s": cpu_time, "n_cpus": cpus or None,
        "mem_eff": round(100.0 * rss / mem, 1) if rss is not None and mem else None,
        "max_rss_mb": rss, "mem_mb": mem,
        "time_eff": round(100.0 * elapsed / (limit * 60.0), 1) if limit and job.get("elapsed_s") is not None else None,
        "time_limit_min": limit,
    }


def efficiency_flags(job, eff):
    flags = []
    if eff["cpu_eff"] is not None and (eff["n_cpus"] or 0) >= 2 and eff["cpu_eff"] < LOW_CPU_EFF:
        flags.append("low_cpu_eff")
    if eff["mem_eff"] is not None and (eff["mem_mb"] or 0) >= 1024 and eff["mem_eff"] < 100 * MEMORY_FRACTION:
        flags.append("memory_overrequested")
    if eff["time_eff"] is not None and eff["time_limit_min"] >= 10 and job.get("state") == "COMPLETED" \
            and eff["time_eff"] < 100 * TIME_FRACTION:
        flags.append("time_limit_far")
    return flags


def flag_notes(flags, eff):
    """[{flag, note, advice}] in plain language for ``flags`` (see FLAG_NOTES)."""
    values = dict(eff)
    if eff.get("max_rss_mb") is not None and eff.get("mem_mb"):
        values.update(max_rss=_mib(eff["max_rss_mb"]), mem=_mib(eff["mem_mb"]),
                      mem_advice=f"{max(1, math.ceil(eff['max_rss_mb'] * 1.25 / 1024))}G")
    if eff.get("time_limit_min"):
        used_min = (eff["time_eff"] or 0) / 100.0 * eff["time_limit_min"]
        values.update(limit=hms(eff["time_limit_min"] * 60),
                      time_advice=hms(max(300, math.ceil(used_min * 2 / 5) * 5 * 60)))
    notes = []
    for flag in flags:
        note, advice = FLAG_NOTES[flag]
        try:
            notes.append({"flag": flag, "note": note.format(**values), "advice": advice.format(**values)})
        except (KeyError, TypeError, ValueError):
            notes.append({"flag": flag, "note": note, "advice": advice})
    return notes


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
    gpus = _gpu_usage(db, job_id, job["start_time"], job["end_time"])
    predicted = _predicted_slowdown(db, job)
    observed_slowdowns = [1 / o["norm_tput"] for o in observed.values() if o["norm_tput"]]
    eff = efficiency(job)
    flags = job_flags(gpus, corunners, observed, slowdown_limit) + efficiency_flags(job, eff)
    return {
        "job": job,
        "job_name": job_name(job),
        "efficiency": eff,
        "gpu_list": sorted(f"{n}:{i}" for n, i in job_gpus(job, sampled)),
        "steps": [dict(zip(("step_id", "name", "state", "exit_code", "elapsed_s"), row)) for row in db.execute(
            "SELECT step_id, name, state, exit_code, elapsed_s FROM steps WHERE job_id = ? AND cluster = ? "
            "ORDER BY step_id", [job_id, job["cluster"]])],
        "gpus": gpus,
        "corunners": corunners,
        "predicted_slowdown": predicted,
        "observed_slowdown": round(max(observed_slowdowns), 3) if observed_slowdowns else None,
        "flags": flags,
        "notes": flag_notes(flags, eff),
    }


def _gpu_summary(gpus):
    """(mean utilization %, peak GPU memory MB, GPU memory MB) over a job's sampled GPUs."""
    measured = [g for g in gpus if g["mean_sm_util"] is not None]
    util = round(sum(g["mean_sm_util"] for g in measured) / len(measured), 1) if measured else None
    peak = max((g["max_mem_mb"] for g in gpus if g["max_mem_mb"] is not None), default=None)
    total = max((g["mem_total_mb"] for g in gpus if g["mem_total_mb"]), default=None)
    return util, peak, total


def summary_row(report):
    """One line of a job list (``horus report jobs``, an array's tasks) from a job report."""
    job, eff = report["job"], report["efficiency"]
    util, peak, total = _gpu_summary(report["gpus"])
    return {"job": report["job_name"], "job_id": job["job_id"], "name": job["name"], "user": job["user"],
            "state": job["state"], "elapsed_s": job["elapsed_s"], "start_time": job["start_time"],
            "gpus": ",".join(report["gpu_list"]) or None, "gpu_util": util, "gpu_mem_peak_mb": peak,
            "gpu_mem_mb": total, "cpu_eff": eff["cpu_eff"], "mem_eff": eff["mem_eff"], "time_eff": eff["time_eff"],
            "flags": report["flags"]}


def array_report(db, reports):
    """Every task of one array: a row per task and the array as a whole (efficiencies of the sums)."""
    jobs = [r["job"] for r in reports]
    total = {key: sum(j[key] or 0 for j in jobs) or None for key in ("cpu_time_s", "max_rss_mb", "mem_mb")}
    core_walltime = sum((j["elapsed_s"] or 0) * (j["n_cpus"] or 0) for j in jobs)
    return {
        "array_job_id": jobs[0]["array_job_id"], "tasks": [summary_row(r) for r in reports],
        "states": dict(sorted(_count(j["state"] for j in jobs).items())),
        "cpu_eff": round(100 * total["cpu_time_s"] / core_walltime, 1) if total["cpu_time_s"] and core_walltime
        else None,
        "gpu_hours": round(sum((j["elapsed_s"] or 0) * max(1, j["n_gpus"] or 0) for j in jobs) / 3600, 3),
        "reports": reports,
    }


def _count(values):
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def jobs_report(db, user=None, since=None, until=None, state=None, limit=200, slowdown_limit=1.5, now=None):
    """The newest ``limit`` jobs (of ``user``, in a state, in a time window), one summary row each."""
    clauses, args = [], []
    if user:
        clauses.append("user = ?")
        args.append(user)
    if state:
        clauses.append("state = ?")
        args.append(state.upper())
    where = " AND ".join(clauses)
    rows = jobs_since(db, since, until, where=where, params=args, fields=("job_id", "start_time"))
    rows.sort(key=lambda r: (-(r["start_time"] or 0), -r["job_id"]))
    reports = [job_report(db, r["job_id"], slowdown_limit=slowdown_limit, now=now) for r in rows[:limit]]
    return {"user": user, "since": since, "until": until, "state": state, "limit": limit,
            "total": len(rows), "rows": [summary_row(r) for r in reports if r is not None]}


def mail_line(report):
    """One line about a finished job, for its owner's mail (Slurm's MailProg) or an epilog: what it
    used, and the first piece of advice."""
    job, eff = report["job"], report["efficiency"]
    parts = [f"slurm-horus: job {report['job_name']} ({job['name']}) {job['state']} after {hms(job['elapsed_s'])}"]
    util, peak, total = _gpu_summary(report["gpus"])
    if util is not None:
        memory = f", {_mib(peak)} of {_mib(total)} GPU memory" if peak is not None and total else ""
        parts.append(f"GPUs {', '.join(report['gpu_list'])} busy {util:.0f} %{memory}")
    if eff["cpu_eff"] is not None:
        parts.append(f"CPU {eff['cpu_eff']:.0f} % of {eff['n_cpus']} core{'s' if eff['n_cpus'] != 1 else ''}")
    if eff["mem_eff"] is not None:
        parts.append(f"memory {eff['mem_eff']:.0f} % of {_mib(eff['mem_mb'])}")
    if eff["time_eff"] is not None:
        parts.append(f"{eff['time_eff']:.0f} % of its {hms(eff['time_limit_min'] * 60)} time limit")
    line = "; ".join(parts) + "."
    if report["notes"]:
        line += " Advice: " + report["notes"][0]["advice"]
    return line


def array_mail_line(array):
    """One line about a whole job array (its base id named at job end)."""
    states = ", ".join(f"{count} {state}" for state, count in array["states"].items())
    parts = [f"slurm-horus: array {array['array_job_id']}: {len(array['tasks'])} tasks ({states})",
             f"{array['gpu_hours']:.2f} GPU-hours"]
    if array["cpu_eff"] is not None:
        parts.append(f"CPU {array['cpu_eff']:.0f} %")
    flagged = sorted({flag for task in array["tasks"] for flag in task["flags"]})
    line = "; ".join(parts) + "."
    if flagged:
        line += f" Flags: {', '.join(flagged)} (`horus report job {array['array_job_id']}` says more)."
    return line


GROUP_COLUMNS = {"users": "user", "accounts": "account", "partitions": "partition"}


def group_report(db, by, since=None, until=None, slowdown_limit=1.5, now=None, user=None):
    """GPU-hours allocated/used, mean utilization, GPU-hours saved by sharing, jobs hurt, per group.

    Allocated GPU-hours: elapsed x GPUs (a shard job counts its one GPU: it held a slice of it).
    Used: allocated x mean SM utilization where the collector measured it. Saved: each GPU-second a
    job shared with another job saves half a GPU-second for each (the GPU would otherwise have been
    needed twice; with more than two sharers this undercounts).
    """
    now = int(now if now is not None else time.time())
    column = GROUP_COLUMNS[by]
    fields = ("job_id", "start_time", "end_time", "nodes", "gpu_indices", "n_gpus", "shards", column)
    jobs = [j for j in jobs_since(db, since, until, fields=fields, where="user = ?" if user else "",
                                  params=[user] if user else []) if holds_gpus(j)]
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
    return {"by": by, "since": since, "until": until, "user": user, "rows": rows}


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
