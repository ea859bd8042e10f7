"""The ``horus`` command: a thin click group whose subcommands are loaded only when used.

Each subcommand lives next to the code it drives (``slurm_horus/<room>/cli.py``) and is imported
lazily, so ``horus local-cluster env`` does not pay for numpy and the placement core.
"""

import importlib
import sqlite3
import sys

import click

from .errors import HorusError

# command name -> "module:attribute" of a click command or group
SUBCOMMANDS = {
    "local-cluster": "slurm_horus.localcluster.cli:local_cluster",
    "model": "slurm_horus.interference.cli:model",
    "simulate": "slurm_horus.sim.cli:simulate",
    "config": "slurm_horus.config_cli:config_command",
    "serve": "slurm_horus.service.cli:serve",
    "doctor": "slurm_horus.service.cli:doctor",
    "collect": "slurm_horus.collect.cli:collect",
    "ingest": "slurm_horus.collect.cli:ingest_command",
    "report": "slurm_horus.report.cli:report",
    "model-refit": "slurm_horus.learn.cli:model_refit",
    "demo": "slurm_horus.demo:demo",
    "admin": "slurm_horus.admin:admin",
    "job-env": "slurm_horus.sbatch.jobenv:job_env",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is not None or name not in SUBCOMMANDS:
            return command
        module_name, attribute = SUBCOMMANDS[name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A room that is not built yet: say so instead of a traceback.
            if exc.name and exc.name.startswith("slurm_horus"):
                return None
            raise
        return getattr(module, attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-horus")
def cli():
    """slurm-horus: interference-aware GPU co-location for Slurm."""


def main(argv=None):
    """Entry point: user-facing errors become one line on stderr and a non-zero exit."""
    try:
        # with standalone_mode=False click returns a command's exit code instead of exiting
        code = cli.main(args=argv, prog_name="horus", standalone_mode=False)
    except HorusError as exc:
        click.echo(f"horus: {exc}", err=True)
        sys.exit(exc.exit_code)
    except sqlite3.Error as exc:  # a database that is locked, read-only, full or damaged
        click.echo(f"horus: database error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("horus: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
