"""``horus replay``: a trace on a real local Slurm cluster per policy, beside the simulator's prediction."""

import json
import re
import sys
from pathlib import Path

import click

from ..errors import InputError
from ..sim.cli import text_table

TABLE = (("makespan", "makespan"), ("mean_jct", "mean JCT"), ("median_jct", "median JCT"),
         ("p99_jct", "p99 JCT"), ("mean_queueing_delay", "mean wait"), ("shared_share", "shared"))


def parse_replay_cluster(spec, default_gpu_type):
    """``2x4`` or ``2x4:v100`` -> (nodes, GPUs per node, GPU type)."""
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*(?::\s*([A-Za-z0-9_-]+))?\s*", spec or "")
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise InputError(f"--cluster {spec!r}: expected NODESxGPUS[:TYPE], e.g. 2x4")
    return int(match.group(1)), int(match.group(2)), (match.group(3) or default_gpu_type).lower()


def _cell(key, value):
    if key == "shared_share":
        return f"{value:.3f}"
    return f"{value / 3600:.2f}h"


def side_by_side(payload):
    """One row per policy and side (live, sim), with live/sim ratios."""
    header = ["policy", "run"] + [label for _, label in TABLE]
    rows = [header]
    for name, entry in payload["policies"].items():
        for side in ("live", "sim", "sim_ideal"):
            label = {"sim": "sim (live cadence)", "sim_ideal": "sim (ideal)"}.get(side, side)
            rows.append([name if side == "live" else "", label] + [_cell(k, entry[side][k]) for k, _ in TABLE])
        ratio = entry["live_vs_sim"]
        rows.append(["", "live/sim"] + [f"{ratio[k]:.2f}" if ratio.get(k) else "-" for k, _ in TABLE])
    return text_table(rows)


@click.command("replay")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False), help="trace file")
@click.option("--trace-format", default="auto",
              type=click.Choice(["auto", "generic", "philly", "gavel", "pollux", "tiresias", "alibaba"]))
@click.option("--truth", default="gavel:v100", show_default=True,
              help="how jobs slow each other down: gavel:<gpu> | observations.csv | none | infeasible")
@click.option("--cluster", default="2x4", show_default=True, help="NODESxGPUS[:TYPE] of the local cluster")
@click.option("--policy", "policies", default="slurm-default,horus", show_default=True,
              help="comma-separated; slurm-default = plain Slurm, others = horusd with that policy")
@click.option("--speedup", default=200.0, show_default=True, type=float,
              help="arrivals and durations are divided by this")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the classes given to class-less jobs")
@click.option("--load", default=1.0, show_default=True, type=float, help="arrival-rate multiplier")
@click.option("--max-jobs", default=0, type=int, help="use only the first N jobs of the trace (0 = all)")
@click.option("--single-gpu", is_flag=True, help="keep only 1-GPU jobs")
@click.option("--history-dir", default=None, type=click.Path(file_okay=False),
              help="keep per policy POLICY.db: sacct, stand-in GPU samples, horusd's decisions (for horus report)")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="put the clusters' directories here and keep them (default: temporary)")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="JSON summary")
@click.option("--report", default=None, type=click.Path(dir_okay=False), help="HTML report")
def replay_command(trace_path, trace_format, truth, cluster, policies, speedup, seed, load, max_jobs, single_gpu,
                   history_dir, work_dir, json_out, report):
    """Replay a trace on real Slurm (one local cluster per policy) with fake GPU jobs that slow down as
    the truth says; figures from sacct next to the simulator's."""
    from ..placement.policies import reads_truth
    from ..sim.run import prepare_trace
    from ..sim.traces import read_trace
    from ..sim.truth import load_truth
    from .run import ReplaySetup, replay

    truth_model = load_truth(truth)
    gpu_type_default = truth[len("gavel:"):] if truth.startswith("gavel:") else \
        (truth_model.gpu_types[0] if truth_model.gpu_types else "v100")
    nodes, gpus, gpu_type = parse_replay_cluster(cluster, gpu_type_default)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise InputError("--policy: no policy given")
    for name in names:
        if reads_truth(name):
            raise InputError(f"--policy {name}: it reads the simulator's truth (the oracle, or an oracle_* "
                             f"option); horusd cannot run it live")
    jobs = read_trace(trace_path, trace_format, solo_tput=lambda cls: truth_model.solo_tput(cls, gpu_type))
    if single_gpu:
        jobs = [j for j in jobs if j.num_gpus == 1]
    if max_jobs:
        jobs = sorted(jobs, key=lambda j: j.submit_time)[:max_jobs]
    jobs = prepare_trace(jobs, truth_model, seed, load, nodes * gpus)
    if not jobs:
        raise InputError(f"{trace_path}: no jobs to replay")
    # the fake jobs load the truth themselves, from the jobs' working directory: a file by its full path
    truth_spec = truth if truth in ("none", "infeasible") or truth.startswith("gavel:") else str(Path(truth).resolve())
    setup = ReplaySetup(jobs, truth_model, truth_spec, nodes, gpus, gpu_type, speedup=speedup,
                        history_dir=history_dir, work_dir=work_dir)
    payload, runs = replay(setup, names, progress=lambda line: click.echo(line, err=True))
    payload.update(trace=str(trace_path), seed=seed, load=load)
    click.echo(side_by_side(payload))
    if json_out:
        with open(json_out, "w") as handle:
            json.dump(payload, handle, indent=2)
    if report:
        from .report import write_report

        write_report(report, payload, setup, runs)
    sys.stdout.flush()
