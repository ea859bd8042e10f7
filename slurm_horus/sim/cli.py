"""``horus simulate``: replay a trace through every chosen policy and compare them."""

import json
import sys
import time

import click

from ..errors import InputError, check_output_path

DEFAULT_POLICIES = "slurm-default,sjf,sjf-ffs,sjf-bsbf,horus-util,iasp-iapp,oracle,horus"
TABLE_KEYS = (("makespan", "makespan"), ("mean_jct", "mean JCT"), ("p99_jct", "p99 JCT"),
              ("mean_queueing_delay", "mean wait"), ("effective_utilization", "eff.util"),
              ("bad_pair_share", "bad pairs"), ("oom_events", "OOM"))


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


def _fmt(key: str, value: float, unit=("s", 1.0)) -> str:
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
            cell = _fmt(key, summary[key], units[key])
            if base is not None and name != baseline and key not in ("oom_events", "bad_pair_share") and base[key]:
                cell += f" ({summary[key] / base[key]:.2f}x)"
            row.append(cell)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.command("simulate")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False), help="trace file")
@click.option("--trace-format", default="auto",
              type=click.Choice(["auto", "generic", "philly", "gavel", "pollux", "tiresias", "alibaba"]))
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
@click.option("--single-gpu", is_flag=True, help="keep only 1-GPU jobs")
@click.option("--holdout/--no-holdout", default=True, show_default=True,
              help="hide the truth GPU's measured pairs from the policies' priors")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="JSON summary")
@click.option("--jobs-csv", default=None, type=click.Path(dir_okay=False), help="per-job CSV")
@click.option("--report", default=None, type=click.Path(dir_okay=False), help="HTML report")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: if a tty)")
@click.option("--no-departure", is_flag=True,
              help="FGD's protocol: each request tried once at arrival, nothing ends, no queue")
@click.option("--inflate", default=0.0, type=float,
              help="with --no-departure: draw requests with replacement until they ask X x the cluster's GPUs")
@click.option("--shuffle-seed", default=None, type=int, help="with --no-departure: seed of the draw / order")
@click.option("--gpu-memory-mb", "gpu_memory", multiple=True, metavar="MODEL=MB",
              help="memory of one GPU of MODEL (repeatable), e.g. --gpu-memory-mb G2=32768")
def simulate(trace_path, trace_format, traces_dir, cluster, truth, profiles, policies, seed, load, max_jobs,
             single_gpu, holdout, json_out, jobs_csv, report, progress, no_departure, inflate, shuffle_seed,
             gpu_memory):
    """Replay a trace through several placement policies on one simulated cluster."""
    from .metrics import summarize, write_jobs_csv
    from .run import parse_cluster, run_policies
    from .traces import read_trace
    from .truth import load_truth

    for path, option in ((json_out, "--json"), (jobs_csv, "--jobs-csv"), (report, "--report")):
        check_output_path(path, option)
    if (inflate or shuffle_seed is not None) and not no_departure:
        raise InputError("--inflate and --shuffle-seed go with --no-departure (FGD's protocol)")
    if inflate < 0:
        raise InputError("--inflate must be positive")
    truth_model = load_truth(truth, profiles)
    groups = parse_cluster(cluster, _gpu_memory(gpu_memory))
    gpu_type = groups[0].gpu_type
    jobs = read_trace(trace_path, trace_format, traces_dir=traces_dir,
                      solo_tput=lambda cls: truth_model.solo_tput(cls, gpu_type))
    if single_gpu:
        jobs = [j for j in jobs if j.num_gpus == 1]
    if max_jobs:
        jobs = sorted(jobs, key=lambda j: j.submit_time)[:max_jobs]
    if not jobs:
        raise InputError(f"{trace_path}: no jobs to simulate")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if no_departure:
        if jobs_csv:
            raise InputError("--jobs-csv has no per-job times to write with --no-departure")
        return _no_departure(jobs, groups, truth_model, names, inflate, shuffle_seed, holdout, profiles,
                             json_out, report, dict(trace=str(trace_path), cluster=cluster, truth=truth))
    bar = _Progress(sys.stderr.isatty() if progress is None else progress)
    results = run_policies(jobs, groups, truth_model, names, seed=seed, load=load, holdout=holdout,
                           profiles_path=profiles, progress=bar)
    summaries = {r.policy: summarize(r) for r in results}
    click.echo(comparison_table(summaries))
    payload = {"policies": summaries, "trace": str(trace_path), "cluster": cluster, "truth": truth,
               "seed": seed, "load": load, "jobs": len(jobs),
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


def _ratios(summaries: dict) -> dict:
    base = summaries.get("slurm-default")
    if not base:
        return {}
    keys = ("makespan", "mean_jct", "p99_jct", "mean_queueing_delay", "effective_utilization")
    return {name: {k: (s[k] / base[k] if base[k] else None) for k in keys} for name, s in summaries.items()}


def _gpu_memory(items) -> dict:
    from ..interference.cli import _memory_sizes

    return {model.lower(): mb for model, mb in _memory_sizes(items).items()}


ARRIVAL_KEYS = (("allocated_gpu_pct", "allocated %"), ("arrived_gpu_pct", "arrived %"),
                ("fragmentation_pct", "fragmented %"), ("failed", "failed"), ("seconds", "run s"))


def _no_departure(jobs, groups, truth_model, names, inflate, shuffle_seed, holdout, profiles, json_out,
                  report, meta):
    """FGD's protocol for every policy (``sim/arrivals.py``): table, JSON and report."""
    from ..placement.fragmentation import shapes_summary
    from .arrivals import summarize_arrivals
    from .run import run_arrival_policies

    results, offered, measure = run_arrival_policies(jobs, groups, truth_model, names, inflate, shuffle_seed,
                                                     holdout, profiles)
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
               "shuffle_seed": shuffle_seed, "requests": len(offered),
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
