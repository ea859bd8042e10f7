"""``horus report job|users|accounts|partitions|cluster``: terminal tables, --json, --html OUT."""

import json
from pathlib import Path

import click

from ..config import load_config
from ..collect.records import TERMINAL_STATES
from ..errors import HorusError, InputError, check_output_path
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
        check_output_path(html_out, "--html")
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
@click.argument("job_id")
@_options
@click.option("--mail-line", is_flag=True,
              help="print one line for the job's owner (what it used, first advice): for Slurm's MailProg "
                   "or an epilog (see docs/history.md)")
def job_command(job_id, db_path, as_json, html_out, mail_line):
    """One job (JOB_ID: N, or N_T for task T of array N; an array's base id N shows every task):
    GPUs, utilization and memory, CPU/memory/time efficiency, co-runners, predicted vs observed
    slowdown, flags with advice."""
    from .build import array_mail_line, array_report, find_jobs, job_report, mail_line as one_line
    from .render import array_text, job_text

    config = load_config()
    try:
        from .build import parse_job_spec

        parse_job_spec(job_id)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    db = open_db(db_path or default_db_path(config), create=False)
    rows = find_jobs(db, job_id)
    if not rows:
        raise InputError(f"job {job_id} is not in the history database (run `horus ingest`)")
    reports = [job_report(db, row["job_id"], slowdown_limit=config.slowdown_limit) for row in rows]
    if mail_line and any(r["job"]["state"] not in TERMINAL_STATES for r in reports):
        # the MailProg wrapper asks again after the next ingest
        raise HorusError(f"job {job_id} has not ended in the history database yet", exit_code=3)
    if len(reports) == 1 and (rows[0]["array_job_id"] is None or "_" in job_id):
        if mail_line:
            click.echo(one_line(reports[0]))
            return
        _emit("job", reports[0], as_json, html_out, job_text)
        return
    array = array_report(db, reports)
    if mail_line:
        click.echo(array_mail_line(array))
        return
    _emit("array", array, as_json, html_out, array_text)


@report.command("jobs")
@_options
@click.option("--user", help="only this user's jobs")
@click.option("--state", help="only jobs in this state (COMPLETED, FAILED, TIMEOUT, ...)")
@click.option("--since", help="only jobs that ran after this date (YYYY-MM-DD[THH:MM])")
@click.option("--until", help="only jobs that ran before this date")
@click.option("--limit", type=click.IntRange(1, 100000), default=200, show_default=True, help="newest jobs shown")
def jobs_command(db_path, as_json, html_out, user, state, since, until, limit):
    """A job list, newest first, as reportseff shows one: elapsed, GPU utilization and memory, CPU,
    memory and time efficiency, flags."""
    from .build import jobs_report
    from .render import jobs_text

    config = load_config()
    db = open_db(db_path or default_db_path(config), create=False)
    result = jobs_report(db, user=user, since=_since(since, "--since"), until=_since(until, "--until"),
                         state=state, limit=limit, slowdown_limit=config.slowdown_limit)
    _emit("jobs", result, as_json, html_out, jobs_text)


def _group_command(by):
    @_options
    @click.option("--since", help="only jobs that ran after this date (YYYY-MM-DD[THH:MM])")
    @click.option("--until", help="only jobs that ran before this date")
    @click.option("--user", help="only this user's jobs")
    def command(db_path, as_json, html_out, since, until, user):
        from .build import group_report
        from .render import group_text

        config = load_config()
        db = open_db(db_path or default_db_path(config), create=False)
        result = group_report(db, by, _since(since, "--since"), _since(until, "--until"),
                              slowdown_limit=config.slowdown_limit, user=user)
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

    db = open_db(db_path or default_db_path(load_config()), create=False)
    result = cluster_report(db, _since(since, "--since"), _since(until, "--until"))
    _emit("cluster", result, as_json, html_out, cluster_text)
