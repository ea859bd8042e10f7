"""sacct's job and step records, read from ``sacct --json`` (any supported version) or ``sacct -P``.

The one reader of a sacct record: :func:`read_sacct_json` and :func:`read_sacct_parsable` give the
same plain dicts (the history's column names), which ``collect/records.py`` completes with what
slurm-horus derives (GPU indices, ``horus:`` tokens, job class) and :func:`.parse.parse_sacct` turns
into :class:`~.parse.AcctJob` records. A job dict carries its GRES as ``gres_entries`` and
``req_gres_entries``: lists of (name, type or None, count).

Per version (the wrapped numbers are already unwrapped by :func:`.openapi.loads`):

* 22.05 (``dbv0.0.38``): ``state.current`` a string; ``exit_code.signal.signal_id``; the time limit of
  a job without one is the partition's (``525600`` for INFINITE); ``comment`` values ``null``.
* 24.11 / 26.05: ``state.current`` and step ``state`` lists; ``exit_code.signal.id``; ``time.limit``
  and step ``time.start``/``time.end`` wrapped (an unlimited job's limit is ``infinite``: NULL here,
  as ``sacct -P`` prints ``UNLIMITED``); empty strings for unset comments.
"""

import re
import time

from ..errors import InputError
from .openapi import job_state, loads, whole

# AdminComment and Comment are free text, so they come last and a delimiter no comment is likely to
# hold separates the fields; a comment holding it would only merge into the last field.
PARSABLE_FIELDS = (
    "JobID", "JobIDRaw", "Cluster", "JobName", "User", "Account", "Partition", "QOS", "State",
    "ExitCode", "Submit", "Start", "End", "ElapsedRaw", "TimelimitRaw", "NodeList", "NNodes",
    "AllocTRES", "ReqTRES", "AdminComment", "Comment",
)
PARSABLE_DELIMITER = "|%|"


def _int(value, default=None):
    number = whole(value)
    return default if number is None else number


def _get(mapping, *keys, default=None):
    for key in keys:
        if not isinstance(mapping, dict):
            return default
        mapping = mapping.get(key)
    return default if mapping is None else mapping


def _exit(code):
    """``{"status": .., "return_code": 0, "signal": {"signal_id": 9}}`` (22.05; ``"id"`` later) ->
    (code, signal)."""
    if not isinstance(code, dict):
        return None, None
    signal = _get(code, "signal", "signal_id")
    if signal is None:
        signal = _get(code, "signal", "id")
    return _int(code.get("return_code")), _int(signal)


def _epoch(value):
    value = _int(value)
    return value if value else None


def _mem_mb(text):
    """``250M`` / ``4G`` / ``1000K`` -> MB."""
    if not text:
        return None
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", text.strip())
    if not match:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return float(match.group(1)) * scale


def tres_text_entries(text):
    """``cpu=1,gres/gpu:g3=1,gres/gpu=1`` -> ([("gpu", "g3", 1), ("gpu", None, 1)], {"cpu": "1"})."""
    gres, other = [], {}
    for part in (text or "").split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key.startswith("gres/"):
            name, _, gres_type = key[len("gres/"):].partition(":")
            gres.append((name, gres_type or None, _int(value)))
        else:
            other[key] = value
    return gres, other


def _json_tres_entries(items):
    gres, other = [], {}
    for item in items or []:
        kind = item.get("type")
        if kind == "gres":
            name, _, gres_type = str(item.get("name") or "").partition(":")
            gres.append((name, gres_type or None, _int(item.get("count"), 0)))
        elif kind:
            other[kind] = item.get("count")
    return gres, other


def _json_tres_text(items):
    """TRES list -> sacct's text form (``cpu=1,gres/gpu:g0=1,mem=250M``), keys sorted."""
    parts = []
    for item in items or []:
        key = item.get("type") if not item.get("name") else f"{item['type']}/{item['name']}"
        count = item.get("count")
        parts.append(f"{key}={count}M" if key == "mem" and count is not None else f"{key}={count}")
    return ",".join(sorted(parts))


def _json_nodes(value):
    if isinstance(value, dict):
        value = value.get("range") or ",".join(value.get("list") or [])
    if not value or value in ("None assigned", "(null)"):
        return None
    return value


def _json_step_id(step, job_id):
    ident = _get(step, "step", "id")
    if isinstance(ident, dict):  # some openapi versions: {"job_id": 12, "step_id": "batch"}
        ident = ident.get("step_id")
    ident = str(ident if ident is not None else _get(step, "step", "name", default="?"))
    prefix = f"{job_id}."
    return ident[len(prefix):] if ident.startswith(prefix) else ident


def _json_usage(steps):
    """(CPU seconds, largest resident memory in MB) of a job from its steps, as seff reads them:
    TotalCPU is the sum of the steps' user + system time, MaxRSS the largest step maximum."""
    micros, rss = None, None
    for step in steps:
        total = _get(step, "time", "total")
        if isinstance(total, dict) and (total.get("seconds") is not None or total.get("microseconds") is not None):
            micros = (micros or 0) + _int(total.get("seconds"), 0) * 1000000 + _int(total.get("microseconds"), 0)
        for item in _get(step, "tres", "requested", "max") or []:
            if item.get("type") == "mem" and _int(item.get("count")) is not None:
                rss = max(rss or 0.0, _int(item.get("count")) / (1024.0 * 1024.0))
    # milliseconds, cut as sacct prints TotalCPU (so the sacct -P path reads the same number)
    cpu = round(micros // 1000 / 1000.0, 3) if micros is not None else None
    return cpu, (round(rss, 1) if rss is not None else None)


def read_sacct_json(doc):
    """A ``sacct --json`` document (text, or decoded) -> (job dicts, step dicts)."""
    doc = loads(doc, "sacct", "jobs")
    jobs, steps = [], []
    for job in doc["jobs"]:
        job_id = _int(job.get("job_id"))
        if job_id is None:
            continue
        cluster = job.get("cluster") or ""
        exit_code, exit_signal = _exit(job.get("exit_code"))
        times = job.get("time") or {}
        gres_entries, other = _json_tres_entries(_get(job, "tres", "allocated"))
        req_gres, _ = _json_tres_entries(_get(job, "tres", "requested"))
        cpu_time_s, max_rss_mb = _json_usage(job.get("steps") or [])
        jobs.append({
            "cluster": cluster,
            "job_id": job_id,
            "array_job_id": _int(_get(job, "array", "job_id")) or None,
            "array_task_id": _int(_get(job, "array", "task_id")),
            "name": job.get("name"),
            "user": job.get("user") or _get(job, "association", "user"),
            "account": job.get("account") or _get(job, "association", "account"),
            "partition": job.get("partition") or _get(job, "association", "partition"),
            "qos": job.get("qos"),
            "state": job_state(_get(job, "state", "current"), "UNKNOWN"),
            "exit_code": exit_code,
            "exit_signal": exit_signal,
            "submit_time": _epoch(times.get("submission")),
            "start_time": _epoch(times.get("start")),
            "end_time": _epoch(times.get("end")),
            "elapsed_s": _int(times.get("elapsed")),
            "time_limit_min": _int(times.get("limit")),
            "nodes": _json_nodes(job.get("nodes")),
            "n_nodes": _int(job.get("allocation_nodes")),
            "n_cpus": _int(other.get("cpu")),
            "mem_mb": float(other["mem"]) if _int(other.get("mem")) is not None else None,
            "comment": _get(job, "comment", "job") or None,
            "admin_comment": _get(job, "comment", "administrator") or None,
            "cpu_time_s": cpu_time_s,
            "max_rss_mb": max_rss_mb,
            "gres_entries": gres_entries,
            "req_gres_entries": req_gres,
        })
        for step in job.get("steps") or []:
            step_exit, step_signal = _exit(step.get("exit_code"))
            step_times = step.get("time") or {}
            steps.append({
                "cluster": cluster,
                "job_id": job_id,
                "step_id": _json_step_id(step, job_id),
                "name": _get(step, "step", "name"),
                "state": job_state(step.get("state"), None),
                "exit_code": step_exit,
                "exit_signal": step_signal,
                "start_time": _epoch(step_times.get("start")),
                "end_time": _epoch(step_times.get("end")),
                "elapsed_s": _int(step_times.get("elapsed")),
                "nodes": _json_nodes(step.get("nodes")),
                "tres_alloc": _json_tres_text(_get(step, "tres", "allocated")) or None,
            })
    return jobs, steps


def _parsable_time(text):
    text = (text or "").strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parsable_exit(text):
    """``3:0`` -> (3, 0)."""
    code, _, signal = (text or "").partition(":")
    return _int(code), _int(signal)


def _parsable_seconds(text):
    """sacct's TotalCPU: ``[D-][HH:]MM:SS[.mmm]`` -> seconds; None when empty."""
    text = (text or "").strip()
    if not text:
        return None
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    try:
        seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(parts)))
        return seconds + (int(days) * 86400 if days else 0)
    except ValueError:
        return None


def read_sacct_usage(text):
    """``sacct -P -n -o JobIDRaw,TotalCPU,MaxRSS`` output -> ({job id: CPU seconds of the job line},
    {job id: largest MaxRSS in MB of its lines})."""
    cpu, rss = {}, {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3:
            continue
        job_id = fields[0].split(".")[0]
        if "." not in fields[0]:
            cpu[job_id] = _parsable_seconds(fields[1])
        memory = _mem_mb(fields[2])
        if memory is not None:
            rss[job_id] = max(rss.get(job_id, 0.0), memory)
    return cpu, rss


def parsable_exit_codes(text):
    """``sacct -P -n -o JobIDRaw,ExitCode`` output -> {"12": (3, 0), "12.batch": (3, 0)}."""
    codes = {}
    for line in text.splitlines():
        raw_id, sep, exit_text = line.strip().partition("|")
        if sep:
            codes[raw_id] = parsable_exit(exit_text)
    return codes


def read_sacct_parsable(text, source="sacct -P"):
    """``sacct -P --delimiter=PARSABLE_DELIMITER -n -o PARSABLE_FIELDS`` output -> (jobs, steps)."""
    jobs, steps = [], []
    width = len(PARSABLE_FIELDS)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        values = line.split(PARSABLE_DELIMITER)
        if len(values) < width:
            raise InputError(f"{source}:{lineno}: expected {width} fields, got {len(values)}")
        if len(values) > width:
            values = values[: width - 1] + [PARSABLE_DELIMITER.join(values[width - 1:])]
        f = dict(zip(PARSABLE_FIELDS, values))
        raw_id = f["JobIDRaw"] or f["JobID"]
        job_part, _, step_part = raw_id.partition(".")
        job_id = _int(job_part)
        if job_id is None:
            raise InputError(f"{source}:{lineno}: bad JobIDRaw {raw_id!r}")
        state = (f["State"].split() or ["UNKNOWN"])[0]
        exit_code, exit_signal = parsable_exit(f["ExitCode"])
        gres_entries, other = tres_text_entries(f["AllocTRES"])
        nodes = f["NodeList"] if f["NodeList"] not in ("", "None assigned") else None
        if step_part:
            steps.append({
                "cluster": f["Cluster"], "job_id": job_id, "step_id": step_part,
                "name": f["JobName"] or None, "state": state, "exit_code": exit_code,
                "exit_signal": exit_signal, "start_time": _parsable_time(f["Start"]),
                "end_time": _parsable_time(f["End"]), "elapsed_s": _int(f["ElapsedRaw"]),
                "nodes": nodes, "tres_alloc": ",".join(sorted(f["AllocTRES"].split(","))) or None,
            })
            continue
        array_job, _, array_task = f["JobID"].partition("_")
        req_gres, _ = tres_text_entries(f["ReqTRES"])
        jobs.append({
            "cluster": f["Cluster"], "job_id": job_id,
            "array_job_id": _int(array_job) if array_task else None,
            "array_task_id": _int(array_task.strip("[]")) if array_task else None,
            "name": f["JobName"] or None, "user": f["User"] or None,
            "account": f["Account"] or None, "partition": f["Partition"] or None,
            "qos": f["QOS"] or None, "state": state, "exit_code": exit_code,
            "exit_signal": exit_signal, "submit_time": _parsable_time(f["Submit"]),
            "start_time": _parsable_time(f["Start"]), "end_time": _parsable_time(f["End"]),
            "elapsed_s": _int(f["ElapsedRaw"]), "time_limit_min": _int(f["TimelimitRaw"]),
            "nodes": nodes, "n_nodes": _int(f["NNodes"]), "n_cpus": _int(other.get("cpu")),
            "mem_mb": _mem_mb(other.get("mem")),
            "comment": f["Comment"] or None, "admin_comment": f["AdminComment"] or None,
            "gres_entries": gres_entries, "req_gres_entries": req_gres,
        })
    return jobs, steps
