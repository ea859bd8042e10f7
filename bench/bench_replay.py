"""Sim-to-real: a Philly-like trace replayed on real Slurm, live figures from sacct beside the simulator's.

Workload (no outside data; ``slurm_horus/replay/workload.py``): ``--jobs`` single-GPU jobs drawn
with ``--seed`` from the jobs of 1 min - 1 h of the Philly sample shipped with slurm-horus, arrivals
scaled to an offered load of ``--load`` on the cluster's GPUs; classes drawn from the truth's 26
classes by seed. Each policy gets its own local cluster (``--cluster``, real slurmctld/slurmd/slurmdbd,
fake GPUs); ``slurm-default`` is plain Slurm, ``horus`` is horusd + job_submit.lua. Jobs are fake GPU
jobs (``horus fake-job``) that slow down as ``--truth`` says; times are divided by ``--speedup``.

Prints one JSON document: per policy the live and simulated figures (trace seconds), live/sim ratios,
whether makespan and mean JCT are within 10 %, the replay's wall time (the run) and its total time
(cluster up to cluster down); horus live vs slurm-default live; and the learning check: after the
replay, ``refit`` on each policy's history (sacct + stand-in samples) and the error, against the
truth the jobs followed, of the observed pairs (``observations_mae``: the mean observation of each
pair; ``model_holdout_mae``: the chain model fitted on the priors without the truth GPU's pairs plus
the observations; ``util_sign_mae``: the utilization ratio shared/solo the collector saw, a second
sign). Needs root and the Debian Slurm packages. Timings vary with the machine's load.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_horus.replay.run import ReplaySetup, replay  # noqa: E402
from slurm_horus.replay.workload import offered_load, philly_like  # noqa: E402
from slurm_horus.sim.run import prepare_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402


def learning_check(db_path, truth, gpu_type):
    from slurm_horus.interference import build_model, builtin_priors
    from slurm_horus.learn.loop import local_observations, refit
    from slurm_horus.store.db import open_db

    db = open_db(str(db_path))
    try:
        result = refit(db, default_gpu_type=gpu_type)
        pairs = local_observations(db)
        rows = db.execute("SELECT job_class, corunner_class, norm_tput, util_shared, util_solo, overlap_s, "
                          "elapsed_s FROM observations").fetchall()
    finally:
        db.close()
    out = {"observations": len(rows), "pairs": len(pairs), "refit_mae_on_observations": result.get("after", {}).get("mae")}
    if not pairs:
        return out
    errors = [abs(o.norm_tput - truth.pair(gpu_type, o.job_class, o.corunner_class)) for o in pairs]
    out["observations_mae"] = round(statistics.mean(errors), 4)
    out["observations_max_error"] = round(max(errors), 4)
    out["per_observation_mae"] = round(statistics.mean(
        abs(r[2] - truth.pair(gpu_type, r[0], r[1])) for r in rows), 4)
    profiles, priors = builtin_priors()
    held_out = build_model("chain", profiles, [o for o in priors if o.gpu_type != gpu_type] + pairs)
    out["model_holdout_mae"] = round(statistics.mean(
        abs(held_out.predict(o.job_class, [o.corunner_class], gpu_type) - truth.pair(gpu_type, o.job_class,
                                                                                      o.corunner_class))
        for o in pairs), 4)
    signs = [(r[3] / r[4], truth.pair(gpu_type, r[0], r[1])) for r in rows if r[3] is not None and r[4]]
    if signs:
        out["util_sign_mae"] = round(statistics.mean(abs(min(1.0, s) - t) for s, t in signs), 4)
    out["pair_values"] = [{"pair": f"{o.job_class} with {o.corunner_class}", "observed": round(o.norm_tput, 3),
                           "truth": truth.pair(gpu_type, o.job_class, o.corunner_class)} for o in pairs]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--cluster", default="2x4")
    parser.add_argument("--truth", default="gavel:v100")
    parser.add_argument("--speedup", type=float, default=200.0)
    parser.add_argument("--policies", default="slurm-default,horus")
    parser.add_argument("--seed", type=int, default=1,
                        help="workload and classes (the live cadence told the simulator was measured on seed 0)")
    parser.add_argument("--out-dir", default=None, help="keep the JSON, HTML report and history here")
    args = parser.parse_args()

    nodes, gpus = (int(x) for x in args.cluster.lower().split("x"))
    gpu_type = args.truth.split(":", 1)[1]
    truth = load_truth(args.truth)
    trace = philly_like(args.jobs, load=args.load, n_gpus=nodes * gpus, seed=args.seed)
    jobs = prepare_trace(trace, truth, args.seed, 1.0, nodes * gpus)
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="bench-replay-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = ReplaySetup(jobs, truth, args.truth, nodes, gpus, gpu_type, speedup=args.speedup,
                        history_dir=out_dir / "history")
    started = time.monotonic()
    payload, runs = replay(setup, [p.strip() for p in args.policies.split(",") if p.strip()])
    figures = {
        "workload": {"jobs": len(jobs), "offered_load": round(offered_load(trace, nodes * gpus), 3),
                     "mean_duration_s": round(statistics.mean(j.duration for j in jobs), 1),
                     "min_duration_s": min(j.duration for j in jobs), "max_duration_s": max(j.duration for j in jobs),
                     "source": f"philly_like(n={args.jobs}, load={args.load}, seed={args.seed})"},
        "speedup": args.speedup, "cluster": args.cluster, "truth": args.truth,
        "knowledge": payload["knowledge"], "time_limit_min": payload["time_limit_min"], "policies": {},
    }
    for name, entry in payload["policies"].items():
        live, sim = entry["live"], entry["sim"]
        keys = ("makespan", "mean_jct", "median_jct", "p99_jct", "mean_queueing_delay", "shared_share",
                "effective_utilization", "oom_events", "unfinished")
        figures["policies"][name] = {
            "live": {k: round(live[k], 3) for k in keys}, "sim": {k: round(sim[k], 3) for k in keys},
            "sim_ideal": {k: round(entry["sim_ideal"][k], 3) for k in keys}, "cadence": entry["cadence"],
            "live_vs_sim": {k: (round(v, 3) if v else v) for k, v in entry["live_vs_sim"].items()},
            "makespan_within_10pct": abs(entry["live_vs_sim"]["makespan"] - 1) <= 0.10,
            "mean_jct_within_10pct": abs(entry["live_vs_sim"]["mean_jct"] - 1) <= 0.10,
            "replay_wall_s": entry["wall_s"], "total_s": entry["total_s"], "submit_lag_s": entry["submit_lag_s"],
            "learning": learning_check(out_dir / "history" / f"{name}.db", truth, gpu_type),
        }
    base, ours = payload["policies"].get("slurm-default"), payload["policies"].get("horus")
    if base and ours:
        figures["horus_vs_slurm_default"] = {
            side: {"mean_jct_gain": round(1 - ours[side]["mean_jct"] / base[side]["mean_jct"], 3),
                   "makespan_gain": round(1 - ours[side]["makespan"] / base[side]["makespan"], 3)}
            for side in ("live", "sim", "sim_ideal")}
        figures["horus_live_at_least_20pct_better_mean_jct"] = figures["horus_vs_slurm_default"]["live"][
            "mean_jct_gain"] >= 0.20
    figures["bench_s"] = round(time.monotonic() - started, 1)
    figures["out_dir"] = str(out_dir)
    (out_dir / "replay.json").write_text(json.dumps(payload, indent=2))
    from slurm_horus.replay.report import write_report

    write_report(out_dir / "replay.html", dict(payload, trace=figures["workload"]["source"], load=args.load),
                 setup, runs)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
