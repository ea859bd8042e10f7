"""Run one Slurm command line with a clear error when it fails.

Every Slurm CLI call of slurm-horus goes through :func:`run_slurm`, so the ``SLURM_CONF`` of the
cluster in use is always passed (several local clusters may run side by side) and a failure reads
``sbatch failed (exit 1): <stderr>`` instead of a traceback.
"""

import os
import shutil
import subprocess

from ..errors import HorusError

DEFAULT_TIMEOUT_S = 30.0


class SlurmCommandError(HorusError):
    """A Slurm command was missing, timed out or exited non-zero."""

    def __init__(self, message, argv=None, returncode=None, stderr=""):
        super().__init__(message)
        self.argv = list(argv or [])
        self.returncode = returncode
        self.stderr = stderr


def slurm_env(slurm_conf=None, env=None):
    """The environment for a Slurm command: ``env`` (default: ours) with ``SLURM_CONF`` set."""
    merged = dict(os.environ if env is None else env)
    if slurm_conf is not None:
        merged["SLURM_CONF"] = str(slurm_conf)
    return merged


def run_slurm(argv, slurm_conf=None, env=None, timeout=DEFAULT_TIMEOUT_S, check=True, input=None):
    """Run ``argv`` (a Slurm CLI and its arguments); return the CompletedProcess (text mode).

    ``slurm_conf`` sets ``SLURM_CONF``; ``env`` replaces the inherited environment. With ``check``
    a non-zero exit raises :class:`SlurmCommandError` carrying the command's stderr.
    """
    argv = [str(a) for a in argv]
    program = argv[0]
    if shutil.which(program, path=slurm_env(None, env).get("PATH")) is None and not os.path.isabs(program):
        raise SlurmCommandError(f"{program} not found on PATH (is slurm-client installed?)", argv)
    try:
        result = subprocess.run(
            argv, env=slurm_env(slurm_conf, env), input=input, capture_output=True, text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{program} timed out after {timeout:g} s: {' '.join(argv)}", argv) from None
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {program}: {exc.strerror}", argv) from None
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        tail = detail[-1] if detail else "no output"
        raise SlurmCommandError(
            f"{program} failed (exit {result.returncode}): {tail}", argv, result.returncode, result.stderr,
        )
    return result
