"""Locate the non-Python files shipped with slurm-horus.

``templates/``, ``job_submit_lua/`` and ``hpc_configs/`` live at the top of the source tree (where
admins look for them) and are installed as data files under ``<prefix>/share/slurm-horus/`` by a
wheel. Both places are searched, source tree first, so a checkout and an installed package agree.
"""

import os
import sys
from pathlib import Path

KINDS = ("templates", "job_submit_lua", "hpc_configs")


def resource_dir(kind):
    """Return the directory holding the shipped files of ``kind`` (one of KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"unknown resource kind {kind!r}")
    candidates = [
        Path(__file__).resolve().parent.parent / kind,
        Path(sys.prefix) / "share" / "slurm-horus" / kind,
        Path(os.environ.get("HORUS_SHARE", "/usr/local/share/slurm-horus")) / kind,
    ]
    for path in candidates:
        if path.is_dir():
            return path
    raise FileNotFoundError(f"slurm-horus {kind} not found (looked in {', '.join(map(str, candidates))})")


def resource_path(kind, name):
    path = resource_dir(kind) / name
    if not path.exists():
        raise FileNotFoundError(f"slurm-horus {kind}/{name} not found at {path}")
    return path


def package_data_path(name):
    """A file shipped inside the package (``slurm_horus/data/``: priors, the demo's trace)."""
    path = Path(__file__).resolve().parent / "data" / name
    if not path.exists():
        raise FileNotFoundError(f"slurm-horus data file {name} not found at {path}")
    return path
