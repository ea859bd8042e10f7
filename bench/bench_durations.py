"""Error of the duration estimator (placement/duration.py) on real job histories.

Reads /work/shared/data (not shipped): ``$HORUS_SHARED_DATA`` or ``../shared/data``. Each history is
replayed in submission order; a job is estimated when it is submitted, from the jobs that ended
before (end = submit + run time: queueing delays are not in the traces), as horusd would from sacct.

* tuning set: Gavel's ``traces_msr`` (seeds 0-4, 15 virtual clusters each): user = the virtual
  cluster (the file name), class = the Gavel job type, run time = total_steps / the class's V100
  steps/s. The settings grid (``recent`` × ``min_runs`` × levels) is scored here.
* report set: Pollux's ``philly.csv`` (82,247 jobs): user = the virtual cluster; no class in the
  trace (``class="none"``), and once with the simulator's classes (drawn uniformly from Gavel's 26
  by seed 0, i.e. no information: what ``horus simulate`` sees).

Both sets also run with the levels in the measured order (the default) and with the last runs taken by
start instead of by end (``recent_by="start"``, an option: docs/placement.md, "Recent by start"; a job
here starts at its submission). Neither trace carries time limits, so the cap never applies here.
Prints one JSON document: per
set and setting the error figures of :func:`slurm_horus.placement.duration.estimate_errors`.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from shared_data import shared_data_dir  # noqa: E402
from slurm_horus.placement.duration import (DurationEstimator, DurationSettings, estimate_errors,  # noqa: E402
                                            replay_errors)
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import load_truth  # noqa: E402

KEEP = ("spread_scale_80", "mare", "median_log_ratio", "within_2x", "rank_corr", "coverage_80", "sources", "order")


def gavel_msr(seeds):
    truth = load_truth("gavel:v100")
    rows = []
    for seed in seeds:
        folder = shared_data_dir() / "gavel" / "traces_msr" / f"seed={seed}"
        for path in sorted(folder.glob("*.trace")):
            if len(path.stem) != 6:  # the 15 virtual clusters have 6-hex-digit names
                continue
            for j in read_trace(str(path), "gavel", solo_tput=lambda c: truth.solo_tput(c, "v100")):
                # each (seed, VC) is its own site history: users are the VC, in that seed's world
                rows.append((seed, (j.submit_time, j.duration, path.stem, j.job_class, None)))
    return rows


def philly(random_classes: bool):
    import numpy as np

    jobs = read_trace(str(shared_data_dir() / "pollux_adaptdl" / "traces" / "philly.csv"), "philly")
    classes = sorted(load_truth("gavel:v100").classes)
    picks = np.random.default_rng(0).integers(0, len(classes), size=len(jobs))
    return [(j.submit_time, j.duration, j.user, classes[int(k)] if random_classes else "", None)
            for j, k in zip(jobs, picks)]


def summary(errors):
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in errors.items() if k in KEEP + ("jobs",)}


def score_gavel(rows, settings):
    """One replay per (seed, VC): the VCs of a seed are separate sites in Gavel's traces."""
    per_site = {}
    for seed, job in rows:
        per_site.setdefault((seed, job[2]), []).append(job)
    estimates, truths = [], []
    for jobs in per_site.values():
        _, est = replay_errors(jobs, settings)
        estimates += est
        truths += [j[1] for j in sorted(jobs, key=lambda j: j[0])]
    out = estimate_errors(estimates, truths)
    out["sites"] = len(per_site)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="Gavel traces_msr seeds (tuning set)")
    parser.add_argument("--grid", default="2,5,10,20,50", help="values of 'recent' tried")
    parser.add_argument("--min-runs", default="1,2,3,5")
    parser.add_argument("--no-grid", action="store_true", help="only the report set, with the default settings")
    args = parser.parse_args()
    started = time.time()
    out = {"tuning": {"set": "gavel traces_msr", "runs": []}, "report": {}}
    gavel = gavel_msr([int(s) for s in args.seeds.split(",")])
    if not gavel:
        sys.exit(f"no Gavel traces under {shared_data_dir()} (set HORUS_SHARED_DATA)")
    # in Gavel's traces each site (seed, VC) is one user: user+class is the class, user is the site
    levels_variants = {"user+class>class>user>site": ("user+class", "class", "user", "site"),
                       "user>site": ("user", "site")}
    for recent in ([] if args.no_grid else (int(x) for x in args.grid.split(","))):
        for min_runs in (int(x) for x in args.min_runs.split(",")):
            if min_runs > recent:
                continue
            for label, levels in levels_variants.items():
                settings = DurationSettings(recent=recent, min_runs=min_runs, levels=levels, adaptive=False)
                row = {"recent": recent, "min_runs": min_runs, "levels": label}
                row.update(summary(score_gavel(gavel, settings)))
                out["tuning"]["runs"].append(row)
                print(json.dumps(row), file=sys.stderr)
    if out["tuning"]["runs"]:
        out["tuning"]["best_by_rank_corr"] = max(out["tuning"]["runs"], key=lambda r: (r["rank_corr"], -r["mare"]))
    default = DurationSettings()
    out["default_settings"] = {"recent": default.recent, "min_runs": default.min_runs,
                               "levels": list(default.levels), "rule": default.describe()}
    out["tuning"]["default"] = next((r for r in out["tuning"]["runs"] if r["recent"] == default.recent
                                     and r["min_runs"] == default.min_runs
                                     and r["levels"] == ">".join(default.levels)), None)
    # the levels' order: fixed or measured per history (adaptive, the default), on both sets
    fixed, measured = DurationSettings(adaptive=False), default
    by_start = DurationSettings(recent_by="start")  # the last runs by start, not by end (an option)
    out["tuning"]["order"] = {"fixed": summary(score_gavel(gavel, fixed)),
                              "measured (default)": summary(score_gavel(gavel, measured)),
                              "measured, recent by start": summary(score_gavel(gavel, by_start))}
    print(json.dumps({"tuning order": out["tuning"]["order"]}), file=sys.stderr)
    for label, random_classes in (("philly (user = VC, no class)", False),
                                  ("philly (user = VC, simulator's random classes)", True)):
        jobs = philly(random_classes)
        errors, _ = replay_errors(jobs, fixed)
        out["report"][label] = summary(errors)
        out["report"][label + ", levels in the measured order (default)"] = summary(replay_errors(jobs, measured)[0])
        out["report"][label + ", measured order, recent by start"] = summary(replay_errors(jobs, by_start)[0])
        print(json.dumps({label: out["report"][label]}), file=sys.stderr)
    # references on the same jobs: the site-wide median of the last 10 runs, and one constant guess
    jobs = philly(False)
    site = DurationSettings(levels=("site",))
    out["report"]["reference: site-wide median only"] = summary(replay_errors(jobs, site)[0])
    constant = DurationEstimator(default).estimate()
    out["report"]["reference: constant 3600 s"] = summary(
        estimate_errors([constant] * len(jobs), [j[1] for j in sorted(jobs, key=lambda j: j[0])]))
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
