"""``horus job-env``: the sub-batching horus chose for the running job, as shell exports.

SJF-BSBF may place a job beside another only with a smaller per-step batch and gradient
accumulation (same global batch). A job placed at submission gets HORUS_MICRO_BATCH and
HORUS_GRAD_ACCUM in its environment (job_submit.lua, horus-sbatch). A job horusd kept for its queue
and placed later cannot have its environment changed (``scontrol update`` has no such field); its
decision is in its AdminComment token (``micro_batch=`` ``grad_accum=``, written by the mover). The
job script runs ``eval "$(horus job-env)"`` before training, and reads the two variables either way
(docs/horus-sbatch.md).
"""

import os
import re

import click

from ..errors import HorusError
from ..slurm.queries import squeue
from ..slurm.runner import SlurmCommandError
from ..tokens import parse_horus_tokens, sub_batching

NAMES = ("HORUS_MICRO_BATCH", "HORUS_GRAD_ACCUM")


def sub_batching_of(job_id, environ, read_queue=squeue):
    """(micro_batch, grad_accum) for the job, or None when it runs as submitted: the environment
    first (set at submission), else the job's token (placed from horusd's queue)."""
    found = sub_batching({"micro_batch": environ.get(NAMES[0], ""), "grad_accum": environ.get(NAMES[1], "1")})
    if found:
        return found
    jobs = [j for j in read_queue(job_ids=[job_id]) if str(j.job_id) == str(job_id)]
    if not jobs:
        return None
    _decision, fields = parse_horus_tokens(jobs[0].admin_comment)
    return sub_batching(fields)


@click.command("job-env")
@click.option("--job", "job_id", default=None, help="Job id (default: $SLURM_JOB_ID).")
def job_env(job_id):
    """Print `export HORUS_MICRO_BATCH=.. HORUS_GRAD_ACCUM=..` for the job (nothing when it runs
    as submitted). In a job script: eval "$(horus job-env)"."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"\d+(_\d+)?", job_id or ""):
        raise HorusError("job-env: no job id (run it inside a Slurm job, or pass --job ID)")
    try:
        found = sub_batching_of(job_id, os.environ)
    except SlurmCommandError as exc:
        raise HorusError(f"job-env: cannot read job {job_id} from squeue: {exc}") from None
    if found:
        click.echo(f"export {NAMES[0]}={found[0]} {NAMES[1]}={found[1]}")
