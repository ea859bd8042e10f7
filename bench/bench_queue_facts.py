"""The Slurm facts horusd's live queue relies on, measured on each Slurm version, printed as JSON.

horusd keeps the jobs it cannot place behind a begin time (a lease), renews it with ``scontrol update
StartTime=now+L``, and starts a kept job by typing its GRES in place (docs/horusd.md, "The queue";
slurm/control.py, service/mover.py). Those moves were measured by hand on 22.05.8
(``../shared/docs/slurm-22.05-facts.md`` §11 and docs/horusd.md). This script measures each of them
again on a real local cluster (2 nodes x 4 fake GPUs, 2 shards each, no job_submit plugin) of each
version it is given, every update spelled the way that version spells GRES (``gres:`` / ``gres/``;
the old spelling is tried as well), and prints per version and per fact what Slurm did:

* ``begin_time``: a job submitted with ``--begin=now+600`` pends with reason ``BeginTime`` and squeue's
  ``start_time`` is its begin time (horusd reads the lease end there); ``StartTime=now+60`` moves it
  (renewal); ``StartTime=now`` starts it (release), seconds taken;
* the rows of the "How a kept job is moved" table: a typed gpu moved to another type, a typed shard
  moved (and whether its old shard leaks once it ends), untyped to typed in place, gpu to shard, the
  two kept shapes' two-step moves (``shard:1`` and ``gpu:2``), ``NodeList`` only;
* ``stdin_form``: two update lines through one ``scontrol`` reading stdin, one of them for a job that
  does not exist: the other is applied, and scontrol names the failed job (slurm/control.update_many).

Needs root and the Debian packages (a chroot Slurm is built on first use).
Usage: python bench/bench_queue_facts.py [--slurm system,24.11,26.05]
"""

import argparse
import json
import os
import re
import sys
import time

from slurm_horus.localcluster import LocalCluster
from slurm_horus.slurm.control import update_many
from slurm_horus.slurm.runner import SlurmCommandError

SCRIPT = "#!/bin/sh\necho GDO=$GPU_DEVICE_ORDINAL JOB_GPUS=$SLURM_JOB_GPUS\nsleep {sleep}\n"


def wait(predicate, timeout=30.0, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


class Facts:
    def __init__(self, cluster):
        self.cluster = cluster
        self.p = cluster.slurm_version().gres_prefix

    def job(self, job_id):
        return next((j for j in self.cluster.queue() if j.job_id == job_id), None)

    def submit(self, args, sleep=3, begin=True):
        return self.cluster.sbatch(list(args) + (["--begin=now+600"] if begin else []), SCRIPT.format(sleep=sleep))

    def update(self, job_id, fields):
        """scontrol update (argv form); None when accepted, else Slurm's message."""
        argv = ["scontrol", "update", f"jobid={job_id}"] + [f"{k}={v}" for k, v in fields.items()]
        try:
            self.cluster.run(argv, timeout=30)
            return None
        except SlurmCommandError as exc:
            return str(exc).strip().splitlines()[-1][-200:]

    def ran(self, job_id, timeout=30):
        """(node, GPU_DEVICE_ORDINAL, SLURM_JOB_GPUS) once the job has run, else None."""
        def output():
            state = self.cluster.job_states([job_id]).get(job_id)
            try:
                text = self.cluster.job_output(job_id)
            except FileNotFoundError:
                text = ""
            match = re.search(r"GDO=(\S*) JOB_GPUS=(\S*)", text)
            return (state, match) if match else None
        found = wait(output, timeout)
        if not found:
            return {"ran": False, "state": self.cluster.job_states([job_id]).get(job_id)}
        job = self.job(job_id)
        return {"ran": True, "node": job.nodes if job else None, "GPU_DEVICE_ORDINAL": found[1].group(1),
                "SLURM_JOB_GPUS": found[1].group(2), "gpus_in_use_while_running": self.in_use()}

    def in_use(self):
        """{node: [GPU indices]} slurmctld counts as used (scontrol/sinfo's gres_used, read by slurm-horus)."""
        return {n.name: list(n.gpu_indices_in_use()) for n in self.cluster.nodes_info() if n.gpu_indices_in_use()}

    def leaked(self, job_id):
        """What slurmctld still counts as used once the job has ended (nothing else runs)."""
        self.cluster.wait_jobs([job_id], timeout=60)
        time.sleep(1.0)
        return self.in_use()

    def reset(self):
        self.cluster.cancel_all_jobs()

    # ---- the facts ----------------------------------------------------------------------------
    def begin_time(self):
        job = self.submit(["--gres=gpu:1"], sleep=1)
        time.sleep(1.0)
        record = self.job(job)
        out = {"state": record.state, "reason": record.state_reason,
               "start_time_minus_submit_s": record.start_time - record.submit_time}
        out["renew_refused"] = self.update(job, {"StartTime": "now+60"})
        record = self.job(job)
        out["start_time_after_renew_minus_now_s"] = round(record.start_time - time.time())
        started = time.monotonic()
        out["release_refused"] = self.update(job, {"StartTime": "now"})
        running = wait(lambda: self.cluster.job_states([job]).get(job) in ("RUNNING", "COMPLETED"), 30, 0.02)
        out["release_to_running_s"] = round(time.monotonic() - started, 2) if running else None
        return out

    def typed_gpu_moved(self):
        job = self.submit(["-w", "n1", "--gres=gpu:g0:1"])
        refused = self.update(job, {"TresPerNode": f"{self.p}gpu:g2:1", "StartTime": "now"})
        return {"refused": refused, "shown": self.job(job).tres_per_node if self.job(job) else None,
                **self.ran(job)}

    def typed_shard_moved(self):
        job = self.submit(["--gres=shard:g0:1"])
        refused = self.update(job, {"TresPerNode": f"{self.p}shard:g1:1", "NodeList": "n1", "StartTime": "now"})
        out = {"refused": refused, **self.ran(job)}
        out["gpus_in_use_after_end"] = self.leaked(job)
        return out

    def untyped_to_typed(self):
        out = {}
        for kind in ("gpu", "shard"):
            job = self.submit([f"--gres={kind}:1"])
            refused = self.update(job, {"TresPerNode": f"{self.p}{kind}:g2:1", "NodeList": "n2", "StartTime": "now"})
            out[kind] = {"refused": refused}
            if refused is None:
                out[kind].update(self.ran(job))
                out[kind]["gpus_in_use_after_end"] = self.leaked(job)
            self.reset()
        return out

    def gpu_to_shard(self):
        job = self.submit(["--gres=gpu:1"])
        refused = self.update(job, {"TresPerNode": f"{self.p}shard:g2:1", "NodeList": "n2", "StartTime": "now"})
        out = {"refused": refused}
        if refused is None:
            out.update(self.ran(job))
            out["gpus_in_use_after_end"] = self.leaked(job)
        return out

    def kept_shard_move(self, prefix=None):
        prefix = prefix or self.p
        job = self.submit(["--gres=shard:1"])
        first = self.update(job, {"TresPerNode": ""})
        second = self.update(job, {"TresPerNode": f"{prefix}shard:g1:1", "NodeList": "n2", "StartTime": "now"})
        out = {"prefix": prefix, "first_refused": first, "second_refused": second}
        if second is None:
            out.update(self.ran(job))
            out["gpus_in_use_after_end"] = self.leaked(job)
        return out

    def kept_gpus_move(self):
        job = self.submit(["--gres=gpu:2"])
        first = self.update(job, {"TresPerNode": "", "TresPerJob": f"{self.p}gpu:2"})
        between = self.job(job)
        second = self.update(job, {"TresPerJob": "", "TresPerNode": f"{self.p}gpu:g1:1,{self.p}gpu:g3:1",
                                   "NodeList": "n1", "StartTime": "now"})
        out = {"first_refused": first, "between": {"tres_per_node": between.tres_per_node,
                                                   "tres_per_job": between.tres_per_job},
               "second_refused": second}
        if second is None:
            out.update(self.ran(job))
            out["gpus_in_use_after_end"] = self.leaked(job)
        return out

    def nodelist_only(self):
        job = self.submit(["--gres=gpu:1"])
        return {"refused": self.update(job, {"NodeList": "n2", "StartTime": "now"}), **self.ran(job)}

    def stdin_form(self):
        job = self.submit(["--gres=gpu:1"], sleep=1)
        refused = update_many([([999999], {"StartTime": "now"}), ([job], {"StartTime": "now"})],
                              slurm_conf=self.cluster.slurm_conf, timeout=30)
        started = wait(lambda: self.cluster.job_states([job]).get(job) in ("RUNNING", "COMPLETED"), 30)
        return {"refused_ids": sorted(refused), "other_job_started": bool(started)}


# typed_shard_moved leaks a shard on 22.05 until slurmctld restarts: it runs last
FACTS = ("begin_time", "typed_gpu_moved", "untyped_to_typed", "gpu_to_shard", "kept_shard_move", "kept_gpus_move",
         "nodelist_only", "stdin_form", "typed_shard_moved")


def one_version(slurm):
    cluster = LocalCluster(nodes=2, gpus=4, horus=False, slurm=slurm).up()
    saved_path = os.environ.get("PATH", os.defpath)
    os.environ["PATH"] = cluster.env.get("PATH", saved_path)  # slurm.control runs scontrol by name
    try:
        facts = Facts(cluster)
        out = {"slurm": slurm, "version": str(cluster.slurm_version()), "spelling": facts.p}
        for name in FACTS:
            try:
                out[name] = getattr(facts, name)()
            except Exception as exc:  # a fact that could not be measured is reported, not fatal
                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            facts.reset()
        if facts.p != "gres:":
            out["kept_shard_move_old_spelling"] = facts.kept_shard_move("gres:")
            facts.reset()
        return out
    finally:
        os.environ["PATH"] = saved_path
        cluster.down()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", default="system,24.11,26.05")
    args = parser.parse_args(argv)
    results = [one_version(v.strip()) for v in args.slurm.split(",") if v.strip()]
    json.dump({"bench": "queue_facts", "results": results}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
