"""Turn sacct output (``--json`` of 22.05, or ``-P``) into rows of the ``jobs`` and ``steps`` tables.

Pure parsing, no Slurm calls: the ingest feeds it what ``slurm_horus.slurm`` (or a saved file)
returns. What each row keeps beyond sacct's own fields:

* ``gres_alloc``: the GRES part of AllocTRES (``gpu:g2=1,gpu=1,shard=2``);
* ``gpu_indices``: which GPUs the job held. sacct prints no IDX, but a site that gives each GPU its
  own GRES type ``gK`` (horus' indexed binding, the local cluster) records ``gres/gpu:gK`` and, when
  ``gres/shard:gK`` is in AccountingStorageTRES, ``gres/shard:gK``; otherwise the ``gpus=`` field of
  a verified ``horus:`` token tells (:func:`apply_decision_token`);
* ``horus_tokens`` / ``horus_id``: the ``horus:`` token of AdminComment. Never of Comment: users
  write that, and a token there would let them claim GPUs and decisions. The ingest keeps the token
  only when its decision is in the history (``collect/ingest.py``);
* ``job_class``: :func:`slurm_horus.jobclass.job_class_of` of the comment (``class=``), the very
  reader horusd uses, and a verified token's class wins; NULL when the class is unknown (such jobs
  run exclusive and teach the model nothing).
"""

import json
import re
import time

from ..errors import InputError
from ..jobclass import UNKNOWN_CLASS, job_class_of
from ..tokens import parse_horus_tokens

TERMINAL_STATES = frozenset(
    ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE", "REVOKED"]
)

_TYPED_INDEX = re.compile(r"^g(\d+)$")

JOB_COLUMNS = (
    "cluster", "job_id", "array_job_id", "array_task_id", "name", "user", "account", "partition",
    "qos", "state", "exit_code", "exit_signal", "submit_time", "start_time", "end_time", "elapsed_s",
    "time_limit_min", "nodes", "n_nodes", "n_cpus", "mem_mb", "n_gpus", "gres_alloc", "gres_req",
    "gpu_indices", "shards", "comment", "admin_comment", "horus_id", "horus_tokens", "job_class",
    "cpu_time_s", "max_rss_mb",
)
STEP_COLUMNS = (
    "cluster", "job_id", "step_id", "name", "state", "exit_code", "exit_signal", "start_time",
    "end_time", "elapsed_s", "nodes", "tres_alloc",
)


def gres_from_tres(entries):
    """AllocTRES GRES entries [(name, type, count)] -> (gres string, n_gpus, shards, indices)."""
    parts, n_gpus, shards, indices = [], 0, 0, set()
    for name, gres_type, count in entries:
        parts.append(f"{name}:{gres_type}={count}" if gres_type else f"{name}={count}")
        if name == "gpu":
            n_gpus = max(n_gpus, count)
        elif name == "shard":
            shards = max(shards, count)
        match = _TYPED_INDEX.match(gres_type or "")
        if match and count > 0 and name in ("gpu", "shard"):
            indices.add(int(match.group(1)))
    return ",".join(sorted(parts)), n_gpus, shards, indices


def _tres_text_entries(text):
    """``cpu=1,gres/gpu:g3=1,gres/gpu=1`` -> [("gpu", "g3", 1), ("gpu", None, 1)] and the rest."""
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


def _indices_text(indices):
    return ",".join(str(i) for i in sorted(indices)) if indices else None


def _gpus_token_indices(value):
    """``n3:2+3`` or ``2,3`` or ``n3:2,n4:0`` (a horus ``gpus=`` token) -> {2, 3} (all nodes)."""
    indices = set()
    for part in re.split(r"[,;]", value or ""):
        part = part.split(":", 1)[-1]
        for item in re.split(r"[+/]", part):
            if item.isdigit():
                indices.add(int(item))
    return indices


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _mem_mb(text):
    """``250M`` / ``4G`` / ``1000K`` -> MB."""
    if not text:
        return None
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", text.strip())
    if not match:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return float(match.group(1)) * scale


def _finish_job_row(row, gres_entries, req_text):
    row.setdefault("cpu_time_s", None)
    row.setdefault("max_rss_mb", None)
    gres_text, n_gpus, shards, indices = gres_from_tres(gres_entries)
    decision_id, tokens = parse_horus_tokens(row["admin_comment"])  # users write Comment: never from there
    row.update(
        gres_alloc=gres_text or None,
        gres_req=req_text or None,
        n_gpus=n_gpus,
        shards=shards,
        gpu_indices=_indices_text(indices),
        horus_id=decision_id,
        horus_tokens=json.dumps(tokens, sort_keys=True) if tokens else None,
        job_class=_known(job_class_of(comment=row["comment"])),
    )
    return row


def apply_decision_token(row):
    """A row whose ``horus:`` token names a decision the history holds: the token's class, and the
    GPUs of its ``gpus=`` field when sacct recorded the allocation but no index (shards)."""
    tokens = json.loads(row["horus_tokens"]) if row.get("horus_tokens") else {}
    if tokens.get("class"):
        row["job_class"] = tokens["class"]
    if not row.get("gpu_indices") and tokens.get("gpus") and (row.get("n_gpus") or row.get("shards")):
        row["gpu_indices"] = _indices_text(_gpus_token_indices(tokens["gpus"]))
    return row


def drop_decision_token(row):
    """A row whose token names no decision the history holds: nothing of it is believed."""
    row["horus_id"] = row["horus_tokens"] = None
    return row


def _known(job_class):
    return None if job_class == UNKNOWN_CLASS else job_class


# --- sacct --json (22.05, openapi dbv0.0.38) -------------------------------------------------

def _get(mapping, *keys, default=None):
    for key in keys:
        if not isinstance(mapping, dict):
            return default
        mapping = mapping.get(key)
    return default if mapping is None else mapping


def _exit(code):
    """``{"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9}}`` -> (code, signal)."""
    if not isinstance(code, dict):
        return None, None
    signal = _get(code, "signal", "signal_id")
    return _int(code.get("return_code")), _int(signal)


def _epoch(value):
    value = _int(value)
    return value if value else None


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
    if isinstance(ident, dict):  # later openapi versions: {"job_id": 12, "step_id": "batch"}
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


def apply_usage(jobs, text):
    """CPU time and MaxRSS from ``sacct -P -n -o JobIDRaw,TotalCPU,MaxRSS`` (the ``sacct -P`` path;
    the JSON carries them in its steps): TotalCPU of the job line, the largest MaxRSS of its steps."""
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
    for job in jobs:
        key = str(job["job_id"])
        if cpu.get(key) is not None:
            job["cpu_time_s"] = round(cpu[key], 3)
        if key in rss:
            job["max_rss_mb"] = round(rss[key], 1)


def job_rows_from_json(doc, now=None):
    """Parse a ``sacct --json`` document -> (job rows, step rows) as dicts keyed by column."""
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise InputError("sacct --json output has no 'jobs' list")
    now = int(now if now is not None else time.time())
    jobs, steps = [], []
    for job in doc["jobs"]:
        job_id = _int(job.get("job_id"))
        if job_id is None:
            continue
        cluster = job.get("cluster") or ""
        state = _get(job, "state", "current", default="UNKNOWN")
        if isinstance(state, list):  # newer openapi prints a list of flags
            state = state[0] if state else "UNKNOWN"
        exit_code, exit_signal = _exit(job.get("exit_code"))
        times = job.get("time") or {}
        gres_entries, other = _json_tres_entries(_get(job, "tres", "allocated"))
        req_gres, _ = _json_tres_entries(_get(job, "tres", "requested"))
        array_job = _int(_get(job, "array", "job_id"))
        row = {
            "cluster": cluster,
            "job_id": job_id,
            "array_job_id": array_job or None,
            "array_task_id": _int(_get(job, "array", "task_id")),
            "name": job.get("name"),
            "user": job.get("user") or _get(job, "association", "user"),
            "account": job.get("account") or _get(job, "association", "account"),
            "partition": job.get("partition") or _get(job, "association", "partition"),
            "qos": job.get("qos"),
            "state": str(state),
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
        }
        req_text = gres_from_tres(req_gres)[0]
        row["cpu_time_s"], row["max_rss_mb"] = _json_usage(job.get("steps") or [])
        jobs.append(_finish_job_row(row, gres_entries, req_text))
        for step in job.get("steps") or []:
            step_exit, step_signal = _exit(step.get("exit_code"))
            step_times = step.get("time") or {}
            step_state = step.get("state")
            if isinstance(step_state, list):
                step_state = step_state[0] if step_state else None
            steps.append({
                "cluster": cluster,
                "job_id": job_id,
                "step_id": _json_step_id(step, job_id),
                "name": _get(step, "step", "name"),
                "state": step_state,
                "exit_code": step_exit,
                "exit_signal": step_signal,
                "start_time": _epoch(step_times.get("start")),
                "end_time": _epoch(step_times.get("end")),
                "elapsed_s": _int(step_times.get("elapsed")),
                "nodes": _json_nodes(step.get("nodes")),
                "tres_alloc": _json_tres_text(_get(step, "tres", "allocated")) or None,
            })
    return jobs, steps


def apply_exit_codes(jobs, steps, text):
    """Overwrite exit codes with those of ``sacct -P -n -o JobIDRaw,ExitCode`` output.

    Slurm 22.05's ``sacct --json`` reports ``return_code: 0`` (status SUCCESS) for a job or step that
    exited 3 and is FAILED (seen on 22.05.8; ``-P`` prints ``3:0``), so the JSON path takes exit
    codes from this second, cheap query.
    """
    codes = {}
    for line in text.splitlines():
        raw_id, sep, exit_text = line.strip().partition("|")
        if sep:
            codes[raw_id] = _parsable_exit(exit_text)
    for job in jobs:
        found = codes.get(str(job["job_id"]))
        if found and found[0] is not None:
            job["exit_code"], job["exit_signal"] = found
    for step in steps:
        found = codes.get(f"{step['job_id']}.{step['step_id']}")
        if found and found[0] is not None:
            step["exit_code"], step["exit_signal"] = found


# --- sacct -P (any version) ---------------------------------------------------------------------

# AdminComment and Comment are free text, so they come last and a delimiter no comment is likely to
# hold separates the fields; a comment holding it would only merge into the last field.
PARSABLE_FIELDS = (
    "JobID", "JobIDRaw", "Cluster", "JobName", "User", "Account", "Partition", "QOS", "State",
    "ExitCode", "Submit", "Start", "End", "ElapsedRaw", "TimelimitRaw", "NodeList", "NNodes",
    "AllocTRES", "ReqTRES", "AdminComment", "Comment",
)
PARSABLE_DELIMITER = "|%|"


def _parsable_time(text):
    text = (text or "").strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _parsable_exit(text):
    code, _, signal = (text or "").partition(":")
    return _int(code), _int(signal)


def job_rows_from_parsable(text, source="sacct -P"):
    """Parse ``sacct -P --delimiter=PARSABLE_DELIMITER -n -o PARSABLE_FIELDS`` output."""
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
        exit_code, exit_signal = _parsable_exit(f["ExitCode"])
        gres_entries, other = _tres_text_entries(f["AllocTRES"])
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
        row = {
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
        }
        req_gres, _ = _tres_text_entries(f["ReqTRES"])
        req_text = gres_from_tres(req_gres)[0]
        jobs.append(_finish_job_row(row, gres_entries, req_text))
    return jobs, steps
