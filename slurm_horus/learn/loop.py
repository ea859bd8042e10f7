"""The learning loop: co-location observations from history, and refitting the interference model.

Observation rule (elapsed-time method). A job of class C that ran for T seconds, of which it shared
its GPU for t2 seconds with jobs of one co-runner class K, and that would have taken T_solo alone,
progressed at speed 1 alone and at speed x while sharing:
``(T - t2) + x * t2 = T_solo``, so ``x = 1 - (T - T_solo) / t2``, the normalized throughput the
interference model predicts (``slurm_horus.interference.base``). T_solo is the job's own solo time
when it declares one (``solo_s=`` in its comment, ``collect/records.declared_solo_s``) plus the
site's per-job overhead (the mean of elapsed minus declared over the declaring jobs that ran alone),
else the median elapsed time of the solo runs of class C (right when a class's jobs do the same
work). Only completed jobs count, only when every co-runner is of one class, and only when the
shared part is at least MIN_SHARED_FRACTION of the run and MIN_SHARED_S long (a short overlap says
little: sacct's times are whole seconds, so x is off by up to about 1 s / t2). The per-process utilization while sharing vs solo is kept
alongside (``util_shared`` / ``util_solo``) as a second, independent sign of interference.

Only what Slurm and the collector vouch for is learned from (issue 15): jobs for which sacct
recorded a GPU or shard allocation and that the collector sampled on a GPU. Their class is what the
user declared (``class=`` in the comment), so before a refit takes effect the observations of each
pair are screened (:func:`screen_observations`): one far from the others is an outlier and dropped;
each user has one vote (the median of their observations); and a pair that Gavel measured is not
moved further than MAX_ONE_USER_SHIFT by the observations of a single user (held, and listed).

Refit: the chosen predictor (default ``chain``) is fitted on the built-in priors plus the screened local
observations (and local solo profiles from the collector), stored in ``models`` (store/models.py, the newest row is in force) with its error on the
local observations before (the previously active model, or priors only) and after.
"""

import statistics
import time
from collections import defaultdict

from ..collect.records import declared_solo_s
from ..store.db import transaction
from ..store.models import load_model, save_model
from ..store.queries import co_runs, holds_gpus, jobs_since, sampled_gpus

MIN_SHARED_FRACTION = 0.2
MIN_SHARED_S = 10
MIN_NORM_TPUT = 0.02
OUTLIER_MADS = 3.0  # an observation further than this many (scaled) MADs from its pair's median ...
OUTLIER_MIN_GAP = 0.1  # ... and at least this far is an outlier (a pair needs 3 observations for it)
MAX_ONE_USER_SHIFT = 0.25  # how far one user's observations may move a pair Gavel measured

_KNOWN_GPU_NAMES = ("h200", "h100", "a100", "a40", "a30", "a10", "l40s", "l4", "v100", "p100", "t4",
                    "k80", "rtx4090", "rtx3090", "rtx2080ti")


def gpu_type_from_name(name, default):
    """NVML device name -> the interference model's GPU type (``Tesla V100-SXM2-16GB`` -> v100)."""
    squeezed = (name or "").lower().replace(" ", "").replace("-", "")
    for known in _KNOWN_GPU_NAMES:
        if known in squeezed:
            return known
    return default


def _gpu_types_by_node(db, default):
    types = {}
    for node, name in db.execute("SELECT node, max(gpu_name) FROM gpus GROUP BY node"):
        types[node] = gpu_type_from_name(name, default)
    return types


def _mean_util(db, job_id, shared):
    row = db.execute("SELECT sum(sm_sum) / sum(sm_n) FROM job_gpu_summary WHERE job_id = ? AND shared = ? "
                     "AND sm_n > 0", [job_id, int(shared)]).fetchone()
    return row[0]


def derive_observations(db, default_gpu_type="v100", since=None, now=None, replace=True):
    """Derive and store co-location observations; returns the list of derived rows (dicts).

    ``since``: only from the jobs that ran since then (solo times too). ``replace=False`` keeps the
    rows stored for a job already (horusd's feed: what the last derivation over the whole history
    found stays until the next one)."""
    now = int(now if now is not None else time.time())
    jobs = [j for j in jobs_since(db, since) if j["end_time"] and holds_gpus(j)]
    sampled = sampled_gpus(db, [j["job_id"] for j in jobs])
    jobs = [j for j in jobs if j["job_id"] in sampled]  # learn only from what the collector saw
    pairs = co_runs(jobs, sampled, now)
    by_id = {j["job_id"]: j for j in jobs}
    partners = defaultdict(dict)
    for (a, b), entry in pairs.items():
        partners[a][b] = entry
        partners[b][a] = entry
    good = [j for j in jobs if j["state"] == "COMPLETED" and j["job_class"] and j["elapsed_s"]]
    declared = {j["job_id"]: declared_solo_s(j.get("comment")) for j in good}
    solo, solo_util, overheads = defaultdict(list), defaultdict(list), []
    for job in good:
        if job["job_id"] not in partners:
            solo[job["job_class"]].append(job["elapsed_s"])
            if declared[job["job_id"]] is not None:
                overheads.append(job["elapsed_s"] - declared[job["job_id"]])
            util = _mean_util(db, job["job_id"], False)
            if util is not None:
                solo_util[job["job_class"]].append(util)
    overhead = statistics.mean(overheads) if overheads else 0.0
    node_types = _gpu_types_by_node(db, default_gpu_type)
    rows = []
    for job in good:
        mine = partners.get(job["job_id"])
        own = declared[job["job_id"]]
        if not mine or (own is None and job["job_class"] not in solo):
            continue
        classes = {by_id[o]["job_class"] for o in mine}
        if len(classes) != 1 or None in classes:
            continue
        total = job["elapsed_s"]
        solo_time = own + overhead if own is not None else statistics.median(solo[job["job_class"]])
        shared = min(total, sum(entry["overlap_s"] for entry in mine.values()))
        if shared < MIN_SHARED_FRACTION * total or shared < MIN_SHARED_S:
            continue
        norm = 1.0 - (total - solo_time) / shared
        norm = max(MIN_NORM_TPUT, min(1.0, norm))
        gpu = next(iter(next(iter(mine.values()))["gpus"]))
        for other_id in mine:
            rows.append({
                "cluster": job["cluster"], "job_id": job["job_id"], "corunner_job_id": other_id,
                "gpu_type": node_types.get(gpu[0], default_gpu_type), "job_class": job["job_class"],
                "corunner_class": by_id[other_id]["job_class"], "norm_tput": round(norm, 4),
                "overlap_s": mine[other_id]["overlap_s"], "elapsed_s": total, "solo_elapsed_s": solo_time,
                "util_shared": _mean_util(db, job["job_id"], True),
                "util_solo": statistics.mean(solo_util[job["job_class"]]) if solo_util[job["job_class"]] else None,
                "derived_at": now,
            })
    with transaction(db) as conn:
        if since is None:  # derived from the whole history: what an older rule derived goes
            conn.execute("DELETE FROM observations")
        if rows:
            columns = list(rows[0])
            sql = "INSERT OR {} INTO observations ({}) VALUES ({})".format(
                "REPLACE" if replace else "IGNORE", ", ".join(columns), ", ".join("?" * len(columns)))
            conn.executemany(sql, [tuple(r[c] for c in columns) for r in rows])
    return rows


def _stored_observations(db):
    """Every stored observation with the user of its job."""
    fields = ("gpu_type", "job_class", "corunner_class", "norm_tput", "job_id", "user")
    rows = db.execute(
        "SELECT o.gpu_type, o.job_class, o.corunner_class, o.norm_tput, o.job_id, j.user FROM observations o "
        "LEFT JOIN jobs j ON j.cluster = o.cluster AND j.job_id = o.job_id ORDER BY 1, 2, 3, 5").fetchall()
    return [dict(zip(fields, row)) for row in rows]


def _measured_priors():
    from ..interference import builtin_priors

    return {(o.gpu_type, o.job_class, o.corunner_class): o.norm_tput for o in builtin_priors()[1]}


def screen_observations(rows, measured):
    """Observations (dicts: gpu_type, job_class, corunner_class, norm_tput, user) -> (one Observation per
    pair, rejected outliers, held pairs); see the module docstring. ``measured``: {(gpu type, class,
    co-runner): norm_tput} of the priors."""
    from ..interference import Observation

    groups = defaultdict(list)
    for row in rows:
        groups[(row["gpu_type"], row["job_class"], row["corunner_class"])].append(row)
    observations, rejected, held = [], [], []
    for key, members in sorted(groups.items()):
        if len(members) >= 3:
            center = statistics.median(m["norm_tput"] for m in members)
            spread = 1.4826 * statistics.median(abs(m["norm_tput"] - center) for m in members)
            limit = max(OUTLIER_MADS * spread, OUTLIER_MIN_GAP)
            far = [m for m in members if abs(m["norm_tput"] - center) > limit]
            rejected += [dict(m, why=f"outlier: {center:.3f} is the median of {len(members)}") for m in far]
            members = [m for m in members if m not in far]
        by_user = defaultdict(list)
        for member in members:
            by_user[member.get("user")].append(member["norm_tput"])
        value = statistics.median(statistics.median(values) for values in by_user.values())
        prior = measured.get(key)
        if prior is not None and len(by_user) < 2 and abs(value - prior) > MAX_ONE_USER_SHIFT:
            held.append({"gpu_type": key[0], "job_class": key[1], "corunner_class": key[2],
                         "observed": round(value, 4), "measured": prior, "users": len(by_user),
                         "observations": len(members)})
            continue
        observations.append(Observation(*key, value))
    return observations, rejected, held


def local_observations(db):
    """The stored observations after screening, one per (gpu type, class, co-runner class)."""
    return screen_observations(_stored_observations(db), _measured_priors())[0]


def local_profiles(db, default_gpu_type="v100"):
    """Solo profiles of local classes from the collector: mean SM/memory utilization, peak memory."""
    from ..interference import SoloProfile

    node_types = _gpu_types_by_node(db, default_gpu_type)
    sql = (
        "SELECT j.job_class, u.node, sum(u.sm_sum) / nullif(sum(u.sm_n), 0), "
        "sum(u.mem_util_sum) / nullif(sum(u.mem_util_n), 0), max(u.mem_max_mb) "
        "FROM job_gpu_summary u JOIN jobs j ON j.job_id = u.job_id "
        "WHERE u.shared = 0 AND j.job_class IS NOT NULL GROUP BY j.job_class, u.node")
    merged = {}
    for job_class, node, sm, mem, peak in db.execute(sql):
        key = (job_class, node_types.get(node, default_gpu_type))
        merged.setdefault(key, []).append((sm, mem, peak))
    profiles = []
    for (job_class, gpu_type), values in sorted(merged.items()):
        sms = [v[0] for v in values if v[0] is not None]
        mems = [v[1] for v in values if v[1] is not None]
        peaks = [v[2] for v in values if v[2] is not None]
        profiles.append(SoloProfile(
            job_class=job_class, gpu_type=gpu_type,
            gpu_util=statistics.mean(sms) if sms else None,
            mem_util=statistics.mean(mems) if mems else None,
            gmem_mb=max(peaks) if peaks else None,
        ))
    return profiles


def active_model(db):
    """The model in force (the newest stored one) as a fitted predictor, or None."""
    from ..interference import model_from_dict

    stored = load_model(db)
    return None if stored is None else model_from_dict(stored[3])


def refit(db, predictor="chain", default_gpu_type="v100", derive=True, now=None):
    """Derive observations, refit ``predictor`` on priors + local data, store it as the active model.

    Returns {"model_id", "n_observations", "before": score, "after": score, "pairs": [...]} where a
    score is interference.evaluate's dict (MAE, RMSE, ...) on the local observations.
    """
    from ..interference import build_model, builtin_priors
    from ..interference.evaluate import evaluate, predict_observations

    now = int(now if now is not None else time.time())
    if derive:
        derive_observations(db, default_gpu_type, now=now)
    prior_profiles, prior_observations = builtin_priors()
    observations, rejected, held = screen_observations(
        _stored_observations(db), {(o.gpu_type, o.job_class, o.corunner_class): o.norm_tput
                                   for o in prior_observations})
    before_model = active_model(db) or build_model(predictor, prior_profiles, prior_observations)
    profiles = _merge_profiles(prior_profiles, local_profiles(db, default_gpu_type))
    after_model = build_model(predictor, profiles, list(prior_observations) + observations)
    result = {"n_observations": len(observations), "predictor": predictor, "held": held,
              "rejected": [{k: r[k] for k in ("gpu_type", "job_class", "corunner_class", "norm_tput", "job_id",
                                              "user", "why")} for r in rejected]}
    if observations:
        result["before"] = evaluate(before_model, observations)
        result["after"] = evaluate(after_model, observations)
        _, was, _ = predict_observations(before_model, observations)
        _, now_pred, _ = predict_observations(after_model, observations)
        result["pairs"] = [
            {"gpu_type": o.gpu_type, "job_class": o.job_class, "corunner_class": o.corunner_class,
             "observed": round(o.norm_tput, 4), "before": round(float(b), 4), "after": round(float(a), 4)}
            for o, b, a in zip(observations, was, now_pred)
        ]
    result["model_id"] = save_model(
        db, predictor, after_model.to_dict(), origin="refit", n_observations=len(observations),
        error_before=result.get("before", {}).get("mae"), error_after=result.get("after", {}).get("mae"))
    return result


def _merge_profiles(priors, local):
    """Priors plus local profiles; a local profile replaces a prior of the same class and GPU type."""
    local_keys = {(p.job_class, p.gpu_type) for p in local}
    return [p for p in priors if (p.job_class, p.gpu_type) not in local_keys] + list(local)
