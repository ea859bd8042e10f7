"""``horus demo``: the end-to-end tour on a real local cluster, one numbered step at a time.

Each step is a :class:`Step` in :data:`STEPS`: a local Slurm cluster with accounting, horusd and the
placing job_submit.lua; a mixed deep-learning workload (fake GPU jobs of Gavel's V100 classes)
submitted with plain ``sbatch`` and with ``horus-sbatch``; who shares which GPU and why; what sacct
recorded; the utilization report; then ``horus replay`` of a short Philly workload on two fresh
clusters (plain Slurm, horus) beside the simulator's prediction. Teardown always runs.
"""

import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import click

from .jobclass import job_class_of
from .localcluster import LocalCluster
from .localcluster.horus import wait_refreshed
from .tokens import parse_horus_tokens

# A fake deep-learning job: it claims a GPU utilization that the stand-in NVML of `horus collect`
# reads from its environment (there is no GPU here), and sleeps.
JOB_SCRIPT = """#!/bin/sh
echo "node=$SLURMD_NODENAME job_gpus=${SLURM_JOB_GPUS:--} gpu_device_ordinal=${GPU_DEVICE_ORDINAL:--}"
export HORUS_FAKE_GPU_UTIL=${DEMO_UTIL:-50}
sleep ${DEMO_SECONDS:-12}
"""

# the utilization each class claims (a memory-bound recommender keeps the GPU less busy)
DEMO_UTIL = {"resnet50-bs64": 90, "lm-bs20": 70, "transformer-bs64": 80, "cyclegan": 85,
             "recommendation-bs2048": 35, "resnet18-bs16": 60, "resnet18-bs32": 55, "resnet18-bs64": 65,
             "transformer-bs32": 60}

# (label, how, class or None, extra sbatch options): the sbatch jobs fill the cluster's 8 GPUs, so
# the four horus-sbatch jobs arrive under pressure, where sharing is on the table.
WORKLOAD = [
    ("resnet50", "sbatch", "resnet50-bs64", []),
    ("lm", "sbatch", "lm-bs20", []),
    ("transformer", "sbatch", "transformer-bs64", []),
    ("cyclegan", "sbatch", "cyclegan", []),
    ("recommend-1", "sbatch", "recommendation-bs2048", []),
    ("unknown-1", "sbatch", None, []),
    ("two-gpus", "sbatch", "resnet18-bs16", ["--gres=gpu:2"]),
    ("resnet18-a", "horus-sbatch", "resnet18-bs32", []),
    ("resnet18-b", "horus-sbatch", "resnet18-bs64", []),
    ("recommend-2", "horus-sbatch", "recommendation-bs2048", []),
    ("transformer-s", "horus-sbatch", "transformer-bs32", []),
]


@dataclass
class DemoContext:
    """What the steps share: the cluster, the demo's jobs (label -> (job id, request)), output."""

    echo: Callable[[str], None]
    cluster: LocalCluster = None
    jobs: Dict[str, tuple] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    collectors: object = None  # the stand-in NVML collectors (localcluster.collectors), one per node


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[DemoContext], None]


def start_cluster(ctx):
    ctx.cluster = LocalCluster(directory=ctx.options.get("directory"), nodes=2, gpus=4, with_dbd=True,
                               horus=True).up()
    timings = ctx.cluster.timings
    ctx.echo(f"    2 nodes x 4 fake GPUs (g0..g3, 2 shards each) + slurmdbd + horusd (policy horus, binding "
             f"shard) in {timings['up_s']:.1f} s under {ctx.cluster.root}")
    ctx.echo(f"    {ctx.cluster.export_line()}")


def _script_file(ctx):
    path = ctx.cluster.root / "jobs" / "demo-job.sh"
    path.write_text(JOB_SCRIPT)
    return path


def _util_export(job_class):
    return f"--export=ALL,DEMO_UTIL={DEMO_UTIL.get(job_class, 20)}"


def submit_with_sbatch(ctx, label, job_class, extra):
    args = (extra or ["--gres=gpu:1"]) + [f"--job-name={label}", _util_export(job_class)]
    if job_class:
        args.append(f"--comment=class={job_class}")
    job_id = ctx.cluster.sbatch(args, JOB_SCRIPT)
    shown = [a for a in args if not a.startswith("--export")]
    ctx.jobs[label] = (job_id, " ".join(a for a in shown if not a.startswith("--job-name")))
    ctx.echo(f"    sbatch {' '.join(shown):70} -> job {job_id}")


def horus_sbatch(ctx, args):
    env = dict(ctx.cluster.env, HORUS_CONFIG=str(ctx.cluster.horus_config))
    return subprocess.run([sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def submit_with_horus_sbatch(ctx, label, job_class, extra):
    args = ["--parsable", f"--job-name={label}", f"--output={ctx.cluster.root}/jobs/slurm-%j.out",
            f"--chdir={ctx.cluster.root}/jobs", "--horus-class", job_class, _util_export(job_class),
            *(extra or ["--gres=gpu:1"])]
    result = horus_sbatch(ctx, args + [str(_script_file(ctx))])
    if result.returncode != 0:
        raise click.ClickException(f"horus-sbatch failed: {result.stderr.strip()}")
    job_id = int(result.stdout.strip().split(";")[0])
    ctx.jobs[label] = (job_id, f"--horus-class {job_class}")
    note = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    ctx.echo(f"    horus-sbatch --horus-class {job_class:56} -> job {job_id}  {note}")


def horus_command(ctx, args, **kwargs):
    env = dict(ctx.cluster.env, HORUS_CONFIG=str(ctx.cluster.horus_config))
    return subprocess.run([sys.executable, "-m", "slurm_horus", *args], env=env, capture_output=True, text=True,
                          timeout=kwargs.get("timeout", 120), cwd=str(ctx.cluster.root))


def start_collectors(ctx):
    """One stand-in NVML collector per node, as a site runs `horus collect` on each GPU node."""
    from .localcluster.collectors import StandinCollectors

    env = dict(ctx.cluster.env, HORUS_CONFIG=str(ctx.cluster.horus_config))
    ctx.collectors = StandinCollectors(ctx.cluster, env=env, ship_to=lambda node: _shipping(ctx, node)).start()
    ctx.echo(f"    horus collect --backend standin on {', '.join(ctx.cluster.node_names())} "
             "(NVML stand-in: these fake GPUs report what the jobs claim)")
    ctx.echo(f"      shipping with --ship-to {ctx.cluster.ship_to} (horus receive, the one writer of the "
             "history db; each node's munged signs its batches)")


def _shipping(ctx, node):
    """A collector ships to the cluster's receiver, signed by its own node's munged."""
    return ["--ship-to", ctx.cluster.ship_to, "--munge-socket", str(ctx.cluster.layout.node_munge_socket(node))]


def stop_collectors(ctx):
    if ctx.collectors is not None:
        ctx.collectors.stop()
        ctx.collectors = None


def submit_workload(ctx):
    start_collectors(ctx)
    first = [entry for entry in WORKLOAD if entry[1] == "sbatch"]
    for label, how, job_class, extra in first:
        submit_with_sbatch(ctx, label, job_class, extra)
    running = [ctx.jobs[label][0] for label, *_ in first]
    ctx.cluster.wait_jobs(running, states={"RUNNING"}, timeout=60)
    wait_refreshed(ctx.cluster)  # horusd sees them running
    explain = horus_sbatch(ctx, ["--explain", "--dry-run", "--horus-class", "resnet18-bs32", "--gres=gpu:1",
                                 str(_script_file(ctx))])
    ctx.echo("    horus-sbatch --explain --dry-run --horus-class resnet18-bs32 (nothing submitted):")
    for line in (explain.stderr + explain.stdout).splitlines():
        if line.strip() and not line.startswith(("#!", "echo", "sleep")):
            ctx.echo(f"      | {line}")
    for label, how, job_class, extra in WORKLOAD[len(first):]:
        submit_with_horus_sbatch(ctx, label, job_class, extra)
        time.sleep(0.2)


def _placed_jobs_started(ctx):
    """The queue once every job horus pinned has started (a loaded machine takes a few seconds for the
    last ones; jobs left to Slurm may wait for a GPU and are shown PENDING), or after 20 s."""
    wanted = {job_id for job_id, _ in ctx.jobs.values()}
    deadline = time.monotonic() + 20
    while True:
        queue = {job.job_id: job for job in ctx.cluster.queue() if job.job_id in wanted}
        waiting = [job for job in queue.values() if job.state == "PENDING"
                   and parse_horus_tokens(job.admin_comment)[1].get("gpus")]
        if not waiting or time.monotonic() > deadline:
            return queue
        time.sleep(0.2)


def show_sharing(ctx):
    queue = _placed_jobs_started(ctx)
    by_gpu = {}
    ctx.echo(f"    {'job':>4} {'label':14} {'class':22} {'state':8} {'GPU':9} {'mode':9} {'predicted':>9}")
    for label, (job_id, _request) in ctx.jobs.items():
        job = queue.get(job_id)
        if job is None:
            continue
        _decision_id, token = parse_horus_tokens(job.admin_comment)
        where = []
        for node, items in job.gres_by_node():
            for item in items:
                if item.name in ("gpu", "shard"):
                    where += [f"{node}:{index}" for index in item.indices]
        for gpu in where:
            by_gpu.setdefault(gpu, []).append(label)
        job_class = job_class_of(comment=job.comment, admin_comment=job.admin_comment)
        how = token.get("mode") or ("user" if job.state == "RUNNING" else "-")
        predicted = f"{float(token['slowdown']):.2f}x" if token.get("slowdown") else "-"
        ctx.echo(f"    {job_id:>4} {label:14} {job_class:22} {job.state:8} {','.join(where) or '-':9} "
                 f"{how:9} {predicted:>9}")
    shared = {gpu: labels for gpu, labels in by_gpu.items() if len(labels) > 1}
    for gpu, labels in sorted(shared.items()):
        ctx.echo(f"    GPU {gpu} is shared by {' + '.join(labels)}")
    reasons = [line.split("lua: ", 1)[1] for line in (ctx.cluster.root / "log" / "slurmctld.log").read_text()
               .splitlines() if "lua: horus: job" in line and "unchanged" in line]
    for line in reasons[-3:]:
        ctx.echo(f"    why a job was left to Slurm: {line}")


def show_accounting(ctx):
    wanted = [job_id for job_id, _ in ctx.jobs.values()]
    deadline = time.monotonic() + 60
    while True:  # slurmctld reports finished jobs to slurmdbd a moment after they end
        records = {j.job_id: j for j in ctx.cluster.accounting(wanted)}
        if all(j in records and records[j].end_time for j in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    header = f"    {'job':>5}  {'label':14} {'node':5} {'state':10} {'sacct AllocTRES gres':34} {'GPU idx'}"
    ctx.echo(header)
    for label, (job_id, _request) in ctx.jobs.items():
        record = records.get(job_id)
        if record is None:
            ctx.echo(f"    {job_id:>5}  {label:14} (not in sacct yet)")
            continue
        gres = ",".join(f"{name}={count}" for name, count in sorted(record.gres_counts().items()))
        indices = ",".join(map(str, record.gpu_indices()))
        if not indices:
            # sacct records a shard without its GPU; the job itself was told (GPU_DEVICE_ORDINAL).
            seen = ctx.cluster.job_output(job_id).split("gpu_device_ordinal=")[-1].strip()
            indices = f"{seen} (job env)"
        ctx.echo(f"    {job_id:>5}  {label:14} {record.nodes:5} {record.state:10} {gres:34} {indices}")


def wait_for_workload(ctx):
    job_ids = [job_id for job_id, _ in ctx.jobs.values()]
    states = ctx.cluster.wait_jobs(job_ids, timeout=180)
    done = sum(state == "COMPLETED" for state in states.values())
    ctx.echo(f"    {done} of {len(job_ids)} jobs COMPLETED (the ones that waited ran when a GPU freed)")


def utilization_report(ctx):
    stop_collectors(ctx)
    wanted = [job_id for job_id, _ in ctx.jobs.values()]
    deadline = time.monotonic() + 60
    while len(ctx.cluster.accounting(wanted)) < len(wanted) and time.monotonic() < deadline:
        time.sleep(0.5)  # slurmdbd stores finished jobs a moment after they end
    ingest = horus_command(ctx, ["ingest", "--slurm-conf", str(ctx.cluster.slurm_conf), "--since", "2020-01-01",
                                 "--no-progress"])
    ctx.echo(f"    horus ingest: {ingest.stdout.strip() or ingest.stderr.strip()}")
    for args in (["report", "users"], ["report", "job", str(ctx.jobs["resnet18-b"][0])]):
        result = horus_command(ctx, args)
        ctx.echo(f"    horus {' '.join(args)}")
        for line in (result.stdout or result.stderr).rstrip().splitlines():
            ctx.echo(f"      {line}")
    html = ctx.cluster.root / "report-users.html"
    horus_command(ctx, ["report", "users", "--html", str(html)])
    ctx.echo(f"    HTML report with plots: {html}")


def replay_short_workload(ctx):
    """The story end to end: the same short Philly workload on real Slurm, plain and with horus, each
    on its own fresh cluster, next to what the simulator predicts for it (``horus replay``)."""
    from .replay.cli import side_by_side
    from .replay.run import ReplaySetup, replay
    from .replay.workload import philly_like
    from .sim.run import prepare_trace
    from .sim.truth import load_truth

    truth = load_truth("gavel:v100")
    # 16 jobs of 1 min - 1 h arriving at 3x what 8 GPUs do (a queue builds up), run 300x faster
    n_jobs, load, speedup = 16, 3.0, 300.0
    trace = philly_like(n_jobs, load=load, n_gpus=8, seed=1)
    jobs = prepare_trace(trace, truth, 0, 1.0, 8)
    history = ctx.cluster.root / "replay"
    setup = ReplaySetup(jobs, truth, "gavel:v100", 2, 4, "v100", speedup=speedup, history_dir=history)
    ctx.echo(f"    horus replay: {n_jobs} Philly jobs of 1-60 min (offered load {load:g} on 8 GPUs), x{speedup:g} "
             "speed, fake jobs that slow down as Gavel's V100 pairs say (truth gavel:v100)")

    def progress(line):
        if "up in" in line or "live makespan" in line:
            ctx.echo(f"      {line}")

    payload, _runs = replay(setup, ["slurm-default", "horus"], progress=progress)
    for line in side_by_side(payload).splitlines():
        ctx.echo(f"      {line}")
    ratios = payload["ratios_to_slurm_default"]["horus"]
    ctx.echo(f"    horus vs plain Slurm, mean JCT: live {ratios['live']['mean_jct'] - 1:+.0%} (sacct), "
             f"simulated {ratios['sim']['mean_jct'] - 1:+.0%} (the same placement core, told what horusd knows "
             f"and how late each live scheduler acts at x{speedup:g}; acting at once: "
             f"{ratios['sim_ideal']['mean_jct'] - 1:+.0%})")
    result = horus_command(ctx, ["report", "users", "--db", str(history / "horus.db")])
    ctx.echo(f"    horus report users --db {history / 'horus.db'}   (sacct + GPU samples of the horus replay)")
    for line in (result.stdout or result.stderr).rstrip().splitlines():
        ctx.echo(f"      {line}")


STEPS: List[Step] = [
    Step("start a local Slurm cluster: fake GPUs, accounting, horusd + job_submit.lua", start_cluster),
    Step("submit a mixed deep-learning workload with sbatch and horus-sbatch", submit_workload),
    Step("who shares which GPU, and why", show_sharing),
    Step("let the jobs finish", wait_for_workload),
    Step("sacct: which GPUs each job had", show_accounting),
    Step("utilization report from sacct + the GPU samples (horus ingest, horus report)", utilization_report),
    Step("sim-to-real: a short Philly workload on real Slurm, plain vs horus, beside the simulator",
         replay_short_workload),
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
        if ctx.collectors is not None:
            ctx.collectors.kill()
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
    """The tour: local cluster with horusd, a mixed GPU workload, sharing, sacct, simulator; tear down."""
    run_demo(directory=directory, keep=keep)
