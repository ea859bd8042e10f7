"""Turn sacct records (``--json`` of any supported Slurm, or ``-P``) into rows of the ``jobs`` and
``steps`` tables.

No Slurm calls and no reading of Slurm's formats: :mod:`slurm_horus.slurm.acct` reads the records
(what the ingest gets from ``slurm_horus.slurm`` or a saved file); this module adds what slurm-horus
derives. What each row keeps beyond sacct's own fields:

* ``gres_alloc``: the GRES part of AllocTRES (``gpu:g2=1,gpu=1,shard=2``);
* ``gpu_indices``: which GPUs the job held. sacct prints no IDX, but a site that gives each GPU its
  own GRES type ``gK`` (horus' indexed binding, the local cluster) records ``gres/gpu:gK`` and, when
  ``gres/shard:gK`` is in AccountingStorageTRES, ``gres/shard:gK``; otherwise a ``gpus=`` token of
  the ``horus:`` admin comment tells;
* ``horus_tokens`` / ``horus_id``: the ``horus:`` tokens of AdminComment and Comment;
* ``job_class``: ``class=`` token (horus: or plain comment), else the job name.
"""

import json
import re

from ..errors import InputError
from ..slurm.acct import (  # noqa: F401 (PARSABLE_*: the ingest's sacct -P call names them)
    PARSABLE_DELIMITER, PARSABLE_FIELDS, parsable_exit_codes, read_sacct_json, read_sacct_parsable,
)
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
)
STEP_COLUMNS = (
    "cluster", "job_id", "step_id", "name", "state", "exit_code", "exit_signal", "start_time",
    "end_time", "elapsed_s", "nodes", "tres_alloc",
)


_CLASS_WORD = re.compile(r"(?:^|[\s,;])class=([A-Za-z0-9._+-]+)")


def job_class_of(name, comment, admin_comment, tokens):
    """Class of a job: horus token ``class=``, else ``class=`` in the comment, else the job name."""
    if tokens.get("class"):
        return tokens["class"]
    for text in (comment, admin_comment):
        match = _CLASS_WORD.search(text or "")
        if match:
            return match.group(1)
    return name or None


def gres_from_tres(entries):
    """AllocTRES GRES entries [(name, type, count)] -> (gres string, n_gpus, shards, indices)."""
    parts, n_gpus, shards, indices = [], 0, 0, set()
    for name, gres_type, count in entries:
        parts.append(f"{name}:{gres_type}={count}" if gres_type else f"{name}={count}")
        if gres_type is None:
            if name == "gpu":
                n_gpus = max(n_gpus, count)
            elif name == "shard":
                shards = max(shards, count)
        else:
            match = _TYPED_INDEX.match(gres_type)
            if match and count > 0 and name in ("gpu", "shard"):
                indices.add(int(match.group(1)))
            if name == "gpu":
                n_gpus = max(n_gpus, count)
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
    gres_text, n_gpus, shards, indices = gres_from_tres(gres_entries)
    decision_id, tokens = parse_horus_tokens(row["admin_comment"], row["comment"])
    if not indices and tokens.get("gpus"):
        indices = _gpus_token_indices(tokens["gpus"])
    row.update(
        gres_alloc=gres_text or None,
        gres_req=req_text or None,
        n_gpus=n_gpus,
        shards=shards,
        gpu_indices=_indices_text(indices),
        horus_id=decision_id,
        horus_tokens=json.dumps(tokens, sort_keys=True) if tokens else None,
        job_class=job_class_of(row["name"], row["comment"], row["admin_comment"], tokens),
    )
    return row


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
