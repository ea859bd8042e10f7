"""``horus serve`` (horusd) and ``horus doctor``."""

import logging
import sys

import click

from ..config import load_config


@click.command("serve")
@click.option("--socket", "socket_path", help="controller socket (users get <socket>.user)")
@click.option("--policy", help="placement policy (horus, sjf-bsbf, slurm-default, ...)")
@click.option("--binding", type=click.Choice(["indexed", "shard", "node"]), help="how decisions bind jobs")
@click.option("--tcp", help="also listen on host:port (controller peers only)")
@click.option("--log-file", type=click.Path(dir_okay=False), help="log here instead of stderr")
def serve(socket_path, policy, binding, tcp, log_file):
    """Run horusd, the placement service job_submit.lua and horus-sbatch ask."""
    from .app import Horusd

    config = load_config({"socket": socket_path, "policy": policy, "binding": binding, "tcp": tcp})
    from ..private import OneLineFormatter, private_log_handler

    if log_file:
        handler = private_log_handler(log_file)  # 0640: decisions name users and their jobs
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("horusd")
    root.addHandler(handler)
    root.setLevel(config.log_level.upper())
    Horusd(config).serve_forever()


@click.command("doctor")
@click.option("--slurm-conf", type=click.Path(dir_okay=False), help="slurm.conf to check (default: Slurm's own)")
def doctor(slurm_conf):
    """Check a site's slurm.conf, gres.conf, job_submit.lua and horusd socket; say what is wrong."""
    from .doctor import run_checks

    problems = run_checks(load_config(), slurm_conf)
    for level, message in problems:
        click.echo(f"{level}: {message}")
    if any(level == "error" for level, _ in problems):
        sys.exit(1)
    if all(level == "info" for level, _ in problems):
        click.echo("ok: no problem found")
