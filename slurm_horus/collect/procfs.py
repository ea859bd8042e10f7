"""Which Slurm job a process belongs to, and which jobs hold which GPU, read from ``/proc``.

* PID -> job: ``/proc/PID/cgroup`` (``.../job_123/step_0`` under proctrack/cgroup or task/cgroup),
  else ``SLURM_JOB_ID`` in ``/proc/PID/environ`` (proctrack/linuxproc, the local cluster).
* GPU -> jobs: the job processes' ``SLURM_JOB_GPUS`` (batch), ``SLURM_STEP_GPUS`` (srun) or
  ``GPU_DEVICE_ORDINAL`` (also set for shards). These carry global GPU indices (Slurm 22.05 sets them
  from the allocation, whatever the cgroup device constraint renumbers for CUDA).

Every read tolerates a process that exits in between (it just disappears from the answer).
"""

import re

from ..proc import list_pids, read_environ, read_proc_file

_JOB_IN_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
GPU_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL")


def job_from_cgroup(pid, proc_root="/proc"):
    data = read_proc_file(f"{proc_root}/{pid}/cgroup")
    if not data:
        return None
    match = _JOB_IN_CGROUP.search(data.decode(errors="replace"))
    return int(match.group(1)) if match else None


def job_of_pid(pid, proc_root="/proc"):
    """Slurm job id of ``pid`` or None (not a job process, or gone)."""
    job = job_from_cgroup(pid, proc_root)
    if job is not None:
        return job
    env = read_environ(pid, proc_root)
    if env and env.get("SLURM_JOB_ID", "").isdigit():
        return int(env["SLURM_JOB_ID"])
    return None


def parse_gpu_list(text):
    """``0,2`` / ``1-3`` -> [0, 2] / [1, 2, 3]; anything odd (``NoDevFiles``) -> []."""
    indices = []
    for part in (text or "").split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        if sep and low.isdigit() and high.isdigit():
            indices.extend(range(int(low), int(high) + 1))
        elif part.isdigit():
            indices.append(int(part))
    return indices


def is_ours(env, node=None, slurm_conf=None):
    """Whether a job process (its environment) belongs to this collector's node and cluster.

    Several slurmd of one host (the local cluster, or several local clusters side by side) are told
    apart by the job's ``SLURMD_NODENAME`` and ``SLURM_CONF``; a variable the job lacks never excludes.
    """
    if node and env.get("SLURMD_NODENAME", node) != node:
        return False
    if slurm_conf and env.get("SLURM_CONF", slurm_conf) != slurm_conf:
        return False
    return True


def gpu_holders(node=None, proc_root="/proc", slurm_conf=None):
    """{gpu index: {job id}} of the Slurm jobs running here (on ``node``/``slurm_conf`` when given)."""
    holders = {}
    for pid in list_pids(proc_root):
        env = read_environ(pid, proc_root)
        if not env or not env.get("SLURM_JOB_ID", "").isdigit():
            continue
        if not is_ours(env, node, slurm_conf):
            continue
        for var in GPU_VARS:
            if env.get(var):
                for index in parse_gpu_list(env[var]):
                    holders.setdefault(index, set()).add(int(env["SLURM_JOB_ID"]))
                break
    return holders
