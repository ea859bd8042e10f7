"""Prerequisites of a local cluster: the Debian packages' programs, and root.

Checked by the files the packages install (not by dpkg), so the check also works where Slurm was
installed another way; the message names the Debian package to install for each missing piece.
"""

import os
import shutil
from pathlib import Path

from ..errors import HorusError

# (program or file, Debian package); a name without "/" is looked up on the search path.
CORE_REQUIREMENTS = [
    ("munged", "munge"),
    ("slurmctld", "slurmctld"),
    ("slurmd", "slurmd"),
    ("slurmstepd", "slurmd"),
    ("sinfo", "slurm-client"),
    ("squeue", "slurm-client"),
    ("sbatch", "slurm-client"),
    ("scancel", "slurm-client"),
    ("scontrol", "slurm-client"),
    ("luac5.1", "lua5.1"),
    ("/usr/share/lua/5.1/socket.lua", "lua-socket"),
]
DBD_REQUIREMENTS = [
    ("slurmdbd", "slurmdbd"),
    ("sacct", "slurm-client"),
    ("sacctmgr", "slurm-client"),
    ("mariadbd", "mariadb-server"),
    ("mariadb-install-db", "mariadb-server"),
    ("mariadb", "mariadb-server"),
]

# A cluster on a chroot's Slurm (localcluster.chroot) needs these on the host; the chroot holds the
# rest, but not MariaDB: the host's serves the chroot's slurmdbd.
CHROOT_HOST_REQUIREMENTS = [
    ("luac5.1", "lua5.1"),
    ("chroot", "coreutils"),
    ("mount", "mount"),
]
CHROOT_HOST_DBD_REQUIREMENTS = [item for item in DBD_REQUIREMENTS if item[1] == "mariadb-server"]


class PrerequisiteError(HorusError):
    """The local cluster cannot start on this machine; the message says what to install or do."""


def find_program(name, path=None):
    """Absolute path of program ``name`` on ``path`` (default $PATH; root's PATH holds the sbin
    dirs), as the symlink path, not its resolved target; None when absent."""
    return shutil.which(name, path=path if path is not None else os.environ.get("PATH", os.defpath))


def missing_prerequisites(with_dbd=False, path=None, requirements=None, install=None):
    """[(missing program or file, Debian package)] for this machine (``install``: a chroot Slurm)."""
    if requirements is None and install is not None and install.root is not None:
        requirements = CHROOT_HOST_REQUIREMENTS + (CHROOT_HOST_DBD_REQUIREMENTS if with_dbd else [])
    wanted = list(requirements) if requirements is not None else (
        CORE_REQUIREMENTS + (DBD_REQUIREMENTS if with_dbd else []))
    missing = []
    for item, package in wanted:
        found = Path(item).exists() if "/" in item else find_program(item, path) is not None
        if not found:
            missing.append((item, package))
    return missing


def prerequisite_problems(with_dbd=False, path=None, euid=None, requirements=None, install=None):
    """Human-readable problems (empty list: ready). ``euid`` defaults to ours."""
    problems = []
    missing = missing_prerequisites(with_dbd, path, requirements, install)
    if missing:
        packages = sorted({package for _, package in missing})
        problems.append(
            "missing " + ", ".join(f"{item} (package {package})" for item, package in missing)
            + "; install with: apt-get install -y --no-install-recommends " + " ".join(packages)
            + " (or run scripts/ensure-debian-deps.sh)"
        )
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        problems.append("the local cluster runs slurmd and munged as root: run it as root (or with sudo)")
    return problems


def check_prerequisites(with_dbd=False, path=None, euid=None, requirements=None, install=None):
    problems = prerequisite_problems(with_dbd, path, euid, requirements, install)
    if problems:
        raise PrerequisiteError("cannot start the local cluster: " + "; ".join(problems))
