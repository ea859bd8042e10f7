"""Synthetic sacct output and GPU samples for the history benchmarks (not used by tests).

Each synthetic job record is the job record sacct 22.05 printed on the local cluster
(``tests/data/sacct-22.05.json``, job 1: a gpu:g2 job with its batch step and full TRES statistics)
with its id, times, user, account, GPU type and comment changed, so parsing costs what real records
cost (about 12 KB of JSON per job).
"""

import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE_FILE = REPO / "tests" / "data" / "sacct-22.05.json"
EPOCH = 1_700_000_000


def _template():
    job = json.loads(TEMPLATE_FILE.read_text())["jobs"][0]
    job["job_id"] = 999999001
    job["user"] = "__USER__"
    job["account"] = "__ACCOUNT__"
    job["name"] = "__NAME__"
    job["nodes"] = "__NODE__"
    job["state"]["current"] = "__STATE__"
    job["comment"]["job"] = "__COMMENT__"
    job["time"].update(submission=999999002, start=999999003, end=999999004, elapsed=999999005,
                       eligible=999999003)
    for item in job["tres"]["allocated"] + job["tres"]["requested"]:
        if item["name"] == "gpu:g2":
            item["name"] = "gpu:__GPU__"
    step = job["steps"][0]
    step["step"]["job_id"] = 999999001
    step["time"].update(start=999999003, end=999999004, elapsed=999999005)
    step["nodes"]["range"] = "__NODE__"
    step["nodes"]["list"] = ["__NODE__"]
    return json.dumps(job, separators=(",", ":"))


class SyntheticJobs:
    """Deterministic job records: ``count`` jobs, ``per_window`` of them in each sacct window."""

    def __init__(self, count, nodes=64, gpus=4, users=200, seed=1):
        self.count = count
        self.nodes, self.gpus, self.users = nodes, gpus, users
        self.template = _template()
        self.seed = seed

    def job(self, index, rng):
        start = EPOCH + index * 30
        elapsed = rng.randint(60, 7200)
        state = "COMPLETED" if rng.random() < 0.9 else rng.choice(["FAILED", "CANCELLED", "TIMEOUT"])
        text = self.template
        for token, value in (
            ("999999001", index + 1), ("999999002", start - 5), ("999999003", start),
            ("999999004", start + elapsed), ("999999005", elapsed), ("__USER__", f"user{index % self.users}"),
            ("__ACCOUNT__", f"acct{index % 20}"), ("__NAME__", f"train{index % 50}"),
            ("__NODE__", f"n{index % self.nodes + 1}"), ("__STATE__", state),
            ("__COMMENT__", f"class=cls{index % 12}"), ("__GPU__", f"g{rng.randrange(self.gpus)}"),
        ):
            text = text.replace(token, str(value))
        return text, state

    def window_text(self, first, last):
        """sacct --json text for jobs [first, last) and the matching ``JobIDRaw|ExitCode`` lines."""
        rng = random.Random(self.seed * 1_000_003 + first)
        parts, codes = [], []
        for index in range(first, last):
            text, state = self.job(index, rng)
            parts.append(text)
            code = 0 if state == "COMPLETED" else 1
            codes.append(f"{index + 1}|{code}:0\n{index + 1}.batch|{code}:0")
        return '{"meta":{},"errors":[],"jobs":[' + ",".join(parts) + "]}", "\n".join(codes)

    def write_json(self, path):
        text, _ = self.window_text(0, self.count)
        Path(path).write_text(text)


def gpu_sample_rows(job_ids, samples, nodes=64, gpus=4, seed=2):
    """``samples`` job_gpu_use rows and as many gpu_samples rows spread over ``job_ids``."""
    rng = random.Random(seed)
    use, gpu = [], []
    for i in range(samples):
        job = job_ids[i % len(job_ids)]
        node, index, ts = f"n{job % nodes + 1}", job % gpus, EPOCH + i * 0.5
        util = rng.uniform(0, 100)
        use.append((job, node, index, ts, util, util / 2, rng.uniform(100, 16000), 1, 0))
        gpu.append((node, index, ts, None, "Tesla V100-SXM2-16GB", util, util / 2, 8000.0, 16384.0, str(job)))
    return use, gpu


def finish(figures, work):
    """Print the figures as one JSON line, remove the work folder, return the exit status."""
    print(json.dumps(figures, sort_keys=True))
    for leftover in Path(work).iterdir():
        leftover.unlink()
    Path(work).rmdir()
    return 0 if figures["ok"] else 1
