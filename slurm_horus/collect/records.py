"""Turn sacct records (``--json`` of any supported Slurm, or ``-P``) into rows of the ``jobs`` and
``steps`` tables.

No Slurm calls and no reading of Slurm's formats: :mod:`slurm_horus.slurm.acct` reads the records
(what the ingest gets from ``slurm_horus.slurm`` or a saved file); this module adds what slurm-horus
derives. What each row keeps beyond sacct's own fields:

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

from ..errors import InputError
from ..jobclass import UNKNOWN_CLASS, job_class_of
from ..slurm.acct import parsable_exit_codes, read_sacct_json, read_sacct_parsable, read_sacct_usage
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


_SOLO_WORD = re.compile(r"(?:^|[\s,;])solo_s=([0-9]+(?:\.[0-9]*)?)(?=$|[\s,;])")


def declared_solo_s(comment):
    """Seconds the job says it takes alone on its GPUs (``solo_s=N`` in its comment), or None.

    A job that knows its work (a training run of N steps at its class's known solo speed, or the fake
    jobs of ``horus replay``) may say so; the learning loop then measures its slowdown against its
    own solo time instead of its class's median."""
    match = _SOLO_WORD.search(comment or "")
    return float(match.group(1)) if match else None


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


def _rows(jobs):
    rows = []
    for job in jobs:
        gres_entries, req_gres = job.pop("gres_entries"), job.pop("req_gres_entries")
        rows.append(_finish_job_row(job, gres_entries, gres_from_tres(req_gres)[0]))
    return rows


def job_rows_from_json(doc):
    """A ``sacct --json`` document (any supported Slurm) -> (job rows, step rows) keyed by column."""
    if not isinstance(doc, (str, bytes)) and (not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list)):
        raise InputError("sacct --json output has no 'jobs' list")
    jobs, steps = read_sacct_json(doc)
    return _rows(jobs), steps


def job_rows_from_parsable(text, source="sacct -P"):
    """Parse ``sacct -P --delimiter=PARSABLE_DELIMITER -n -o PARSABLE_FIELDS`` output."""
    jobs, steps = read_sacct_parsable(text, source)
    return _rows(jobs), steps


def apply_usage(jobs, text):
    """CPU time and MaxRSS from ``sacct -P -n -o JobIDRaw,TotalCPU,MaxRSS`` (the ``sacct -P`` path;
    the JSON carries them in its steps): TotalCPU of the job line, the largest MaxRSS of its steps."""
    cpu, rss = read_sacct_usage(text)
    for job in jobs:
        key = str(job["job_id"])
        if cpu.get(key) is not None:
            job["cpu_time_s"] = round(cpu[key], 3)
        if key in rss:
            job["max_rss_mb"] = round(rss[key], 1)


def apply_exit_codes(jobs, steps, text):
    """Overwrite exit codes with those of ``sacct -P -n -o JobIDRaw,ExitCode`` output.

    Slurm 22.05's ``sacct --json`` reports ``return_code: 0`` (status SUCCESS) for a job or step that
    exited 3 and is FAILED (seen on 22.05.8; ``-P`` prints ``3:0``), so the JSON path takes exit
    codes from this second, cheap query.
    """
    codes = parsable_exit_codes(text)
    for job in jobs:
        found = codes.get(str(job["job_id"]))
        if found and found[0] is not None:
            job["exit_code"], job["exit_signal"] = found
    for step in steps:
        found = codes.get(f"{step['job_id']}.{step['step_id']}")
        if found and found[0] is not None:
            step["exit_code"], step["exit_signal"] = found
