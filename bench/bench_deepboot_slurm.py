"""DeepBoot on real Slurm 22.05 (the local cluster, hpc_configs/slurm.conf.deepboot): how fast an
inference burst gets lent GPUs back, and what happens to the borrower.

Needs no shared data (root and the Slurm packages, as ``make test``). One cluster of 2 nodes × 2 fake
GPUs: n1 training, n2 inference (``infer``, tier 10), ``infer-lend`` over n2 and ``train-lend`` over
both at tier 1 with PreemptMode=REQUEUE and GraceTime=10 s. Rounds interleave the ways of reclaiming:

* ``preempt``: a borrower running ``hpc_configs/deepboot-train-example.sh`` (its work as a job step,
  checkpoint on SIGTERM, then ``scontrol requeue`` of itself) holds both inference GPUs; a burst of two
  1-GPU inference jobs is submitted; measured: submission → both RUNNING, checkpoint → the job's
  next start, and whether it resumed at its checkpoint (steps lost) and completed;
* ``preempt_no_step``: the same with the work in the batch script itself (no job step): Slurm
  signals it only when the GraceTime ends;
* ``shrink``: a 2-node job in ``train-lend`` (``hpc_configs/deepboot-shrinkable-example.sh``) is asked
  to shrink (``scancel --batch --signal=USR1``; it runs ``scontrol update NumNodes=1`` on itself between
  two steps) and, once it holds n1 alone, a 2-GPU inference job is submitted: signal → RUNNING.
* ``horusd`` (a second cluster, with job_submit.lua and horusd, ``policy = deepboot``): two 1-GPU
  borrowers of the example on n2, the older one at a lower job priority (``--nice``: Slurm on its own
  would preempt it); one inference job. horusd's reclaim (the scheduling cycle's step, as in the
  simulator) chooses the most recently started borrower and pins the inference job to its GPU:
  measured: submission → RUNNING, which borrower Slurm requeued, and that both complete;
  ``horusd_off_slurm_picks``: the same inference job opted out (``horus=off``): Slurm's own victim.

``--rounds N`` (default 3). Prints one JSON document: per mode every sample, the median and the
maximum; jobs lost. The machine is shared: compare medians, and rerun when the maxima disagree.
"""

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_horus.localcluster import LocalCluster  # noqa: E402
from slurm_horus.localcluster.files import deepboot_conf  # noqa: E402

EXAMPLE = ROOT / "hpc_configs" / "deepboot-train-example.sh"
SHRINKABLE = ROOT / "hpc_configs" / "deepboot-shrinkable-example.sh"
GRACE_S = 10
STEPS = 200


def states(cluster, job_ids):
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)), "-o", "%i %T %N"]).stdout
    return {int(f[0]): f[1:] for f in (line.split() for line in out.splitlines())}


def wait(predicate, timeout, poll=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    return None


def finish(cluster, job_ids):
    """Cancel what a sample left running (a stuck job must not hold the next sample's GPUs)."""
    left = [j for j, s in states(cluster, job_ids).items() if s[0] in ("PENDING", "RUNNING", "REQUEUED")]
    if left:
        cluster.run(["scancel", *map(str, left)], check=False)
        wait(lambda: not any(s[0] in ("PENDING", "RUNNING", "COMPLETING") for s in states(cluster, left).values()), 60)
    return left


def reclaim_by_preemption(cluster, with_step):
    script = EXAMPLE.read_text()
    if not with_step:
        script = script.replace('if [ "${DEEPBOOT_STEP:-}" != 1 ]; then', 'if false; then')
    borrower = cluster.sbatch(["-p", "infer-lend", "--requeue", "--open-mode=append", "--gres=gpu:2",
                               f"--export=ALL,STEPS={STEPS},STEP_S=0.1"], script)
    ckpt = cluster.root / "jobs" / f"ckpt-{borrower}"
    wait(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 10, 60)
    t0 = time.monotonic()
    burst = [cluster.sbatch(["-p", "infer", "--gres=gpu:1"], "#!/bin/sh\nsleep 3\n") for _ in range(2)]
    ran = wait(lambda: all(s[0] in ("RUNNING", "COMPLETED") for s in states(cluster, burst).values()), 60)
    reclaim = time.monotonic() - t0 if ran else None
    done = wait(lambda: states(cluster, [borrower]).get(borrower, ["?"])[0]
                in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 180, poll=0.25)
    out = cluster.job_output(borrower)
    checkpoints = re.findall(r"checkpoint step=(\d+) at ([\d.]+)", out)
    starts = re.findall(r"start run=\d+ step=(\d+) .* at ([\d.]+)", out)
    final = states(cluster, [borrower]).get(borrower, ["?"])[0] if done else "still running"
    saved = int(checkpoints[0][0]) if checkpoints else None
    resumed_at = int(starts[1][0]) if len(starts) > 1 else None
    restart = float(starts[1][1]) - float(checkpoints[0][1]) if checkpoints and len(starts) > 1 else None
    finish(cluster, [borrower, *burst])
    return {"reclaim_s": round(reclaim, 2) if reclaim is not None else None,
            "checkpoint_step": saved, "resumed_at_step": resumed_at,
            "steps_lost": saved - resumed_at if saved is not None and resumed_at is not None else None,
            "restart_after_checkpoint_s": round(restart, 1) if restart is not None else None,
            "borrower_state": final, "completed_all_steps": f"done step={STEPS}" in out}


def reclaim_through_horusd(cluster, slurm_picks=False):
    script = EXAMPLE.read_text()
    borrowers = []
    for nice in (100, 0):  # the older one first, at the lower priority
        borrowers.append(cluster.sbatch(["-p", "infer-lend", "--requeue", "--open-mode=append", "--gres=gpu:1",
                                         f"--nice={nice}", "--comment=class=resnet50-bs64",
                                         f"--export=ALL,STEPS={STEPS},STEP_S=0.1"], script))
        wait(lambda: states(cluster, borrowers).get(borrowers[-1], ["?"])[0] == "RUNNING", 60)
        time.sleep(1.5)  # distinct start times (squeue's are in seconds)
    ckpts = [cluster.root / "jobs" / f"ckpt-{b}" for b in borrowers]
    wait(lambda: all(c.exists() and int(c.read_text() or 0) >= 10 for c in ckpts), 60)
    t0 = time.monotonic()
    inference = cluster.sbatch(["-p", "infer", "--gres=gpu:1", "--comment=class=lm-bs20" + (" horus=off" if slurm_picks else "")], "#!/bin/sh\nsleep 3\n")
    ran = wait(lambda: states(cluster, [inference]).get(inference, ["?"])[0] in ("RUNNING", "COMPLETED"), 60)
    reclaim = time.monotonic() - t0 if ran else None
    done = wait(lambda: all(s[0] in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
                            for s in states(cluster, borrowers).values()), 180, poll=0.25)
    outs = [cluster.job_output(b) for b in borrowers]
    horusd_log = (cluster.root / "log" / "horusd.log").read_text()
    chosen = re.findall(r"horus: reclaim: partition infer takes the GPUs of (\S+)", horusd_log)  # the last one: this sample's
    final = [s[0] for s in states(cluster, borrowers).values()] if done else ["still running"]
    finish(cluster, [*borrowers, inference])
    return {"reclaim_s": round(reclaim, 2) if reclaim is not None else None,
            "horusd_chose": chosen[-1] if chosen and not slurm_picks else None, "younger": str(borrowers[1]),
            "requeued": [str(b) for b, out in zip(borrowers, outs) if "checkpoint step=" in out],
            "borrower_states": final, "completed_all_steps": all(f"done step={STEPS}" in out for out in outs)}


def reclaim_by_shrink(cluster):
    job = cluster.sbatch(["-p", "train-lend", "-N2", "--gres=gpu:2", "--export=ALL,EPOCHS=40,EPOCH_S=0.3"],
                         SHRINKABLE.read_text())
    wait(lambda: states(cluster, [job]).get(job, ["?"])[0] == "RUNNING", 60)
    out_file = cluster.root / "jobs" / f"slurm-{job}.out"  # its first step runs on both nodes
    wait(lambda: out_file.exists() and "epoch 0 on n[1-2]" in out_file.read_text(), 30)
    t0 = time.monotonic()
    shrink = cluster.run(["scancel", "--batch", "--signal=USR1", str(job)], check=False)
    wait(lambda: states(cluster, [job]).get(job, ["?", "?"])[1:2] == ["n1"], 30)
    inference = cluster.sbatch(["-p", "infer", "--gres=gpu:2"], "#!/bin/sh\nsleep 1\n")
    ran = wait(lambda: states(cluster, [inference]).get(inference, ["?"])[0] in ("RUNNING", "COMPLETED"), 60)
    reclaim = time.monotonic() - t0 if ran else None
    wait(lambda: states(cluster, [job]).get(job, ["?"])[0] in ("COMPLETED", "FAILED", "CANCELLED"), 120, poll=0.25)
    out = cluster.job_output(job)
    state = states(cluster, [job]).get(job, ["?"])[0]
    finish(cluster, [job, inference])
    return {"reclaim_s": round(reclaim, 2) if reclaim is not None else None, "shrink_rc": shrink.returncode,
            "job_state": state, "completed_all_epochs": "done epochs=40" in out,
            "epochs_redone": out.count("failed at")}


def summary(samples):
    values = [s["reclaim_s"] for s in samples if s["reclaim_s"] is not None]
    return {"reclaim_median_s": round(statistics.median(values), 2) if values else None,
            "reclaim_max_s": max(values) if values else None, "samples": samples}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-horusd", dest="horusd", action="store_false", help="skip the mode with horusd")
    args = parser.parse_args()
    partitions, preemption = deepboot_conf("n1", "n2", GRACE_S)
    cluster = LocalCluster(nodes=2, gpus=2, partitions=partitions, extra_conf=preemption, cred_expire=5).up()
    runs = {"preempt": [], "shrink": [], "preempt_no_step": []}
    try:
        for k in range(args.rounds):
            runs["preempt"].append(reclaim_by_preemption(cluster, with_step=True))
            runs["shrink"].append(reclaim_by_shrink(cluster))
            if k < 2:  # the slow case: two samples show it
                runs["preempt_no_step"].append(reclaim_by_preemption(cluster, with_step=False))
    finally:
        cluster.down()
    if args.horusd:
        cluster = LocalCluster(nodes=2, gpus=2, partitions=partitions, extra_conf=preemption, cred_expire=5,
                               horus=True, horus_settings={"binding": "indexed", "policy": "deepboot"}).up()
        try:
            for _ in range(args.rounds):
                runs.setdefault("horusd", []).append(reclaim_through_horusd(cluster))
                # the same with the inference job opted out of horus (horus=off): Slurm's own victim
                runs.setdefault("horusd_off_slurm_picks", []).append(reclaim_through_horusd(cluster, slurm_picks=True))
        finally:
            cluster.down()
    out = {"slurm": "22.05 (local cluster)", "grace_time_s": GRACE_S, "cred_expire_s": 5,
           "modes": {name: summary(samples) for name, samples in runs.items()}}
    out["training_jobs_lost"] = sum(1 for s in runs["preempt"] + runs["preempt_no_step"] + runs.get("horusd", []) + runs.get("horusd_off_slurm_picks", [])
                                    if not s["completed_all_steps"]) + \
        sum(1 for s in runs["shrink"] if not s["completed_all_epochs"])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
