"""``horus report job|users|accounts|partitions|cluster``: terminal tables, --json, --html OUT."""

import json
from pathlib import Path

import click

from ..config import load_config
from ..errors import InputError
from ..store.db import default_db_path, open_db


def _options(func):
    func = click.option("--db", "db_path", help="history database (default: the site config's db)")(func)
    func = click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")(func)
    func = click.option("--html", "html_out", type=click.Path(dir_okay=False),
                        help="also write an HTML report with plots to this file")(func)
    return func


def _emit(kind, report, as_json, html_out, text_of):
    from .render import html

    text = text_of(report)
    if html_out:
        try:
            Path(html_out).write_text(html(kind, report, text))
        except OSError as exc:
            raise InputError(f"cannot write {html_out}: {exc.strerror}") from None
    if as_json:
        click.echo(json.dumps(report, sort_keys=True, default=list))
    else:
        click.echo(text)


def _since(text, name):
    from ..collect.cli import _epoch_option

    return _epoch_option(text, name)


@click.group("report")
def report():
    """Reports over the history store (run `horus ingest` first)."""


@report.command("job")
@click.argument("job_id", type=int)
@_options
def job_command(job_id, db_path, as_json, html_out):
    """One job: GPUs, utilization and memory, co-runners, predicted vs observed slowdown, flags."""
    from .build import job_report
    from .render import job_text

    config = load_config()
    db = open_db(db_path or default_db_path(config))
    result = job_report(db, job_id, slowdown_limit=config.slowdown_limit)
    if result is None:
        raise InputError(f"job {job_id} is not in the history database (run `horus ingest`)")
    _emit("job", result, as_json, html_out, job_text)


def _group_command(by):
    @_options
    @click.option("--since", help="only jobs that ran after this date (YYYY-MM-DD[THH:MM])")
    @click.option("--until", help="only jobs that ran before this date")
    def command(db_path, as_json, html_out, since, until):
        from .build import group_report
        from .render import group_text

        config = load_config()
        db = open_db(db_path or default_db_path(config))
        result = group_report(db, by, _since(since, "--since"), _since(until, "--until"),
                              slowdown_limit=config.slowdown_limit)
        _emit(by, result, as_json, html_out, group_text)

    command.__doc__ = f"GPU-hours allocated vs used, utilization, GPU-hours saved by sharing, per {by[:-1]}."
    return report.command(by)(command)


for _by in ("users", "accounts", "partitions"):
    _group_command(_by)


@report.command("cluster")
@_options
@click.option("--since", help="from this date (YYYY-MM-DD[THH:MM])")
@click.option("--until", help="until this date")
def cluster_command(db_path, as_json, html_out, since, until):
    """Utilization over time, sharing rate, model accuracy."""
    from .build import cluster_report
    from .render import cluster_text

    db = open_db(db_path or default_db_path(load_config()))
    result = cluster_report(db, _since(since, "--since"), _since(until, "--until"))
    _emit("cluster", result, as_json, html_out, cluster_text)
