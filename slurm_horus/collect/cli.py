"""``horus collect`` and ``horus ingest``: thin click wrappers over sampler.py and ingest.py."""

import math
import sqlite3
import sys
import time

import click

from ..config import load_config
from ..errors import InputError
from ..store.db import default_db_path, open_db


def _db(db_path):
    return open_db(db_path or default_db_path(load_config()))


def _positive_hours(_ctx, _param, value):
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"--window-hours: must be a positive number of hours, got {value}")
    return value


@click.command("collect")
@click.option("--db", "db_path", help="history database (default: the site config's db)")
@click.option("--spool", default="/var/spool/horus/collect.db", show_default=True,
              help="node-local spool file")
@click.option("--node", help="node name (default: short hostname); with several slurmd on one host, "
              "only job processes with this SLURMD_NODENAME count")
@click.option("--backend", type=click.Choice(["nvml", "standin", "auto"]), default="nvml",
              show_default=True, help="real NVML, the stand-in (GPU-less machines), or NVML if it starts")
@click.option("--gpus", type=int, default=4, show_default=True, help="stand-in: number of GPUs")
@click.option("--interval", type=float, default=5.0, show_default=True, help="seconds between samples")
@click.option("--count", type=int, help="take this many samples, then stop (default: run forever)")
@click.option("--once", is_flag=True, help="take one sample and stop")
@click.option("--ship", "ship_now", is_flag=True, help="only ship the spool into the database, then stop")
@click.option("--ship-every", type=float, default=60.0, show_default=True,
              help="while sampling, ship to --db every this many seconds (0: never ship)")
@click.option("--export", "export_to", type=click.File("w"),
              help="write unshipped batches as JSON lines to this file ('-': stdout), then stop")
@click.option("--import", "import_from", type=click.File("r"),
              help="store JSON-line batches from this file ('-': stdin) into --db, then stop")
@click.option("--slurm-conf", envvar="SLURM_CONF",
              help="count only jobs whose SLURM_CONF is this one (tells apart clusters sharing a host)")
def collect(db_path, spool, node, backend, gpus, interval, count, once, ship_now, ship_every,
            export_to, import_from, slurm_conf):
    """Sample this node's GPUs (NVML) into a local spool and ship the batches to the history store."""
    from . import sampler
    from .nvml import NvmlUnavailable, open_backend

    if import_from is not None:
        db = _db(db_path)
        n = sampler.import_batches(db, import_from, source=import_from.name)
        click.echo(f"imported {n} batches")
        return
    queue = sampler.Spool(spool)
    if export_to is not None:
        n = sampler.export_batches(queue, export_to)
        click.echo(f"exported {n} batches", err=True)
        return
    if ship_now:
        n = sampler.ship(queue, _db(db_path))
        click.echo(f"shipped {n} batches")
        return
    node = node or sampler.node_name()
    try:
        gpu_backend = open_backend(backend, gpus=gpus, node=node, slurm_conf=slurm_conf)
    except NvmlUnavailable as exc:
        raise InputError(f"{exc} (use --backend standin on a machine without GPUs)") from None
    target = _db(db_path) if ship_every > 0 else None
    try:
        done = sampler.run_collector(gpu_backend, queue, node, interval_s=interval,
                                     count=1 if once else count, ship_to=target,
                                     ship_every_s=ship_every, slurm_conf=slurm_conf)
    finally:
        gpu_backend.close()
    click.echo(f"{done} samples from {node} ({gpu_backend.name}); {queue.count()} batches unshipped",
               err=True)


def _epoch_option(text, name):
    if text is None:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return int(time.mktime(time.strptime(text, fmt)))
        except ValueError:
            continue
    if text.isdigit():
        return int(text)
    raise InputError(f"{name}: expected YYYY-MM-DD[THH:MM[:SS]] or epoch seconds, got {text!r}")


@click.command("ingest")
@click.option("--db", "db_path", help="history database (default: the site config's db)")
@click.option("--since", help="start of the range (default: the last ingested end time, or 30 days ago)")
@click.option("--until", help="end of the range (default: now)")
@click.option("--window-hours", type=float, default=168.0, show_default=True, callback=_positive_hours,
              help="first sacct window (hours); later windows adapt to the job rate")
@click.option("--format", "fmt", type=click.Choice(["auto", "json", "parsable"]), default="auto",
              show_default=True, help="sacct --json (22.05), sacct -P, or --json falling back to -P")
@click.option("--from-file", type=click.Path(dir_okay=False),
              help="ingest a saved sacct --json / -P output instead of running sacct")
@click.option("--slurm-conf", envvar="SLURM_CONF", help="slurm.conf of the cluster to read")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--progress/--no-progress", default=None, help="show progress (default: on a terminal)")
def ingest_command(db_path, since, until, window_hours, fmt, from_file, slurm_conf, as_json, progress):
    """Copy finished and running jobs from sacct into the history store (incremental, idempotent)."""
    import json

    from .ingest import FileSource, SacctSource, ingest

    path = db_path or default_db_path(load_config())
    db = open_db(path)
    source = FileSource(from_file) if from_file else SacctSource(slurm_conf=slurm_conf, mode=fmt)
    window_s = window_hours * 3600 if not from_file else 10 ** 10
    show = sys.stderr.isatty() if progress is None else progress

    def report(fraction, windows, jobs):
        if show:
            click.echo(f"\ringest: {100 * fraction:5.1f}% of the range, {windows} sacct calls, "
                       f"{jobs} jobs read", err=True, nl=fraction >= 1.0)

    try:
        result = ingest(db, source, since=_epoch_option(since, "--since"),
                        until=_epoch_option(until, "--until"), window_s=window_s, progress=report)
    except sqlite3.Error as exc:  # locked past the busy timeout, read-only, full disk: each window is
        # one transaction and the watermark moves after it, so the next run starts where this one failed
        raise InputError(f"history database {path}: {exc}; nothing of the failed window was stored, "
                         "run again to go on") from None
    if as_json:
        click.echo(json.dumps(result.as_dict(), sort_keys=True))
    else:
        click.echo(f"ingested {result.jobs_seen} jobs ({result.jobs_new} new), {result.steps_seen} steps "
                   f"from {result.source} in {result.windows} window(s)")
