"""``horus local-cluster up|down|status|env``: thin click wrappers around :class:`LocalCluster`."""

import json
import os
import sys
from pathlib import Path

import click

from ..errors import HorusError, InputError
from .chroot import LOCAL_SLURM_VAR, RELEASES, SYSTEM, default_slurm, slurm_install
from .cluster import DEFAULT_GPUS, DEFAULT_NODES, STATE_FILE, LocalCluster

DIR_HELP = "cluster directory (default: the one $SLURM_CONF points into)"


def resolve_dir(directory):
    """``--dir``, or the cluster that ``$SLURM_CONF`` belongs to (``<dir>/etc/slurm.conf``)."""
    if directory:
        return Path(directory)
    conf = os.environ.get("SLURM_CONF")
    if conf and (Path(conf).resolve().parent.parent / STATE_FILE).exists():
        return Path(conf).resolve().parent.parent
    raise InputError("no --dir given and $SLURM_CONF does not point into a local cluster")


@click.group("local-cluster")
def local_cluster():
    """A private Slurm cluster with fake GPUs on this machine (for trials, tests, the demo)."""


@local_cluster.command("up")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="cluster directory (default: a new temp dir)")
@click.option("--nodes", default=DEFAULT_NODES, show_default=True, type=click.IntRange(1, 64), help="compute nodes")
@click.option("--gpus", default=DEFAULT_GPUS, show_default=True, type=click.IntRange(1, 16), help="fake GPUs per node")
@click.option("--with-dbd", is_flag=True, help="also start MariaDB + slurmdbd (sacct works)")
@click.option("--horus/--no-horus", default=True, show_default=True,
              help="run horusd and slurm-horus's job_submit.lua (--no-horus: plain Slurm, logging-only Lua)")
@click.option("--binding", type=click.Choice(["shard", "indexed", "node"]), default="shard", show_default=True,
              help="how horusd binds its decisions")
@click.option("--policy", default="horus", show_default=True, help="horusd's placement policy")
@click.option("--job-submit-lua", type=click.Path(exists=True, dir_okay=False),
              help="job_submit.lua to install instead of the shipped one")
@click.option("--base-port", type=click.IntRange(1024, 65000), help="try ports from here upwards (default: random)")
@click.option("--slurm", type=click.Choice([SYSTEM, *RELEASES]), default=default_slurm, show_default=LOCAL_SLURM_VAR
              + " or system",
              help="which Slurm: the system's, or 24.11 (Debian trixie) / 26.05 (sid) from a chroot built once")
@click.option("--shards-per-gpu", default=2, show_default=True, type=click.IntRange(1, 128),
              help="gres.conf Count= of each GPU's shard line")
@click.option("--json", "as_json", is_flag=True, help="print the cluster state as JSON")
def up(directory, nodes, gpus, with_dbd, horus, binding, policy, job_submit_lua, base_port, slurm, shards_per_gpu,
       as_json):
    """Start the cluster; its daemons keep running after this command exits."""
    install = slurm_install(slurm).prepare(echo=lambda line: click.echo(line, err=True))
    cluster = LocalCluster(directory=directory, nodes=nodes, gpus=gpus, with_dbd=with_dbd,
                           job_submit_lua=job_submit_lua, base_port=base_port, horus=horus,
                           horus_settings={"binding": binding, "policy": policy}, slurm=install,
                           shards_per_gpu=shards_per_gpu)
    cluster.up()
    if as_json:
        click.echo(json.dumps(cluster.status(), indent=2))
        return
    click.echo(f"local cluster up in {cluster.timings['up_s']:.2f} s: {nodes} nodes x {gpus} GPUs"
               f"{' + slurmdbd' if with_dbd else ''}{' + horusd' if horus else ''} in {cluster.root}"
               f"{'' if slurm == SYSTEM else ' on ' + install.describe()}")
    click.echo(cluster.export_line())
    click.echo(f"stop it with: horus local-cluster down --dir {cluster.root}", err=True)


@local_cluster.command("prepare")
@click.option("--slurm", type=click.Choice(list(RELEASES)), required=True, help="which Slurm's chroot")
def prepare(slurm):
    """Build (once) the chroot a --slurm 24.11/26.05 cluster runs in; say what it holds."""
    install = slurm_install(slurm)
    was_built = install.built() is not None
    install.prepare(echo=lambda line: click.echo(line, err=True))
    info = install.built()
    click.echo(f"{install.describe()}: {'already built' if was_built else 'built in %s s' % info.get('build_s')}; "
               + ", ".join(f"{name} {version}" for name, version in sorted(info.get("packages", {}).items())))


@local_cluster.command("down")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=DIR_HELP)
@click.option("--remove/--keep", default=None, help="delete the directory afterwards (default: only a temp dir)")
def down(directory, remove):
    """Cancel all jobs, wait for the queue to drain, stop every daemon by PID."""
    cluster = LocalCluster.attach(resolve_dir(directory))
    survivors = cluster.down(remove=remove)
    if survivors:
        raise HorusError(f"processes still alive after teardown: {survivors}", exit_code=1)
    click.echo(f"local cluster in {cluster.root} stopped")


@local_cluster.command("status")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status(directory, as_json):
    """Show the daemons and their PIDs; exit 1 when the cluster is not (fully) running."""
    state = LocalCluster.attach(resolve_dir(directory)).status()
    if as_json:
        click.echo(json.dumps(state, indent=2))
    else:
        click.echo(f"{state['dir']}: {'running' if state['running'] else 'not running'}"
                   f" ({state['nodes']} nodes x {state['gpus']} GPUs{', slurmdbd' if state['with_dbd'] else ''}"
                   f", Slurm {state.get('slurm', SYSTEM)})")
        for daemon in state["daemons"]:
            click.echo(f"  {daemon['name']:12} pid {daemon['pid']:<8} {'alive' if daemon['alive'] else 'gone'}")
    if not state["running"]:
        sys.exit(1)


@local_cluster.command("env")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=DIR_HELP)
def env(directory):
    """Print the export line for a shell: eval "$(horus local-cluster env --dir DIR)"."""
    click.echo(LocalCluster.attach(resolve_dir(directory)).export_line())
