"""``horus admin``: what a site admin needs from this installation, with this installation's paths.

* ``horus admin paths``: where pip put job_submit.lua, the site files and templates; which ``horus``
  command this is; the site file, database and socket in force;
* ``horus admin unit NAME``: a systemd unit or timer of ``hpc_configs/`` with ``@HORUS@`` (the
  command that runs this installation) and ``@CONFIG@`` (the site file) filled in;
* ``horus admin mailprog``: the MailProg wrapper that adds a job's slurm-horus line to Slurm's mail;
* ``horus admin completion SHELL``: shell completion for ``horus`` (click's) and ``horus-sbatch``
  (sbatch's own completion plus the horus options).
"""

import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from .config import DEFAULT_CONFIG_FILE, load_config
from .resources import resource_dir, resource_path

UNITS = ("horusd.service", "horus-collect.service", "horus-receive.service", "horus-ingest.service",
         "horus-ingest.timer", "horus-refit.service", "horus-refit.timer")
HORUS_SBATCH_OPTIONS = ("--horus-class=", "--horus-model=", "--horus-batch-size=", "--horus-off", "--dry-run",
                        "--explain")


def horus_command():
    """The command line that runs this installation's ``horus``: the console script installed beside
    this interpreter (or the one on PATH that is it), else ``<python> -m slurm_horus``."""
    beside = Path(sys.executable).parent / "horus"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("horus")
    if found:
        try:
            with open(found, "rb") as script:
                first = script.readline().decode(errors="replace")
        except OSError:
            first = ""
        if first.startswith("#!") and Path(first[2:].strip().split()[0]).resolve() == Path(sys.executable).resolve():
            return found
    return f"{shlex.quote(sys.executable)} -m slurm_horus"


def _config_path():
    return os.environ.get("HORUS_CONFIG") or DEFAULT_CONFIG_FILE


def fill(text, values):
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


@click.group("admin")
def admin():
    """Site-admin helpers: paths, systemd units and timers, MailProg, shell completion."""


@admin.command("paths")
def paths_command():
    """Where this installation keeps what an admin copies or points Slurm at."""
    config = load_config()
    rows = [
        ("horus command", horus_command()),
        ("horus-sbatch", shutil.which("horus-sbatch") or str(Path(sys.executable).parent / "horus-sbatch")),
        ("job_submit.lua", str(resource_path("job_submit_lua", "job_submit.lua"))),
        ("EpilogSlurmctld", str(resource_path("job_submit_lua", "horus_epilog.lua"))),
        ("site file examples", str(resource_dir("hpc_configs"))),
        ("report templates", str(resource_dir("templates"))),
        ("site file", f"{_config_path()}" + ("" if os.path.exists(_config_path()) else " (absent: defaults)")),
        ("history database", config.db),
        ("horusd socket", config.socket),
        ("kill switch", config.disable_file),
    ]
    for name, value in rows:
        click.echo(f"{name:20} {value}")


@admin.command("unit")
@click.argument("name", type=click.Choice(UNITS))
def unit_command(name):
    """Print systemd unit NAME for this installation (redirect it to /etc/systemd/system/NAME)."""
    text = resource_path("hpc_configs", name).read_text()
    click.echo(fill(text, {"HORUS": horus_command(), "CONFIG": _config_path()}), nl=False)


@admin.command("mailprog")
@click.option("--mail", default="/usr/bin/mail", show_default=True, help="the mail program that sends the mail")
@click.option("--db", "db_path", help="history database to report from (default: the site config's db)")
def mailprog_command(mail, db_path):
    """Print the MailProg wrapper (for slurm.conf's MailProg=): Slurm's mail plus the job's line.
    The site file, --db and SLURM_CONF in force now are written into it (slurmctld passes MailProg
    only a few variables of its own)."""
    exports = [f"export HORUS_CONFIG={shlex.quote(_config_path())}"] if os.path.exists(_config_path()) else []
    if db_path:
        exports.append(f"export HORUS_DB={shlex.quote(os.path.abspath(db_path))}")
    if os.environ.get("SLURM_CONF"):  # slurmctld gives MailProg no SLURM_CONF: sacct must find it
        exports.append(f"export SLURM_CONF={shlex.quote(os.environ['SLURM_CONF'])}")
    text = resource_path("hpc_configs", "horus-mailprog").read_text()
    click.echo(fill(text, {"HORUS": horus_command(), "MAIL": mail, "EXPORTS": "\n".join(exports)}), nl=False)


_BASH_SBATCH = """
# horus-sbatch: sbatch's own completion (Slurm's bash-completion file), plus the horus options
_horus_sbatch() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    case "$cur" in
        --h*|--dr*|--ex*)
            COMPREPLY=($(compgen -W "%(options)s" -- "$cur"))
            [ ${#COMPREPLY[@]} -gt 0 ] && { compopt -o nospace 2>/dev/null; return; } ;;
    esac
    if ! declare -F _sbatch >/dev/null; then
        for file in /usr/share/bash-completion/completions/sbatch /etc/bash_completion.d/slurm*; do
            [ -r "$file" ] && . "$file" && break
        done
    fi
    if declare -F _sbatch >/dev/null; then _sbatch "$@"; else COMPREPLY=($(compgen -f -- "$cur")); fi
}
complete -o filenames -F _horus_sbatch horus-sbatch
"""


@admin.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_command(shell):
    """Print shell completion for horus and horus-sbatch: eval "$(horus admin completion bash)"."""
    from click.shell_completion import get_completion_class

    from .cli import cli

    completer = get_completion_class(shell)(cli, {}, "horus", "_HORUS_COMPLETE")
    click.echo(completer.source())
    if shell == "bash":
        click.echo(_BASH_SBATCH % {"options": " ".join(HORUS_SBATCH_OPTIONS)})
    else:
        click.echo("# horus-sbatch: it takes sbatch's options; reuse sbatch's completion "
                   "(zsh: compdef horus-sbatch=sbatch; fish: complete -c horus-sbatch -w sbatch)")
