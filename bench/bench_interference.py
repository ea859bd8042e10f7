#!/usr/bin/env python3
"""Interference-model benchmark: accuracy on real measurements, memory safety, speed. Prints JSON.

READS DATA OUTSIDE THE REPOSITORY: ``../shared/data`` relative to the repository root, or the folder
named by ``$HORUS_SHARED_DATA`` (Gavel V100/P100 via the shipped priors, Lucid RTX 3090 from
``lucid/``; Lucid's data is used for evaluation only, never copied).

Scenarios (acceptance figures of issue 3):
- leave_pairs_out: Gavel V100 + P100, 20% of the unordered pairs of each GPU type hidden (both
  directions), 5 seeds; every predictor scored on the hidden ones.
- new_gpu_sparse: fit on all V100 pairs + 10% of the P100 pairs (+ all profiles), score on the
  other 90% of the P100 pairs; 5 seeds.
- new_class_lucid: leave one model family out entirely (its profiles stay), score its pairs; the
  average over the families that have co-location measurements.
- memory_safety: every pair of Lucid classes whose summed peak memory exceeds 24 GB, and every
  pair observed at 0 in the Gavel priors, must be predicted 0 by every predictor.
- speed: one chain prediction (explain, 2 jobs), predict_pairs throughput on one core.
Usage: bench/bench_interference.py [--quick] [--out FILE]
"""

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # the speed figures are for one core

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_data import LUCID_GPU, load_lucid, shared_data_dir  # noqa: E402

from slurm_horus.interference import PREDICTORS, build_model, builtin_priors, gpu_memory_mb  # noqa: E402
from slurm_horus.interference.evaluate import predict_observations, score  # noqa: E402

ORDER = ("measured", "utilization", "cf", "ncf", "mlp", "mlp-deep", "chain")
assert set(ORDER) == set(PREDICTORS)


def pair_key(o):
    return (o.gpu_type,) + tuple(sorted((o.job_class, o.corunner_class)))


def leave_pairs_out(observations, share, seed, gpu_types=None):
    """(train, test): ``share`` of the unordered pairs of each GPU type (or of ``gpu_types``) hidden."""
    rng = np.random.default_rng(seed)
    pairs = sorted({pair_key(o) for o in observations if gpu_types is None or o.gpu_type in gpu_types})
    hidden = {pairs[i] for i in rng.permutation(len(pairs))[: int(round(share * len(pairs)))]}
    return ([o for o in observations if pair_key(o) not in hidden],
            [o for o in observations if pair_key(o) in hidden])


def mean_scores(runs):
    """Mean of each figure over runs (NaN runs, e.g. a Spearman of constant predictions, skipped)."""
    result = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] == r[key]]
        result[key] = round(float(np.mean(values)), 4) if values else float("nan")
    result["n"] = int(sum(r["n"] for r in runs))
    return result


def run_scenario(splits, profiles, predictors):
    """Scores of each predictor, mean over (train, test) splits, plus the time to fit."""
    result = {}
    for name in predictors:
        runs, fit_s = [], []
        for train, test in splits:
            start = time.perf_counter()
            model = build_model(name, profiles, train)
            fit_s.append(time.perf_counter() - start)
            runs.append(score(*predict_observations(model, test)))
        result[name] = dict(mean_scores(runs), fit_s=round(float(np.mean(fit_s)), 3))
    best = min(result, key=lambda n: result[n]["mae"])
    return {"predictors": result, "best": best}


def scenario_leave_pairs_out(seeds, predictors):
    profiles, observations = builtin_priors()
    splits = [leave_pairs_out(observations, 0.2, seed) for seed in range(seeds)]
    return run_scenario(splits, profiles, predictors)


def scenario_new_gpu_sparse(seeds, predictors):
    profiles, observations = builtin_priors()
    splits = []
    for seed in range(seeds):
        hidden_train, kept = leave_pairs_out(observations, 0.9, seed, gpu_types={"p100"})
        splits.append((hidden_train, [o for o in kept if o.gpu_type == "p100"]))
    return run_scenario(splits, profiles, predictors)


def scenario_new_class(predictors):
    profiles, observations, family = load_lucid()
    families = sorted({family[o.job_class] for o in observations})
    result = {}
    for name in predictors:
        runs = []
        for left_out in families:
            outside = lambda o: family[o.job_class] != left_out and family[o.corunner_class] != left_out  # noqa: E731
            train = [o for o in observations if outside(o)]
            test = [o for o in observations if not outside(o)]
            runs.append(score(*predict_observations(build_model(name, profiles, train), test)))
        result[name] = dict(mean_scores(runs), per_family_mae={f: round(r["mae"], 4) for f, r in zip(families, runs)})
    best = min(result, key=lambda n: result[n]["mae"])
    return {"families": families, "predictors": result, "best": best}


def scenario_memory_safety(predictors):
    profiles, observations, _ = load_lucid()
    capacity = gpu_memory_mb(LUCID_GPU)
    peak = {p.job_class: p.gmem_mb for p in profiles}
    names = sorted(peak)
    over = [(a, b) for a in names for b in names if peak[a] + peak[b] > capacity]
    gavel_profiles, gavel_observations = builtin_priors()
    zeros = [o for o in gavel_observations if o.norm_tput == 0]
    result = {"lucid_pairs_over_memory": len(over), "gavel_pairs_observed_infeasible": len(zeros)}
    for name in predictors:
        lucid = build_model(name, profiles, observations)
        predicted = lucid.predict_pairs([a for a, _ in over], [b for _, b in over], LUCID_GPU)
        gavel = build_model(name, gavel_profiles, gavel_observations)
        _, gavel_predicted, _ = predict_observations(gavel, zeros)
        result[name] = {"predicted_feasible_over_memory": int(np.sum(predicted > 0)),
                        "predicted_feasible_observed_infeasible": int(np.sum(gavel_predicted > 0))}
    return result


def scenario_speed():
    model = build_model("chain")
    profiles, _ = builtin_priors()
    names = sorted({p.job_class for p in profiles})
    rng = np.random.default_rng(0)
    count = 500_000
    t_ids, c_ids = rng.integers(0, len(names), count), rng.integers(0, len(names), count)
    targets, corunners = np.asarray(names)[t_ids], np.asarray(names)[c_ids]
    model.predict_pairs(targets[:10], corunners[:10], "v100")  # warm the tables

    def best_of(fn, repeat=5):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    single = 20_000
    pairs = list(zip(targets[:single].tolist(), corunners[:single].tolist()))
    one = best_of(lambda: [model.explain(t, [c], "v100") for t, c in pairs]) / single
    triple = best_of(lambda: [model.explain(t, [c, c], "v100") for t, c in pairs]) / single
    by_name = best_of(lambda: model.predict_pairs(targets, corunners, "v100"))
    id_t, id_c = model.index.lookup(targets), model.index.lookup(corunners)
    by_id = best_of(lambda: model.predict_pairs(id_t, id_c, "v100"))
    return {
        "chain_explain_pair_us": round(one * 1e6, 2),
        "chain_explain_three_jobs_us": round(triple * 1e6, 2),
        "predict_pairs_by_name_per_s": int(count / by_name),
        "predict_pairs_by_id_per_s": int(count / by_id),
        "batch_size": count,
    }


def _without_nan(value):
    """NaN (e.g. a Spearman over constant predictions) -> null, so the output is strict JSON."""
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds instead of 5")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--predictor", action="append", choices=ORDER, help="only these predictors")
    args = parser.parse_args()
    seeds = 2 if args.quick else 5
    predictors = args.predictor or list(ORDER)
    started = time.perf_counter()
    report = {
        "shared_data": str(shared_data_dir()),
        "leave_pairs_out": scenario_leave_pairs_out(seeds, predictors),
        "new_gpu_sparse": scenario_new_gpu_sparse(seeds, predictors),
        "new_class_lucid": scenario_new_class(predictors),
        "memory_safety": scenario_memory_safety(predictors),
        "speed": scenario_speed(),
    }
    report["seeds"] = seeds
    report["wall_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(_without_nan(report), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
