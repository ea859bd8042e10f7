"""``horus collect`` and ``horus ingest``: thin click wrappers over sampler.py and ingest.py."""

import contextlib
import math
import sqlite3
import sys
import time

import click

from ..config import load_config
from ..errors import HorusError, InputError


def _db_path(db_path):
    # imported here: a collector that ships over the network never loads the store (nor sqlite_utils)
    from ..store.db import default_db_path

    return db_path or default_db_path(load_config())


def _db(db_path):
    from ..store.db import open_db

    return open_db(_db_path(db_path))


@contextlib.contextmanager
def _stored_by_window(path):
    """An ingest stores each window in one transaction and moves its watermark after it: a database
    error (locked past the busy timeout, read-only, full disk) is one line, and the next run starts
    where this one failed."""
    try:
        yield
    except sqlite3.Error as exc:
        raise InputError(f"history database {path}: {exc}; nothing of the failed window was stored, "
                         "run again to go on") from None


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
@click.option("--ship", "ship_now", is_flag=True, help="only ship the spool (to --ship-to or --db), then stop")
@click.option("--ship-every", type=float, default=60.0, show_default=True,
              help="while sampling, ship to --ship-to (or --db) every this many seconds (0: never ship)")
@click.option("--export", "export_to", type=click.File("w"),
              help="write unshipped batches as JSON lines to this file ('-': stdout), then stop")
@click.option("--import", "import_from", type=click.File("r"),
              help="store JSON-line batches from this file ('-': stdin) into --db, then stop")
@click.option("--slurm-conf", envvar="SLURM_CONF",
              help="count only jobs whose SLURM_CONF is this one (tells apart clusters sharing a host)")
@click.option("--ship-to", "ship_to", help="ship to this receiver (horus receive), e.g. http://head:8910, and "
              "never open a database (default: the site config's ship_to, $HORUS_SHIP_TO)")
@click.option("--munge-socket", help="munged socket for the shipping credential (default: the site config's "
              "munge_socket, else munge's default)")
def collect(db_path, spool, node, backend, gpus, interval, count, once, ship_now, ship_every,
            export_to, import_from, slurm_conf, ship_to, munge_socket):
    """Sample this node's GPUs (NVML) into a local spool and ship the batches to the history store."""
    from . import sampler
    from .nvml import NvmlUnavailable, open_backend
    from .shipping import NetworkShipper, ShipError

    config = load_config({"ship_to": ship_to, "munge_socket": munge_socket})
    if import_from is not None:
        db = _db(db_path)
        n = sampler.import_batches(db, import_from, source=import_from.name)
        click.echo(f"imported {n} batches")
        return
    if config.ship_to and db_path and ship_to:
        raise InputError("give --ship-to or --db, not both")
    if config.ship_to and not db_path:
        # the network path: this host needs no access to the history database at all
        deliver = NetworkShipper(config.ship_to, munge_socket=config.munge_socket or None).deliver
    else:
        deliver = None  # opened below only when a delivery is due
    queue = sampler.Spool(spool)
    if export_to is not None:
        n = sampler.export_batches(queue, export_to)
        click.echo(f"exported {n} batches", err=True)
        return
    if ship_now:
        try:
            n = sampler.ship_with(queue, deliver or sampler.db_delivery(_db(db_path)))
        except ShipError as exc:
            raise HorusError(f"{exc}; {queue.count()} batches kept in the spool", exit_code=1) from None
        click.echo(f"shipped {n} batches")
        return
    node = node or sampler.node_name()
    try:
        gpu_backend = open_backend(backend, gpus=gpus, node=node, slurm_conf=slurm_conf)
    except NvmlUnavailable as exc:
        raise InputError(f"{exc} (use --backend standin on a machine without GPUs)") from None
    if ship_every <= 0:
        deliver = None
    elif deliver is None:
        deliver = sampler.db_delivery(_db(db_path))
    try:
        done = sampler.run_collector(gpu_backend, queue, node, interval_s=interval,
                                     count=1 if once else count, deliver=deliver,
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
@click.option("--prometheus", "prometheus_url", help="instead of sacct: GPU samples of NVIDIA's DCGM exporter "
              "from this Prometheus (http://host:9090), jobs as jobstats attributes them")
@click.option("--prometheus-match", default="", help="label matchers added to every query, e.g. 'cluster=\"della\"'")
@click.option("--node-label", default="Hostname", show_default=True,
              help="label naming the node (else the host part of 'instance')")
def ingest_command(db_path, since, until, window_hours, fmt, from_file, slurm_conf, as_json, progress,
                   prometheus_url, prometheus_match, node_label):
    """Copy finished and running jobs from sacct into the history store (incremental, idempotent).

    With --prometheus: copy DCGM GPU samples from Prometheus instead (incremental, idempotent)."""
    from .ingest import FileSource, SacctSource, ingest

    path = _db_path(db_path)
    db = _db(path)
    if prometheus_url:
        _ingest_prometheus(db, path, prometheus_url, prometheus_match, node_label, since, until, as_json, progress)
        return
    source = FileSource(from_file) if from_file else SacctSource(slurm_conf=slurm_conf, mode=fmt)
    window_s = window_hours * 3600 if not from_file else 10 ** 10
    with _stored_by_window(path):
        result = ingest(db, source, since=_epoch_option(since, "--since"), until=_epoch_option(until, "--until"),
                        window_s=window_s, progress=_progress(progress, "sacct calls", "jobs read"))
    _print_result(result, as_json, f"ingested {result.jobs_seen} jobs ({result.jobs_new} new), {result.steps_seen} "
                  f"steps from {result.source} in {result.windows} window(s)")


def _progress(progress, calls, items):
    """The progress callback of an ingest: a line on stderr (by default only on a terminal)."""
    show = sys.stderr.isatty() if progress is None else progress

    def report(fraction, windows, count):
        if show:
            click.echo(f"\ringest: {100 * fraction:5.1f}% of the range, {windows} {calls}, {count} {items}",
                       err=True, nl=fraction >= 1.0)

    return report


def _print_result(result, as_json, line):
    import json

    click.echo(json.dumps(result.as_dict(), sort_keys=True) if as_json else line)


def _ingest_prometheus(db, path, url, match, node_label, since, until, as_json, progress):
    from .prometheus import PrometheusSource, ingest_prometheus

    with _stored_by_window(path):
        result = ingest_prometheus(db, PrometheusSource(url, match=match), since=_epoch_option(since, "--since"),
                                   until=_epoch_option(until, "--until"), node_label=node_label,
                                   progress=_progress(progress, "windows", "GPU samples"))
    _print_result(result, as_json, f"ingested {result.gpu_samples} GPU samples and {result.job_rows} job rows of "
                  f"{result.nodes} nodes from {url} in {result.windows} window(s)")


@click.command("receive")
@click.option("--listen", help="HOST:PORT to listen on (default: the site config's receive_listen)")
@click.option("--db", "db_path", help="history database (default: the site config's db)")
@click.option("--munge-socket", help="munged socket to check credentials with (default: munge_socket)")
@click.option("--log-file", type=click.Path(dir_okay=False), help="log here instead of stderr")
def receive(listen, db_path, munge_socket, log_file):
    """Receive the batches collectors ship with --ship-to; the one writer of their samples."""
    import logging
    import signal
    import threading

    from ..store.db import default_db_path
    from .receiver import NodeDirectory, Receiver, ReceiverServer, parse_users

    config = load_config({"receive_listen": listen, "db": db_path, "munge_socket": munge_socket})
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("horus.receive")
    logger.addHandler(handler)
    logger.setLevel(config.log_level.upper())
    receiver = Receiver(default_db_path(config), NodeDirectory(config.ship_nodes or None),
                        parse_users(config.ship_users), munge_socket=config.munge_socket or None,
                        raw_days=config.raw_days)
    server = ReceiverServer(receiver, config.receive_listen).start()
    logger.info("horus: receiving on %s:%d into %s", server.address[0], server.port, default_db_path(config))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    try:
        while not stopping.wait(1.0):
            pass
    finally:
        server.stop()
        logger.info("horus: receiver stopped (%d accepted, %d refused)", receiver.accepted, receiver.refused)
