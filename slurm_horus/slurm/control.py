"""Change pending jobs with ``scontrol update`` (what horusd does to the jobs it keeps).

Two forms, measured on 22.05.8 (docs/horusd.md):

* :func:`update_job`: one job, one ``scontrol`` process, arguments passed as argv, so a value may
  hold spaces (an AdminComment token). About 10-20 ms per call on a small VM (process start, munge).
* :func:`update_many`: many ``update`` lines through one ``scontrol`` reading stdin. scontrol keeps
  quotes literally in this mode and splits on spaces, so values must be single words. A ``jobid=``
  list becomes one RPC per job (about 0.25 ms each inside slurmctld, ~2 ms each for the client).
  One failing line does not stop the others; scontrol prints one error line per failed job.
"""

import re

from .runner import SlurmCommandError, run_slurm

_WORD = re.compile(r"^[^\s\"']*\Z")
_FAILED_JOB = re.compile(r"\bjob(?:id)?[ =]+(\d+)", re.IGNORECASE)


def _field(key, value):
    return f"{key}={value}"


def update_job(job_id, fields, slurm_conf=None, timeout=10.0):
    """``scontrol update jobid=J Key=Value ...`` (fields in the given order); raises
    SlurmCommandError when scontrol refuses."""
    argv = ["scontrol", "update", f"jobid={int(job_id)}"] + [_field(k, v) for k, v in fields.items()]
    run_slurm(argv, slurm_conf=slurm_conf, timeout=timeout)


def update_many(updates, slurm_conf=None, timeout=30.0):
    """Apply ``[(job ids, {Key: Value})]`` through one scontrol reading stdin; returns the job ids
    scontrol reported a failure for (an unreadable report: all of them). Values must be words."""
    lines, wanted = [], set()
    for job_ids, fields in updates:
        ids = [int(j) for j in job_ids]
        if not ids:
            continue
        for key, value in fields.items():
            if not _WORD.match(str(value)):
                raise ValueError(f"{key}={value!r}: scontrol's stdin form takes single words only")
        lines.append(" ".join([f"update jobid={','.join(str(j) for j in ids)}"] +
                              [_field(k, v) for k, v in fields.items()]))
        wanted.update(ids)
    if not lines:
        return set()
    try:
        result = run_slurm(["scontrol"], slurm_conf=slurm_conf, timeout=timeout, check=False,
                           input="\n".join(lines) + "\n")
    except SlurmCommandError:
        return wanted
    if result.returncode == 0:
        return set()
    failed = {int(m.group(1)) for m in _FAILED_JOB.finditer(result.stderr or "")}
    return failed & wanted if failed else wanted
