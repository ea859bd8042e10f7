"""``horus admin``: this installation's paths, systemd units without a hard-coded path, the
MailProg wrapper and shell completion (the MailProg wrapper's real run is in
test_history_cluster.py, called by a real slurmctld)."""

import os
import shutil
import subprocess
import sys

import pytest

from slurm_horus.admin import UNITS
from slurm_horus.resources import resource_path

HORUS = [sys.executable, "-m", "slurm_horus"]


def horus(*args, env=None):
    result = subprocess.run(HORUS + list(args), capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, **(env or {})))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_paths_say_where_job_submit_lua_and_the_site_files_are():
    rows = dict(line.split(None, 1) if "  " not in line else [part.strip() for part in line.split("  ", 1)]
                for line in horus("admin", "paths").splitlines())
    assert rows["job_submit.lua"] == str(resource_path("job_submit_lua", "job_submit.lua"))
    assert os.access(rows["horus command"].split()[0], os.X_OK)


@pytest.mark.parametrize("name", UNITS)
def test_units_name_this_installations_horus(name, tmp_path):
    text = horus("admin", "unit", name)
    assert "@" not in text.replace("@.service", "")
    for line in text.splitlines():
        if line.startswith(("ExecStart=", "ExecStartPost=")):
            program = line.split("=", 1)[1].lstrip("-").split()[0]
            assert os.path.isabs(program) and os.access(program, os.X_OK), line
    (tmp_path / name).write_text(text)
    analyze = shutil.which("systemd-analyze")
    if analyze and name.endswith(".service"):
        result = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / name)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and "bad unit file" not in result.stderr, result.stderr


def test_shipped_units_carry_no_installation_path():
    for name in UNITS:
        assert "/usr/local/bin/horus" not in resource_path("hpc_configs", name).read_text()


def test_mailprog_is_a_valid_shell_script_with_the_settings_written_in(tmp_path):
    mail = tmp_path / "mail"
    mail.write_text(f'#!/bin/sh\n{{ echo "$@"; cat; }} > {tmp_path}/sent\n')
    mail.chmod(0o755)
    script = tmp_path / "mailprog"
    script.write_text(horus("admin", "mailprog", "--db", str(tmp_path / "h.db"), "--mail", str(mail),
                            env={"SLURM_CONF": "/etc/slurm/x.conf"}))
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert f"export HORUS_DB={tmp_path / 'h.db'}" in text and "export SLURM_CONF=/etc/slurm/x.conf" in text
    # a mail Slurm sends at job start carries no summary: it is passed on unchanged, at once
    done = subprocess.run(["sh", str(script), "-s", "Slurm Job_id=5 Name=x Began, Queued time 00:00:01", "bob"],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout == ""
    assert (tmp_path / "sent").read_text() == "-s Slurm Job_id=5 Name=x Began, Queued time 00:00:01 bob\n"


def test_bash_completion_for_horus_and_horus_sbatch():
    bin_dir = os.path.dirname(sys.executable)
    script = f"""
export PATH={bin_dir}:$PATH
eval "$(horus admin completion bash)"
complete -p horus horus-sbatch
COMP_WORDS=(horus-sbatch --horus-c); COMP_CWORD=1; _horus_sbatch; echo "sbatch: ${{COMPREPLY[*]}}"
COMPREPLY=(); COMP_WORDS=(horus rep); COMP_CWORD=1; _horus_completion horus; echo "horus: ${{COMPREPLY[*]}}"
"""
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "complete -o filenames -F _horus_sbatch horus-sbatch" in result.stdout
    assert "sbatch: --horus-class=" in result.stdout
    assert "horus: report" in result.stdout
