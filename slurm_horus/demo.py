"""``horus demo``: the end-to-end tour on a real local cluster, one numbered step at a time.

Each step is a :class:`Step` in :data:`STEPS`; later features add theirs (horusd with the placing
job_submit.lua, horus-sbatch, the report, the simulator) to that list. Teardown always runs.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import click

from .localcluster import LocalCluster

JOB_SCRIPT = """#!/bin/sh
echo "node=$SLURMD_NODENAME job_gpus=${SLURM_JOB_GPUS:--} gpu_device_ordinal=${GPU_DEVICE_ORDINAL:--}"
sleep 2
"""


@dataclass
class DemoContext:
    """What the steps share: the cluster, the demo's jobs (label -> (job id, request)), output."""

    echo: Callable[[str], None]
    cluster: LocalCluster = None
    jobs: Dict[str, tuple] = field(default_factory=dict)
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[DemoContext], None]


def start_cluster(ctx):
    ctx.cluster = LocalCluster(directory=ctx.options.get("directory"), with_dbd=True).up()
    timings = ctx.cluster.timings
    ctx.echo(f"    4 nodes x 4 fake GPUs (g0..g3, 2 shards each) + slurmdbd in {timings['up_s']:.1f} s "
             f"({'cached' if timings.get('golden_db') else 'fresh'} accounting DB) under {ctx.cluster.root}")
    ctx.echo(f"    {ctx.cluster.export_line()}")


def submit(ctx, label, args):
    job_id = ctx.cluster.sbatch(args + [f"--job-name={label}"], JOB_SCRIPT)
    ctx.jobs[label] = (job_id, " ".join(args))
    ctx.echo(f"    sbatch {' '.join(args)}  ->  job {job_id}")


def run_gpu_and_shard_jobs(ctx):
    submit(ctx, "two-gpus", ["--gres=gpu:2"])
    submit(ctx, "shard", ["--gres=shard:1"])
    states = ctx.cluster.wait_jobs([job_id for job_id, _ in ctx.jobs.values()], timeout=120)
    for label, (job_id, _) in ctx.jobs.items():
        ctx.echo(f"    job {job_id} {states[job_id]}: {ctx.cluster.job_output(job_id).strip()}")


def show_accounting(ctx):
    wanted = [job_id for job_id, _ in ctx.jobs.values()]
    deadline = time.monotonic() + 60
    while True:  # slurmctld reports finished jobs to slurmdbd a moment after they end
        records = {j.job_id: j for j in ctx.cluster.accounting(wanted)}
        if all(j in records and records[j].end_time for j in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    header = f"    {'job':>5}  {'request':14} {'node':5} {'state':10} {'sacct AllocTRES gres':34} {'GPU idx'}"
    ctx.echo(header)
    for label, (job_id, request) in ctx.jobs.items():
        record = records.get(job_id)
        if record is None:
            ctx.echo(f"    {job_id:>5}  {request:14} (not in sacct yet)")
            continue
        gres = ",".join(f"{name}={count}" for name, count in sorted(record.gres_counts().items()))
        indices = ",".join(map(str, record.gpu_indices()))
        if not indices:
            # sacct records a shard without its GPU; the job itself was told (GPU_DEVICE_ORDINAL).
            seen = ctx.cluster.job_output(job_id).split("gpu_device_ordinal=")[-1].strip()
            indices = f"{seen} (job env)"
        ctx.echo(f"    {job_id:>5}  {request:14} {record.nodes:5} {record.state:10} {gres:34} {indices}")


STEPS: List[Step] = [
    Step("start a local Slurm 22.05 cluster with fake GPUs and accounting", start_cluster),
    Step("run a 2-GPU job and a shard job", run_gpu_and_shard_jobs),
    Step("sacct: which GPUs each job had", show_accounting),
]


def run_demo(steps=None, echo=click.echo, directory=None, keep=False, cluster=None):
    """Run ``steps`` (default :data:`STEPS`) in order, then tear the cluster down (unless ``keep``).

    With a running ``cluster`` (tests), the start step is skipped and the cluster is left running.
    """
    steps = STEPS if steps is None else steps
    ctx = DemoContext(echo=echo, options={"directory": directory}, cluster=cluster)
    if cluster is not None:
        steps = [step for step in steps if step.run is not start_cluster]
        keep = True
    started = time.monotonic()
    try:
        for number, step in enumerate(steps, 1):
            echo(f"[{number}/{len(steps)}] {step.title}")
            step_started = time.monotonic()
            step.run(ctx)
            echo(f"    ({time.monotonic() - step_started:.1f} s)")
    finally:
        if ctx.cluster is not None:
            if keep:
                echo(f"cluster left running: horus local-cluster down --dir {ctx.cluster.root}")
            else:
                survivors = ctx.cluster.down()
                echo(f"cluster stopped; processes left behind: {survivors}" if survivors
                     else "cluster stopped; no process left behind")
    echo(f"demo finished in {time.monotonic() - started:.1f} s")
    return ctx


@click.command("demo")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="cluster directory (default: a temp dir)")
@click.option("--keep", is_flag=True, help="leave the cluster running at the end")
def demo(directory, keep):
    """Bring up a local cluster, run GPU and shard jobs, show their GPUs from sacct, tear down."""
    run_demo(directory=directory, keep=keep)
