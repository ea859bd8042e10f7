"""horus-sbatch vs plain sbatch: wall time of one submission, on the same script, interleaved.

Starts a throw-away local Slurm cluster (slurm_horus.localcluster), then for each round submits the
same held GPU job (``--hold``, cancelled at the end) with:

* ``sbatch``                       — the baseline;
* ``horus-sbatch``, no horusd      — the fail-open path (the socket does not exist), job unchanged;
* ``horus-sbatch``, horusd placing — a test-only fake horusd thread (tests/sbatch_fakes.py)
                                      answers with a placement, so the script is rewritten (jinja2);

in rotating order, ``--runs`` rounds (default 60). Prints JSON: medians, added milliseconds, ratios,
and where horus-sbatch's time goes (interpreter start-up, ``python -X importtime`` of the modules
each path loads, and ``--dry-run`` without sbatch). Reads nothing from /work/shared.
The goal is at most 150 ms added at the median.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sbatch_fakes import FakeHorusd, place_reply  # noqa: E402

from slurm_horus.localcluster import LocalCluster  # noqa: E402

SCRIPT = """#!/bin/bash
#SBATCH --job-name=bench
#SBATCH --gres=gpu:1
#SBATCH --time=5
#SBATCH --mem=100M
python train.py --batch-size 64
"""


# what horus-sbatch imports on its way to an unchanged submission (the console script imports re)
UNCHANGED_PATH_IMPORTS = ("import re, _sha1, slurm_horus.sbatch.cli, slurm_horus.sbatch.script, "
                          "slurm_horus.sbatch.job, slurm_horus.config, slurm_horus.service.protocol")


def horus_sbatch_command(path=None):
    installed = Path(path) if path else Path(sys.executable).parent / "horus-sbatch"
    if installed.exists():
        return [str(installed)]
    return [sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()"]


def timed(argv, env):
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = (time.perf_counter() - start) * 1000.0
    if result.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {result.stderr.strip()}")
    return elapsed, result.stdout


def job_ids(text):
    return re.findall(r"(\d+)", text)


def import_profile(python, code, env, repeats=7):
    """(total ms, {module: self ms} of the 8 slowest), medians over ``repeats`` runs of
    ``python -X importtime -c code`` (single runs are too noisy on a shared machine)."""
    totals, per_module = [], {}
    for _ in range(repeats):
        result = subprocess.run([python, "-X", "importtime", "-c", code], env=env,
                                capture_output=True, text=True)
        total = 0.0
        for line in result.stderr.splitlines():
            match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| *(\S+)", line)
            if match:
                self_ms = int(match.group(1)) / 1000.0
                total += self_ms
                per_module.setdefault(match.group(3), []).append(self_ms)
        totals.append(total)
    medians = {name: round(statistics.median(values + [0.0] * (repeats - len(values))), 2)
               for name, values in per_module.items()}
    top = sorted(medians.items(), key=lambda item: -item[1])[:8]
    return round(statistics.median(totals), 2), dict(top)


def median_of(runs, argv, env):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True)
        times.append((time.perf_counter() - start) * 1000.0)
    return round(statistics.median(times), 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60, help="rounds (each submits once per variant)")
    parser.add_argument("--horus-sbatch", help="the horus-sbatch to time (default: the one next to this "
                        "python; an editable install's path finder makes every start-up slower)")
    args = parser.parse_args()
    command = horus_sbatch_command(args.horus_sbatch)
    python = str(Path(command[0]).parent / "python") if args.horus_sbatch else sys.executable
    work = Path(tempfile.mkdtemp(prefix="bench-sbatch-"))
    os.chmod(work, 0o755)
    script = work / "bench.sh"
    script.write_text(SCRIPT)
    cluster = LocalCluster().up()
    submitted = []
    try:
        env = cluster.env
        for key in [k for k in env if k.startswith(("SBATCH_", "HORUS_"))]:
            del env[key]
        config = work / "horus.conf"
        env["HORUS_CONFIG"] = str(config)
        common = ["--hold", f"--output={work}/slurm-%j.out"]
        horusd = FakeHorusd(place_reply())
        variants = {
            "sbatch": (["sbatch", *common, str(script)], f"socket = {work}/none.sock\n"),
            "horus_sbatch_no_horusd": (command + [*common, str(script)],
                                       f"socket = {work}/none.sock\n"),
            "horus_sbatch_placed": (command + [*common, str(script)],
                                    f"socket = {horusd.socket_path}\ntimeout_ms = 2000\n"),
        }
        times = {name: [] for name in variants}
        names = list(variants)
        for warmup in names:
            config.write_text(variants[warmup][1])
            submitted += job_ids(timed(variants[warmup][0], env)[1])
        for round_index in range(args.runs):
            order = names[round_index % 3:] + names[:round_index % 3]
            for name in order:
                argv, config_text = variants[name]
                config.write_text(config_text)
                elapsed, stdout = timed(argv, env)
                times[name].append(elapsed)
                submitted += job_ids(stdout)
        horusd.close()
        medians = {name: round(statistics.median(values), 2) for name, values in times.items()}
        config.write_text(f"socket = {work}/none.sock\n")
        python_startup = median_of(20, [python, "-c", "pass"], env)
        python_isolated = median_of(20, [python, "-I", "-S", "-c", "pass"], env)
        dry_run = median_of(20, command + ["--dry-run", str(script)], env)
        unchanged_imports = import_profile(python, UNCHANGED_PATH_IMPORTS, env)
        placed_imports = import_profile(python, UNCHANGED_PATH_IMPORTS + ", slurm_horus.sbatch.rewrite, jinja2", env)
        report = {
            "runs_per_variant": args.runs,
            "median_ms": medians,
            "added_ms_at_median": {name: round(medians[name] - medians["sbatch"], 2)
                                   for name in names if name != "sbatch"},
            "ratio_to_sbatch": {name: round(medians[name] / medians["sbatch"], 3)
                                for name in names if name != "sbatch"},
            "p90_ms": {name: round(sorted(values)[int(0.9 * len(values))], 2)
                       for name, values in times.items()},
            "goal_added_ms": 150,
            "where_the_time_goes": {
                "python_startup_ms_median": python_startup,
                "python_startup_isolated_no_site_ms_median": python_isolated,
                "horus_sbatch_dry_run_no_horusd_ms_median": dry_run,
                "imports_unchanged_path_ms": unchanged_imports[0],
                "imports_unchanged_path_top_self_ms": unchanged_imports[1],
                "imports_placed_path_ms": placed_imports[0],
                "imports_placed_path_top_self_ms": placed_imports[1],
                "note": "import times: medians of 7 `python -X importtime` runs (self times summed); "
                        "an editable install adds its path finder to every start-up",
            },
            "horus_sbatch": command[0],
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                        "load_average_1min": round(os.getloadavg()[0], 2)},
        }
        print(json.dumps(report, indent=2))
    finally:
        if submitted:
            cluster.run(["scancel", *sorted(set(submitted))], check=False)
        cluster.down()


if __name__ == "__main__":
    main()
