"""``horus simulate``: replay a trace through every chosen policy and compare them."""

import json
import math
import sys
import time

import click

from ..errors import InputError, check_output_path

DEFAULT_POLICIES = "slurm-default,sjf,sjf-ffs,sjf-bsbf,horus-util,iasp-iapp,oracle,horus"
TABLE_KEYS = (("makespan", "makespan"), ("mean_jct", "mean JCT"), ("p99_jct", "p99 JCT"),
              ("mean_queueing_delay", "mean wait"), ("effective_utilization", "eff.util"),
              ("bad_pair_share", "bad pairs"), ("oom_events", "OOM"), ("duration_mare", "dur.err"))
NO_RATIO = ("oom_events", "bad_pair_share", "duration_mare")


class _Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal or forced)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = 0.0

    def __call__(self, name: str, done: int, total: int):
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{name:>16} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


DURATION_UNITS = (("h", 3600.0), ("min", 60.0), ("s", 1.0))


def _unit(seconds: float):
    """One unit for a whole column of durations: hours from 10 h, minutes from 10 min, else seconds."""
    for name, size in DURATION_UNITS:
        if seconds >= 10 * size or size == 1.0:
            return name, size
    return "s", 1.0


def _fmt(key: str, value: float, unit=("s", 1.0), summary=None) -> str:
    if key == "duration_mare":
        return "exact" if (summary or {}).get("durations") == "oracle" else f"{value:.2f}"
    if key in ("effective_utilization", "bad_pair_share"):
        return f"{value:.3f}"
    if key == "oom_events":
        return str(int(value))
    name, size = unit
    return f"{value / size:.2f} {name}" if size > 1 else f"{value:.0f} {name}"


def comparison_table(summaries: dict, baseline: str = "slurm-default") -> str:
    """The text table: one row per policy, each figure with its ratio to ``baseline``."""
    header = ["policy"] + [label for _, label in TABLE_KEYS]
    rows = [header]
    base = summaries.get(baseline)
    units = {key: _unit(max((s[key] for s in summaries.values()), default=0.0)) for key, _ in TABLE_KEYS}
    for name, summary in summaries.items():
        row = [name]
        for key, _ in TABLE_KEYS:
            cell = _fmt(key, summary[key], units[key], summary)
            if base is not None and name != baseline and key not in NO_RATIO and base[key]:
                cell += f" ({summary[key] / base[key]:.2f}x)"
            row.append(cell)
        rows.append(row)
    return text_table(rows)


def text_table(rows) -> str:
    """Rows of strings (the first one the header) as aligned columns under a rule."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _interval(seconds: float):
    """A learning interval for the JSON: seconds, None for never (JSON has no infinity)."""
    return None if math.isinf(seconds) else seconds


def _interval_text(seconds: float) -> str:
    if seconds == 0:
        return "at once"
    return "never during the run" if math.isinf(seconds) else f"every {seconds:g} s"


@click.command("simulate")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False), help="trace file")
@click.option("--trace-format", default="auto",
              type=click.Choice(["auto", "generic", "philly", "gavel", "pollux", "tiresias", "alibaba"]))
@click.option("--time-unit", default="s", show_default=True, type=click.Choice(["s", "ms"]),
              help="unit of the submit times and durations of a Tiresias-format trace")
@click.option("--traces-dir", default=None, help="application traces of a Pollux/Sia/DeepBoot workload")
@click.option("--cluster", default="16x4:v100", show_default=True,
              help="NODESxGPUS:TYPE[@PARTITION][,...] or a JSON/YAML file")
@click.option("--truth", default="gavel:v100", show_default=True,
              help="observations.csv | gavel:<gpu> | none | infeasible")
@click.option("--profiles", default=None, type=click.Path(dir_okay=False), help="extra solo profiles CSV")
@click.option("--policy", "policies", default=DEFAULT_POLICIES, show_default=True, help="comma-separated policies")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--load", default=1.0, show_default=True, type=float, help="arrival-rate multiplier")
@click.option("--max-jobs", default=0, type=int, help="use only the first N jobs of the trace (0 = all)")
@click.option("--skip-jobs", default=0, type=int,
              help="leave out the first N jobs of the trace, in submit order (before --max-jobs): simulate a "
                   "later stretch of it")
@click.option("--history", "history_from", default="none", show_default=True, type=click.Choice(["none", "skipped"]),
              help="what the duration estimator knows when the run starts: none (a new site), or skipped: the "
                   "run times of the jobs --skip-jobs left out, each learned once it ended, as horusd's store "
                   "holds a site's earlier runs")
@click.option("--single-gpu", is_flag=True, help="keep only 1-GPU jobs")
@click.option("--holdout/--no-holdout", default=True, show_default=True,
              help="hide the truth GPU's measured pairs from the policies' priors")
@click.option("--durations", default="estimated", show_default=True, type=click.Choice(["estimated", "oracle"]),
              help="what policies know of run times: the duration estimator's answer (learned from the jobs "
                   "finished earlier in the run, capped by the time limit) or the trace's true durations; "
                   "the oracle policy always knows them")
@click.option("--time-limit", default=None, type=float,
              help="time limit (s) of jobs whose trace gives none, as a partition's DefaultTime "
                   "(caps the estimates; not enforced)")
@click.option("--default-duration", default=3600.0, show_default=True, type=float,
              help="estimate (s) for a job with no time limit before any job has finished")
@click.option("--duration-levels", type=click.Choice(["fixed", "measured"]), default="measured",
              show_default=True,
              help="the order the duration estimator tries its histories in: measured (by how well each "
                   "level's estimates followed the run times) or fixed (user+class > class > user > site)")
@click.option("--duration-recent", type=click.Choice(["end", "start"]), default="end", show_default=True,
              help="which runs of a history the duration estimator takes the median of: those that ended "
                   "last or those that started last (horusd's duration_recent)")
@click.option("--slowdown-limit", default=None, type=float,
              help="horusd's slowdown_limit: a pair predicted to slow a job more is not made (default: no limit)")
@click.option("--learn-pairs-every", "learn_pairs_every", default=None, type=float,
              show_default="horusd's feed, 300",
              help="trace seconds between the times the policies learn the pairs measured meanwhile (horusd "
                   "learns them at its feed from the history store); 0: at once (an ideal learner); inf: "
                   "never during the run")
@click.option("--learn-durations-every", "learn_durations_every", default=None, type=float,
              show_default="horusd's feed, 300",
              help="the same for the run times the duration estimator learns (horusd feeds it from its history "
                   "store); 0: at once")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="JSON summary")
@click.option("--jobs-csv", default=None, type=click.Path(dir_okay=False), help="per-job CSV")
@click.option("--report", default=None, type=click.Path(dir_okay=False), help="HTML report")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: if a tty)")
@click.option("--no-departure", is_flag=True,
              help="FGD's protocol: each request tried once at arrival, nothing ends, no queue")
@click.option("--inflate", default=0.0, type=float,
              help="with --no-departure: draw requests with replacement until they ask X x the cluster's GPUs")
@click.option("--inflate-keep-trace", is_flag=True,
              help="with --inflate: FGD's way, every trace request once (shuffled), then draws within X")
@click.option("--shuffle-seed", default=None, type=int, help="with --no-departure: seed of the draw / order")
@click.option("--gpu-memory-mb", "gpu_memory", multiple=True, metavar="MODEL=MB",
              help="memory of one GPU of MODEL (repeatable), e.g. --gpu-memory-mb G2=32768")
def simulate(trace_path, trace_format, time_unit, traces_dir, cluster, truth, profiles, policies, seed, load,
             max_jobs, skip_jobs, history_from, single_gpu, holdout, durations, time_limit, default_duration, duration_levels,
             duration_recent,
             slowdown_limit, learn_pairs_every, learn_durations_every, json_out, jobs_csv, report, progress,
             no_departure, inflate, inflate_keep_trace, shuffle_seed, gpu_memory):
    """Replay a trace through several placement policies on one simulated cluster."""
    from ..placement.duration import DurationSettings
    from .engine import SimOptions
    from .metrics import summarize, write_jobs_csv
    from .run import history_from_trace, parse_cluster, run_policies
    from .traces import read_trace, time_unit_warning
    from .truth import load_truth

    for path, option in ((json_out, "--json"), (jobs_csv, "--jobs-csv"), (report, "--report")):
        check_output_path(path, option)
    if time_limit is not None and not time_limit > 0:
        raise InputError("--time-limit must be positive")
    if not default_duration > 0:
        raise InputError("--default-duration must be positive")
    if slowdown_limit is not None and not slowdown_limit >= 1.0:
        raise InputError("--slowdown-limit must be at least 1")
    for every, option in ((learn_pairs_every, "--learn-pairs-every"), (learn_durations_every, "--learn-durations-every")):
        if every is not None and not every >= 0:
            raise InputError(f"{option} must be 0 (at once), positive, or inf (never)")
    if (inflate or shuffle_seed is not None) and not no_departure:
        raise InputError("--inflate and --shuffle-seed go with --no-departure (FGD's protocol)")
    if inflate < 0:
        raise InputError("--inflate must be positive")
    if inflate_keep_trace and not inflate:
        raise InputError("--inflate-keep-trace goes with --inflate")
    if skip_jobs < 0 or max_jobs < 0:
        raise InputError("--skip-jobs and --max-jobs must be 0 or more")
    if history_from == "skipped" and not skip_jobs:
        raise InputError("--history skipped learns the jobs --skip-jobs leaves out: give --skip-jobs N")
    if history_from == "skipped" and no_departure:
        raise InputError("--history has nothing to tell with --no-departure (no durations are read)")
    settings = DurationSettings(default_duration=default_duration, adaptive=duration_levels == "measured",
                                recent_by=duration_recent)
    told = {name: value for name, value in (("learn_pairs_every_s", learn_pairs_every),
                                            ("learn_durations_every_s", learn_durations_every)) if value is not None}
    truth_model = load_truth(truth, profiles)
    groups = parse_cluster(cluster, _gpu_memory(gpu_memory))
    gpu_type = groups[0].gpu_type
    jobs = read_trace(trace_path, trace_format, traces_dir=traces_dir, time_unit=time_unit,
                      solo_tput=lambda cls: truth_model.solo_tput(cls, gpu_type))
    warning = time_unit_warning(jobs)
    if warning:
        click.echo(f"{trace_path}: {warning}", err=True)
    if single_gpu:
        jobs = [j for j in jobs if j.num_gpus == 1]
    skipped = []
    if max_jobs or skip_jobs:
        jobs = sorted(jobs, key=lambda j: j.submit_time)
        skipped, jobs = jobs[:skip_jobs], jobs[skip_jobs:]
        if max_jobs:
            jobs = jobs[:max_jobs]
    if not jobs:
        raise InputError(f"{trace_path}: no jobs to simulate"
                         + (f" after the {len(skipped)} --skip-jobs leaves out" if skipped else ""))
    history = history_from_trace(skipped, truth_model, seed, load) if history_from == "skipped" else ()
    options = SimOptions(durations=durations, time_limit=time_limit, duration_settings=settings,
                         max_slowdown=slowdown_limit, history=history, **told)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if no_departure:
        if jobs_csv:
            raise InputError("--jobs-csv has no per-job times to write with --no-departure")
        return _no_departure(jobs, groups, truth_model, names, inflate, shuffle_seed, holdout, profiles,
                             json_out, report, dict(trace=str(trace_path), cluster=cluster, truth=truth),
                             keep_trace=inflate_keep_trace)
    bar = _Progress(sys.stderr.isatty() if progress is None else progress)
    results = run_policies(jobs, groups, truth_model, names, seed=seed, load=load, holdout=holdout,
                           profiles_path=profiles, progress=bar, options=options)
    summaries = {r.policy: summarize(r) for r in results}
    click.echo(comparison_table(summaries))
    knowledge = duration_knowledge(options, settings, jobs, summaries)
    click.echo(knowledge["line"])
    learning = {"pairs_every_s": _interval(options.learn_pairs_every_s),
                "durations_every_s": _interval(options.learn_durations_every_s)}
    click.echo("learning: pairs measured reach the policies {}, run times the estimator {}".format(
        *(_interval_text(v) for v in (options.learn_pairs_every_s, options.learn_durations_every_s))))
    payload = {"policies": summaries, "trace": str(trace_path), "cluster": cluster, "truth": truth,
               "seed": seed, "load": load, "jobs": len(jobs), "skipped_jobs": len(skipped),
               "history_runs": len(history), "durations": knowledge, "learning": learning,
               "ratios_to_slurm_default": _ratios(summaries)}
    try:
        if json_out:
            with open(json_out, "w") as handle:
                json.dump(payload, handle, indent=2)
        if jobs_csv:
            write_jobs_csv(jobs_csv, results)
        if report:
            from .report import write_report
            write_report(report, payload, results)
    except OSError as exc:
        raise InputError(f"cannot write {exc.filename}: {exc.strerror}") from None


def duration_knowledge(options, settings, jobs, summaries: dict) -> dict:
    """What the policies knew of durations, said in the output (JSON and one line under the table)."""
    with_limit = sum(1 for j in jobs if j.time_limit)
    if with_limit == len(jobs):
        limits = "every job has a time limit in the trace"
    else:
        missing = f"{len(jobs) - with_limit} of {len(jobs)} jobs have no time limit in the trace"
        limits = (f"{missing}: they get --time-limit {options.time_limit:g} s" if options.time_limit
                  else f"{missing}: no cap, and {settings.default_duration:g} s (--default-duration) "
                       f"before any history")
    errors = next((s["estimator"] for s in summaries.values() if s.get("durations") == "estimated"), None) \
        or next((s["estimator"] for s in summaries.values()), {})
    oracles = sorted(n for n, s in summaries.items() if s.get("durations") == "oracle")
    mare = errors.get("mare")
    line = (f"durations: {options.durations}"
            + (" (the trace's)" if options.durations == "oracle" else
               f" (median of recent{'ly started' if settings.recent_by == 'start' else ''} runs: "
               f"{' > '.join(settings.levels)}"
               + (" to start with, then the order the levels' estimates earned" if settings.adaptive else "")
               + ", capped by the time limit)")
            + f"; {limits}"
            + (f"; estimator: median abs. relative error {mare:.2f}, rank correlation "
               f"{errors.get('rank_corr') or 0:.2f}" if mare is not None else "")
            + (f", levels at the end {errors['order']}" if mare is not None and errors.get("order") else "")
            + (f"; the site's history: {len(options.history)} earlier runs (--history)"
               if options.history and options.durations == "estimated" else "")
            + (f"; true durations: {', '.join(oracles)}" if oracles else ""))
    return {"mode": options.durations, "rule": settings.describe(), "time_limits": limits,
            "default_time_limit": options.time_limit, "default_duration": settings.default_duration,
            "true_durations": oracles, "estimator_error": errors, "line": line}


def _ratios(summaries: dict) -> dict:
    base = summaries.get("slurm-default")
    if not base:
        return {}
    keys = ("makespan", "mean_jct", "p99_jct", "mean_queueing_delay", "effective_utilization")
    return {name: {k: (s[k] / base[k] if base[k] else None) for k in keys} for name, s in summaries.items()}


@click.command("fake-job", context_settings={"ignore_unknown_options": False})
@click.option("--work", "work_s", required=True, type=float, help="seconds of work alone on the GPU")
@click.option("--class", "job_class", default=None, help="job class it emulates (default: $HORUS_FAKE_CLASS)")
@click.option("--truth", default="gavel:v100", show_default=True,
              help="how jobs slow each other down: gavel:<gpu> | observations.csv | none | infeasible")
@click.option("--gpu-type", default=None, help="GPU type of the truth to use (default: the truth's)")
@click.option("--util", type=float, default=None, help="SM utilization it shows alone (default: by model family)")
@click.option("--period", "period_s", type=float, default=0.1, show_default=True,
              help="seconds between two looks at who shares its GPU (at most 0.2)")
def fake_job(work_s, job_class, truth, gpu_type, util, period_s):
    """Payload of a fake GPU job: W seconds of work, slowed down by whoever shares its fake GPU."""
    from .fakejob import run_fake_job

    return run_fake_job(work_s, job_class, truth, gpu_type, util, period_s, argv=sys.argv[1:])


def _gpu_memory(items) -> dict:
    from ..interference.cli import _memory_sizes

    return {model.lower(): mb for model, mb in _memory_sizes(items).items()}


ARRIVAL_KEYS = (("allocated_gpu_pct", "allocated %"), ("arrived_gpu_pct", "arrived %"),
                ("fragmentation_pct", "fragmented %"), ("failed", "failed"), ("seconds", "run s"))


def _no_departure(jobs, groups, truth_model, names, inflate, shuffle_seed, holdout, profiles, json_out,
                  report, meta, keep_trace=False):
    """FGD's protocol for every policy (``sim/arrivals.py``): table, JSON and report."""
    from ..placement.fragmentation import shapes_summary
    from .arrivals import summarize_arrivals
    from .run import run_arrival_policies

    results, offered, measure = run_arrival_policies(jobs, groups, truth_model, names, inflate, shuffle_seed,
                                                     holdout, profiles, keep_trace=keep_trace)
    summaries = {r.policy: summarize_arrivals(r) for r in results}
    rows = [["policy"] + [label for _, label in ARRIVAL_KEYS]]
    for name, summary in summaries.items():
        rows.append([name] + [f"{summary[key]:.2f}" if isinstance(summary[key], float) else str(summary[key])
                              for key, _ in ARRIVAL_KEYS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    click.echo("\n".join(lines))
    payload = {"protocol": "no-departure", "policies": summaries, **meta, "inflate": inflate,
               "inflate_keep_trace": keep_trace, "shuffle_seed": shuffle_seed, "requests": len(offered),
               "cluster_gpus": results[0].n_gpus if results else 0, "typical_shapes": shapes_summary(measure)}
    try:
        if json_out:
            with open(json_out, "w") as handle:
                json.dump(payload, handle, indent=2)
        if report:
            from .report import write_arrival_report
            write_arrival_report(report, payload)
    except OSError as exc:
        raise InputError(f"cannot write {exc.filename}: {exc.strerror}") from None
