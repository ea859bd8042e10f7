"""Ask Slurm: run a CLI with ``--json`` and parse it. Used by the local cluster and by horusd.

``slurm_conf=None`` uses the caller's ``SLURM_CONF`` (or Slurm's default), as on a real site.
"""

from .parse import parse_sacct, parse_sinfo, parse_squeue
from .runner import run_slurm


def sinfo(slurm_conf=None, timeout=10.0):
    """[NodeInfo] of every node."""
    return parse_sinfo(run_slurm(["sinfo", "--json"], slurm_conf=slurm_conf, timeout=timeout).stdout)


def squeue(slurm_conf=None, timeout=10.0, job_ids=None):
    """[QueueJob] of the jobs slurmctld lists (pending, running, completing); only ``job_ids`` when given."""
    argv = ["squeue", "--json"]
    if job_ids:
        argv += ["--jobs", ",".join(str(j) for j in job_ids)]
    return parse_squeue(run_slurm(argv, slurm_conf=slurm_conf, timeout=timeout).stdout)


def sacct(job_ids=None, slurm_conf=None, all_users=True, extra_args=(), timeout=30.0):
    """[AcctJob] from accounting, for ``job_ids`` (default: sacct's default window)."""
    argv = ["sacct", "--json"]
    if all_users:
        argv.append("--allusers")
    if job_ids:
        argv += ["--jobs", ",".join(str(j) for j in job_ids)]
    argv += list(extra_args)
    return parse_sacct(run_slurm(argv, slurm_conf=slurm_conf, timeout=timeout).stdout)


def submit_batch(args, script, slurm_conf=None, timeout=30.0):
    """``sbatch --parsable args`` with ``script`` on stdin; return the job id."""
    result = run_slurm(["sbatch", "--parsable", *args], slurm_conf=slurm_conf, timeout=timeout, input=script)
    return int(result.stdout.strip().split(";")[0])
