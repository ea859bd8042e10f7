"""A built wheel, installed non-editable, finds the shipped non-Python files.

templates/, job_submit_lua/ and hpc_configs/ sit at the top of the source tree and travel in the
wheel as data files (<prefix>/share/slurm-horus/<kind>). The test builds the wheel from a copy of
the checkout, installs it into a fresh venv and asks slurm_horus.resources from there.
"""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from slurm_horus.resources import KINDS

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["setup.cfg", "pyproject.toml", "README.md", "slurm_horus", *KINDS]

PROBE = """
import json, slurm_horus, slurm_horus.resources as r
found = {}
for kind in r.KINDS:
    try:
        d = r.resource_dir(kind)
        found[kind] = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    except FileNotFoundError:
        found[kind] = None
print(json.dumps({"package": slurm_horus.__file__, "found": found}))
"""


def shipped(kind):
    directory = ROOT / kind
    if not directory.is_dir():
        return None
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def test_installed_wheel_finds_templates_lua_and_configs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif path.exists():
            shutil.copy(path, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"), str(src)]
    if importlib.util.find_spec("wheel") is not None:
        build.insert(4, "--no-build-isolation")  # offline-friendly when the build tools are here
    subprocess.run(build, check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "wheel").glob("slurm_horus-*.whl")
    # --ignore-installed: without it pip would first uninstall the developer's own (editable) copy.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--prefix", str(venv), str(wheel)],
                   check=True, capture_output=True, timeout=120)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], cwd=tmp_path, check=True,
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HORUS_SHARE": "/nonexistent"})
    result = json.loads(probe.stdout)
    assert result["package"].startswith(str(venv)), "imported the checkout instead of the installed copy"
    assert shipped("job_submit_lua"), "the checkout ships no job_submit.lua"
    for kind in KINDS:
        assert result["found"][kind] == shipped(kind), kind
