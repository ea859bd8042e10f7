"""Robustness matrix: does horus win where nobody tuned it? (cross-validated, estimated durations)

Reads /work/shared/data (not shipped): ``$HORUS_SHARED_DATA`` or ``../shared/data`` relative to the
repository root. Lucid's RTX 3090 measurements are used as a truth for evaluation only, never copied.

Cases (each a small cluster, ``--gpus`` GPUs in 4-GPU nodes, ``--jobs`` jobs; 600 by default, the size
the variants are both tuned and judged at: at 200 the queue is short and the tuning scores are noise
(docs/simulator.md, "Tuning and judging at 600 jobs"). The whole matrix takes about 33 minutes with
``--workers 2`` on a 2-core machine; the cases are independent and the result does not depend on the
number of workers):

* truth (the simulator's real pair slowdowns, hidden from the policies, which start from the
  built-in priors without that GPU type's pairs): Gavel V100, Gavel P100, Lucid RTX 3090;
* trace: ``philly-1gpu`` (Pollux's Philly table, 1-GPU jobs of 1 min to 4 h), ``philly-mix`` (the
  same with 1-, 2-, 4- and 8-GPU jobs), ``gavel-msr`` (a Gavel ``traces_msr`` virtual-cluster trace,
  one file per seed; with the Lucid truth its classes are redrawn from Lucid's); a Philly case's jobs
  (``--philly-sample``): ``random`` (default: drawn from the pool's 89 days, compressed 150-650x to
  the load) or ``window`` (consecutive jobs from a seed-drawn start, at the trace's own pace scaled
  0.2-38x; its history is the pool's jobs submitted before them); the JSON's ``time_scale`` per case;
* offered load (work arriving per second / GPUs): ``--loads`` (0.8, 1.5, 3);
* durations known to the policies: ``estimated`` (the duration estimator) and ``oracle``;
* the site's history (``--history``): ``none`` (default: the estimator starts cold, as at a new site)
  or ``trace`` (a Philly case's estimator also learns the pool's jobs that were not sampled, as
  horusd's store would hold the site's other runs: each ended at its scaled arrival plus its run time,
  and is learned at the first feed after that; ``sim/run.py`` ``history_from_trace``); Gavel cases
  start with their trace's first job and have none;
* seeds: ``--seeds`` (sample of the trace, classes);
* horusd's ``slowdown_limit`` (``--slowdown-limit X``; default none, as ``horus simulate``): every
  policy's cycle refuses a pair predicted to slow the joining job more than X.

Per case: horus's mean JCT and makespan, the best other policy's (by mean JCT, among slurm-default,
sjf, sjf-ffs, sjf-bsbf, horus-util, iasp-iapp), sjf-bsbf's makespan, and the oracle's (perfect
knowledge: true pair matrix and true durations). Acceptance clauses, with estimated durations:
``jct``: horus's mean JCT ≤ the best other's; ``makespan``: horus's makespan ≤ 1.02 × sjf-bsbf's;
``gain``: horus takes ≥ 0.8 of the oracle's mean-JCT gain over slurm-default. Also per case (not
in the clauses nor the tuning score): the jobs horus placed next to a pair only predicted
(``explored``) and its starts that ran out of memory, beside the best other policy's
(``failed starts``: live, a job that failed at once and that its user submits again).

Knowledge split (``--knowledge``): per case the chosen variant also runs told, through the explicit
oracle options every policy takes in the simulator, the true pair matrix (``oracle_pairs=true``), the
true durations (``oracle_durations=true``) or both; the summary gives per truth its median JCT ratio to
the best other policy and its JCT-clause count with each kind of knowledge. Nothing is chosen on it.

Cross-validation: horus's remaining parameters are chosen among ``--variants`` on the *tuning
family* only (``--tune-truth`` × ``--tune-trace``, every load and seed, estimated durations), by the
mean over those runs of log(horus's mean JCT / the best other's) plus, where horus's makespan is over
1.02 × sjf-bsbf's, log(makespan / (1.02 × sjf-bsbf's)) — the two clauses a variant can fail; the chosen variant is then scored on every
other case, and the summary counts only cases outside the tuning family. The JSON says what was
tuned where. Prints one JSON document; the matrix as a table on stderr.
"""

import argparse
import copy
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from shared_data import LUCID_GPU, load_lucid, shared_data_dir  # noqa: E402
from slurm_horus.interference import builtin_priors, write_profiles_csv  # noqa: E402
from slurm_horus.sim.engine import SimOptions  # noqa: E402
from slurm_horus.sim.metrics import summarize  # noqa: E402
from slurm_horus.sim.run import history_from_trace, parse_cluster, run_policies  # noqa: E402
from slurm_horus.sim.traces import read_trace  # noqa: E402
from slurm_horus.sim.truth import Truth, load_truth  # noqa: E402

OTHERS = ["slurm-default", "sjf", "sjf-ffs", "sjf-bsbf", "horus-util", "iasp-iapp"]
VARIANTS = ",".join(f"horus-risk/risk={r}/explore_budget={b}/guard={g}/calibrate={c}/queue={q}"
                    for r in (0.25, 0.5) for b in (8, 64) for g in (0, 0.8) for c in (0, 3, 10) for q in (0, 1))
TRUTHS = ("v100", "p100", "rtx3090")
TRACES = ("philly-1gpu", "philly-mix", "gavel-msr")
# --knowledge: the chosen variant again, told one kind of knowledge it lacks (explicit oracle options,
# simulator only): which missing knowledge costs the judged cases what
KNOWLEDGE = {"true_pairs": "oracle_pairs=true", "true_durations": "oracle_durations=true",
             "both": "oracle_pairs=true/oracle_durations=true"}


class Truths:
    """The truth of each GPU type, and the profiles file the policies get for it (Lucid's classes)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._cache = {}

    def get(self, gpu: str):
        if gpu not in self._cache:
            if gpu == LUCID_GPU:
                profiles, observations, _ = load_lucid()
                # a scratch copy, outside the project; one per process (workers share the folder)
                path = os.path.join(self.folder, f"lucid_profiles.{os.getpid()}.csv")
                write_profiles_csv(path, profiles)
                truth = Truth(observations, list(builtin_priors()[0]) + list(profiles), name=f"lucid:{gpu}")
                self._cache[gpu] = (truth, path)
            else:
                self._cache[gpu] = (load_truth(f"gavel:{gpu}"), None)
        return self._cache[gpu]


_PHILLY = []


def _philly(n_jobs, seed, multi):
    """(the sampled jobs, the pool's other jobs: the site's history with ``--history trace``).

    ``--philly-sample random``: ``n_jobs`` drawn from the whole pool (89 days), so a case compresses
    the trace's time 150-650x to reach its load; ``window``: ``n_jobs`` consecutive jobs from a
    seed-drawn start, the trace's own arrivals (its bursts, a user's runs in a row) scaled 0.2-38x, and
    the history is the pool's jobs submitted before the window."""
    if not _PHILLY:  # read once: 82k timestamps to parse
        _PHILLY.extend(read_trace(str(shared_data_dir() / "pollux_adaptdl" / "traces" / "philly.csv"), "philly"))
    jobs = [copy.copy(j) for j in _PHILLY]
    sizes = (1, 2, 4, 8) if multi else (1,)
    jobs = sorted((j for j in jobs if j.num_gpus in sizes and 60.0 <= j.duration <= 4 * 3600.0),
                  key=lambda j: j.submit_time)
    n = min(n_jobs, len(jobs))
    if _SAMPLE[0] == "window":
        start = int(np.random.default_rng(seed).integers(0, len(jobs) - n + 1))
        return jobs[start:start + n], jobs[:start]
    picks = sorted(np.random.default_rng(seed).choice(len(jobs), n, replace=False))
    taken = set(int(i) for i in picks)
    return [jobs[i] for i in picks], [j for i, j in enumerate(jobs) if i not in taken]


def _gavel_msr(n_jobs, seed, truth):
    folder = shared_data_dir() / "gavel" / "traces_msr" / "seed=0"
    files = sorted(folder.glob("*.trace"))
    path = files[seed % len(files)]
    v100 = load_truth("gavel:v100")  # durations: steps / V100 solo throughput (the trace's own rule)
    jobs = read_trace(str(path), "gavel", solo_tput=lambda cls: v100.solo_tput(cls, "v100"))
    jobs = sorted(jobs, key=lambda j: j.submit_time)
    jobs = [j for j in jobs if 60.0 <= j.duration <= 8 * 3600.0][:n_jobs]
    for j in jobs:
        if not truth.has_class(j.job_class or ""):
            j.job_class = None  # redrawn from the truth's classes by seed
    return jobs, path.name


def workload(trace, n_jobs, seed, truth):
    """(the case's jobs, its source's name, the site's other jobs in the same time frame: the Philly
    pool's jobs not sampled; none for a Gavel trace, which starts with its first job)."""
    others = []
    if trace == "gavel-msr":
        jobs, name = _gavel_msr(n_jobs, seed, truth)
    else:
        (jobs, others), name = _philly(n_jobs, seed, trace == "philly-mix"), "philly.csv"
    first = min(j.submit_time for j in jobs)
    for j in jobs + others:
        j.submit_time -= first
        if trace != "gavel-msr":
            j.job_class = None
    return jobs, name, others


def offered_load(jobs, n_gpus):
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    return sum(j.duration * j.num_gpus for j in jobs) / (max(span, 1.0) * n_gpus)


_LIMIT = [None]  # --slowdown-limit, set by main() before any worker forks
SAMPLES = ("random", "window")
_SAMPLE = ["random"]  # --philly-sample, set by main() before any worker forks
_TRUTHS = []  # one Truths, made by main() before any worker forks (its scratch folder, main's to remove)
HISTORY = ("none", "trace")
_HISTORY = ["none"]  # --history, set by main() before any worker forks


def run_case(gpu, trace, load, durations, seed, policies, n_jobs, n_gpus):
    truth, profiles = _TRUTHS[0].get(gpu)
    jobs, source, others = workload(trace, n_jobs, seed, truth)
    groups = parse_cluster(f"{n_gpus // 4}x4:{gpu}")
    factor = load / offered_load(jobs, n_gpus)
    history = history_from_trace(others, truth, seed, factor) if _HISTORY[0] == "trace" else ()
    results = run_policies(copy.deepcopy(jobs), groups, truth, policies, seed=seed, load=factor,
                           profiles_path=profiles, options=SimOptions(durations=durations, history=history,
                                                                      max_slowdown=_LIMIT[0]))
    return {r.policy: dict({k: summarize(r)[k] for k in ("mean_jct", "makespan", "effective_utilization")},
                           explored=sum(v for k, v in (r.runtime or {}).items() if k.startswith("explored:")),
                           failed_starts=r.oom_events)
            for r in results}, source, factor


def _run_case(task):
    return run_case(*task)


def run_cases(tasks, workers):
    """``run_case`` over ``tasks`` (argument tuples), in their order; ``workers`` processes (cases are
    independent: each is one simulation of every policy, seeded by its own arguments)."""
    if workers <= 1:
        yield from map(_run_case, tasks)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_run_case, tasks)


def tuning_score(summary, variant, best_other_jct):
    """What cross-validation minimizes for one run: the JCT clause's log-ratio, plus the makespan
    clause's excess over 1.02 × sjf-bsbf's (0 when the clause holds)."""
    makespan = summary[variant]["makespan"] / (1.02 * summary["sjf-bsbf"]["makespan"])
    return math.log(summary[variant]["mean_jct"] / best_other_jct) + max(0.0, math.log(makespan))


def judge(summary, horus):
    h = summary[horus]
    others = {n: s for n, s in summary.items() if n in OTHERS}
    best = min(others, key=lambda n: others[n]["mean_jct"])
    default, oracle = summary["slurm-default"]["mean_jct"], summary["oracle"]["mean_jct"]
    gain = (default - h["mean_jct"]) / (default - oracle) if default > oracle else None
    return {"horus_jct": h["mean_jct"], "horus_makespan": h["makespan"], "best_other": best,
            "best_other_jct": others[best]["mean_jct"], "sjf_bsbf_makespan": summary["sjf-bsbf"]["makespan"],
            "oracle_jct": oracle, "default_jct": default, "oracle_gain_taken": gain,
            "horus_explored": h.get("explored", 0),
            # starts that ran out of memory next to their partner (live: a failed job its user submits
            # again); not in the score, which reads the time they cost the simulation
            "horus_failed_starts": h.get("failed_starts", 0),
            "best_other_failed_starts": others[best].get("failed_starts", 0),
            "jct_ok": h["mean_jct"] <= others[best]["mean_jct"] * (1 + 1e-9),
            "makespan_ok": h["makespan"] <= 1.02 * summary["sjf-bsbf"]["makespan"],
            "gain_ok": gain is None or gain >= 0.8}


def cross_validate(args, loads, seeds, variants):
    """Every variant on the tuning family (estimated durations): the scores, and the best variant."""
    scores = {v: [] for v in variants}
    tasks = [(args.tune_truth, args.tune_trace, load, "estimated", seed, OTHERS + ["oracle"] + variants,
              args.jobs, args.gpus) for load in loads for seed in seeds]
    for summary, _, _ in run_cases(tasks, args.workers):
        best_other = min(summary[n]["mean_jct"] for n in OTHERS)
        for v in variants:
            scores[v].append(tuning_score(summary, v, best_other))
    tuned = {v: sum(s) / len(s) for v, s in scores.items()}
    chosen = min(variants, key=lambda v: tuned[v])
    print(json.dumps({"tuning": tuned, "chosen": chosen}), file=sys.stderr)
    return tuned, chosen


def told(chosen):
    """The chosen variant told, through the explicit oracle options, what it would otherwise
    predict or estimate (``--knowledge``): name -> policy spec."""
    return {name: f"{chosen}/{options}" for name, options in KNOWLEDGE.items()}


def score_everywhere(args, loads, seeds, chosen):
    """The chosen variant on every case: one judged row per case."""
    keys = [(gpu, trace, load, durations, seed) for gpu in args.truths.split(",")
            for trace in args.traces.split(",") for load in loads
            for durations in args.durations.split(",") for seed in seeds]
    extra = told(chosen) if args.knowledge else {}
    tasks = [key + (OTHERS + ["oracle", chosen] + list(extra.values()), args.jobs, args.gpus) for key in keys]
    cases = []
    for (gpu, trace, load, durations, seed), (summary, source, factor) in zip(keys, run_cases(tasks, args.workers)):
        # time_scale: how much faster the case's jobs arrive than in their trace (its load / the trace's)
        row = {"truth": gpu, "trace": trace, "source": source, "load": load, "time_scale": factor,
               "durations": durations, "seed": seed,
               "tuning_family": gpu == args.tune_truth and trace == args.tune_trace}
        row.update(judge(summary, chosen))
        if extra:
            row["horus_jct_told"] = {name: summary[spec]["mean_jct"] for name, spec in extra.items()}
        cases.append(row)
        print(_line(row), file=sys.stderr)
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--truths", default=",".join(TRUTHS))
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--loads", default="0.8,1.5,3")
    parser.add_argument("--durations", default="estimated,oracle")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=VARIANTS, help="horus variants the cross-validation chooses from")
    parser.add_argument("--tune-truth", default="v100")
    parser.add_argument("--tune-trace", default="philly-1gpu")
    parser.add_argument("--tune-only", action="store_true", help="stop after choosing the variant")
    parser.add_argument("--knowledge", action="store_true",
                        help="also run the chosen variant told the true pairs, the true durations and both "
                             "(explicit oracle options): the summary's knowledge split")
    parser.add_argument("--history", choices=HISTORY, default="none",
                        help="what the duration estimator knows when a case starts: none (a site with no "
                             "history, the default), or trace (the Philly pool's jobs not sampled, learned "
                             "as they end: a site whose store holds its users' other runs; Gavel cases: none)")
    parser.add_argument("--philly-sample", choices=SAMPLES, default="random",
                        help="how a Philly case takes its jobs from the pool: random (drawn from its 89 days, "
                             "compressed 150-650x to the load; the default) or window (consecutive jobs from a "
                             "seed-drawn start, the trace's own arrival pattern scaled 0.2-38x)")
    parser.add_argument("--slowdown-limit", type=float, default=None,
                        help="horusd's slowdown_limit for every policy (the cycle's max_slowdown: a pair predicted "
                             "to slow the joining job more is not formed); default: none, as the simulator")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes running cases side by side (results do not depend on it)")
    args = parser.parse_args()
    started = time.time()
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = args.variants.split(",")
    _HISTORY[:] = [args.history]
    _SAMPLE[:] = [args.philly_sample]
    if args.slowdown_limit is not None and not args.slowdown_limit >= 1.0:
        parser.error("--slowdown-limit must be at least 1")
    _LIMIT[:] = [args.slowdown_limit]
    with tempfile.TemporaryDirectory(prefix="bench_robust.") as scratch:
        _TRUTHS[:] = [Truths(scratch)]
        tuned, chosen = cross_validate(args, loads, seeds, variants)
        if args.tune_only:
            print(json.dumps({"cross_validation": {"tuned_on": {"truth": args.tune_truth, "trace": args.tune_trace, "history": args.history},
                                                   "variants_score": tuned, "chosen": chosen},
                              "seconds": round(time.time() - started, 1)}, indent=2))
            return
        cases = score_everywhere(args, loads, seeds, chosen)
    judged = [c for c in cases if not c["tuning_family"] and c["durations"] == "estimated"]
    summary = {"cases_judged": len(judged),
               "jct_ok": sum(c["jct_ok"] for c in judged),
               "makespan_ok": sum(c["makespan_ok"] for c in judged),
               "gain_ok": sum(c["gain_ok"] for c in judged),
               "all_ok": sum(c["jct_ok"] and c["makespan_ok"] and c["gain_ok"] for c in judged),
               "median_oracle_gain_taken": _median([c["oracle_gain_taken"] for c in judged
                                                    if c["oracle_gain_taken"] is not None]),
               "median_jct_vs_best_other": _median([c["horus_jct"] / c["best_other_jct"] for c in judged]),
               # jobs horus placed on an unknown pair on the expected benefit alone (its exploration
               # budget per GPU type): what a site pays to learn a new GPU type
               "explored_jobs_median": _median([c["horus_explored"] for c in judged]),
               "explored_jobs_max": max((c["horus_explored"] for c in judged), default=None),
               "failed_starts": sum(c["horus_failed_starts"] for c in judged),
               "best_other_failed_starts": sum(c["best_other_failed_starts"] for c in judged)}
    if args.knowledge:
        summary["knowledge"] = knowledge_split(judged)
    print(json.dumps(summary), file=sys.stderr)
    print(json.dumps({"setup": {"jobs": args.jobs, "gpus": args.gpus, "loads": loads, "seeds": seeds,
                                "history": args.history, "philly_sample": args.philly_sample,
                                "slowdown_limit": args.slowdown_limit},
                      "cross_validation": {"tuned_on": {"truth": args.tune_truth, "trace": args.tune_trace,
                                                        "durations": "estimated", "loads": loads, "seeds": seeds},
                                           "variants_score": tuned, "chosen": chosen,
                                           "judged_on": "every other truth × trace; summary: estimated durations"},
                      "summary": summary, "cases": cases, "seconds": round(time.time() - started, 1)}, indent=2))


def knowledge_split(judged):
    """Per truth, over the judged cases (estimated durations): the median ratio of the chosen
    variant's mean JCT to the best other policy's, and how many cases meet the JCT clause, as it
    runs (``learned``: predicted pairs it learns over, estimated durations) and told the true pairs,
    the true durations, or both (``--knowledge``)."""
    out = {}
    for truth in sorted({c["truth"] for c in judged}):
        rows = [c for c in judged if c["truth"] == truth and "horus_jct_told" in c]
        if not rows:
            continue
        jcts = {"learned": [c["horus_jct"] for c in rows]}
        for name in KNOWLEDGE:
            jcts[name] = [c["horus_jct_told"][name] for c in rows]
        best = [c["best_other_jct"] for c in rows]
        out[truth] = {"cases": len(rows)}
        for name, values in jcts.items():
            ratios = [v / b for v, b in zip(values, best)]
            out[truth][name] = {"median_jct_vs_best_other": _median(ratios),
                                "jct_ok": sum(r <= 1 + 1e-9 for r in ratios)}
    return out


def _median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def _line(row) -> str:
    gain = row["oracle_gain_taken"]
    return (f"{row['truth']:<8} {row['trace']:<12} load {row['load']:<4} {row['durations']:<9} seed {row['seed']}"
            f"{' (tuned here)' if row['tuning_family'] else ''}: horus JCT {row['horus_jct']:.0f}s vs "
            f"{row['best_other']} {row['best_other_jct']:.0f}s, oracle {row['oracle_jct']:.0f}s, "
            f"gain taken {'-' if gain is None else f'{gain:.2f}'}, makespan/sjf-bsbf "
            f"{row['horus_makespan'] / row['sjf_bsbf_makespan']:.3f}, explored {row['horus_explored']}"
            f", failed starts {row['horus_failed_starts']}"
            f"  [{'J' if row['jct_ok'] else 'j'}{'M' if row['makespan_ok'] else 'm'}{'G' if row['gain_ok'] else 'g'}]")


if __name__ == "__main__":
    main()
