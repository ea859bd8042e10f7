"""What job_submit.lua + horusd add to sbatch: wall time per submission, interleaved.

Two local clusters side by side (real Slurm 22.05 daemons): A runs slurm-horus (job_submit.lua asking
horusd or taking its offers, binding shard, the site default refresh), B has JobSubmitPlugins off. Submissions alternate A, B, A, B... (>= 200
each; GPU jobs with a known class so horusd really decides), held (-H) so the clusters stay idle.
Prints JSON: medians, p90, and the ratio A/B (goal <= 1.15); the plugin cluster's sbatch median by
the Lua's path (a published offer taken, horusd asked and "placed", "kept" for its queue, ...). Needs root and the Debian
packages (as `make test` installs); reads no ../shared data.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time

from slurm_horus.config import SETTINGS
from slurm_horus.localcluster import LocalCluster


def submit(cluster, job_class):
    started = time.perf_counter()
    result = subprocess.run(["sbatch", "--parsable", "-H", "--gres=gpu:1", f"--comment=class={job_class}",
                             "-o", "/dev/null", "--wrap", "true"], env=cluster.env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"sbatch failed: {result.stderr.strip()}")
    return elapsed * 1000


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    # the site defaults, not the local cluster's test-friendly 1 s refresh: every refresh makes
    # slurmctld pack the whole queue (held jobs pile up here) while submissions wait for its lock
    with_horus = LocalCluster(horus=True, horus_settings={"refresh_s": str(SETTINGS["refresh_s"].default)}).up()
    plain = LocalCluster(horus=False, job_submit_plugin=False).up()
    try:
        time.sleep(2)
        classes = ["resnet18-bs32", "lm-bs20", "resnet50-bs64", "transformer-bs64"]
        for i in range(10):  # warm both (first scheduling pass, page cache)
            submit(with_horus, classes[i % 4]), submit(plain, classes[i % 4])
        horus_ms, plain_ms = [], []
        for i in range(runs):
            first, second = (with_horus, plain) if i % 2 == 0 else (plain, with_horus)
            for cluster in (first, second):
                (horus_ms if cluster is with_horus else plain_ms).append(submit(cluster, classes[i % 4]))
        log = (with_horus.root / "log" / "slurmctld.log").read_text()
        outcomes = re.findall(r"lua: horus: job name=wrap uid=0 (\w+).*?( \(offer \d+\))?( \([0-9.]+ ms\))?$", log, re.M)
        # one line per submission, in order (the first 10 were the warm-up): sbatch wall time by path
        paths = {}
        if len(outcomes) == len(horus_ms) + 10:
            for (outcome, offer, _ms), wall in zip(outcomes[10:], horus_ms):
                paths.setdefault("offer" if offer else outcome, []).append(wall)
        placed = log.count("lua: horus: job name=wrap uid=0 placed")
        lua_ms = [float(m) for m in re.findall(r"lua: horus: job name=wrap .*\(([0-9.]+) ms\)$", log, re.M)]
        out = {
            "benchmark": "sbatch_wall_time_with_job_submit_lua_and_horusd", "runs_each": runs,
            "horus_median_ms": round(statistics.median(horus_ms), 2),
            "plain_median_ms": round(statistics.median(plain_ms), 2),
            "horus_p90_ms": round(sorted(horus_ms)[int(0.9 * runs)], 2),
            "plain_p90_ms": round(sorted(plain_ms)[int(0.9 * runs)], 2),
            "ratio_median": round(statistics.median(horus_ms) / statistics.median(plain_ms), 3),
            "goal_ratio": 1.15, "decisions_placed_by_horusd": placed,
            "of_which_from_offers": log.count(" (offer "),
            "lua_median_ms": round(statistics.median(lua_ms), 3) if lua_ms else None, "load_average": os.getloadavg()[0],
            "horus_median_ms_by_path": {path: {"n": len(walls), "median_ms": round(statistics.median(walls), 2)}
                                        for path, walls in sorted(paths.items())},
        }
        print(json.dumps(out, indent=2))
    finally:
        with_horus.down()
        plain.down()


if __name__ == "__main__":
    main()
