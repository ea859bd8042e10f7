"""The real NVML path on a real GPU: `horus collect --backend nvml` while real CUDA training runs.

Runs on a machine with an NVIDIA GPU and PyTorch (not in CI, not on a GPU-less machine): two
synthetic-data training processes (ResNet-18, batch 64, 224x224; a 6-layer Transformer encoder,
batch 32 x 256 tokens), each alone and then both on the GPU at once (plain time-slicing), each
process carrying a ``SLURM_JOB_ID`` (as under proctrack/linuxproc) and ``GPU_DEVICE_ORDINAL``.
Meanwhile ``python -m slurm_horus collect --backend nvml`` samples every second into a spool, which
is exported as JSON lines. Also reads NVML once through the collector's backend while both run, to
record which queries the driver answers (per-process utilization, process list).

Prints JSON (and writes it to ``--out``/nvml_probe.json): the device, driver and pynvml version;
steps/s alone and shared, and each job's normalized throughput; what the collector sampled per
phase (GPU utilization, memory, the processes and the jobs it mapped them to).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOAD = r"""
import json, sys, time, torch
kind, seconds = sys.argv[1], float(sys.argv[2])
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
if kind == "resnet18":
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000).to(dev)
    x = torch.randn(64, 3, 224, 224, device=dev); y = torch.randint(0, 1000, (64,), device=dev)
    loss_of = lambda: torch.nn.functional.cross_entropy(model(x), y)
else:
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 6).to(dev)
    x = torch.randn(32, 256, 512, device=dev)
    loss_of = lambda: model(x).pow(2).mean()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def step():
    opt.zero_grad(set_to_none=True); loss_of().backward(); opt.step()
end = time.time() + 3.0
while time.time() < end:
    step()
torch.cuda.synchronize()
steps, start = 0, time.time()
while time.time() - start < seconds:
    step(); steps += 1
    if steps % 10 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
elapsed = time.time() - start
print(json.dumps({"kind": kind, "steps": steps, "seconds": round(elapsed, 3), "steps_per_s": round(steps / elapsed, 3),
                  "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}), flush=True)
"""


def start_workload(kind, seconds, job_id):
    env = {**os.environ, "SLURM_JOB_ID": str(job_id), "GPU_DEVICE_ORDINAL": "0", "CUDA_VISIBLE_DEVICES": "0"}
    return subprocess.Popen([sys.executable, "-c", WORKLOAD, kind, str(seconds)], env=env, stdout=subprocess.PIPE,
                            text=True)


def finish(proc):
    out, _ = proc.communicate(timeout=300)
    return json.loads(out.strip().splitlines()[-1])


def nvml_facts():
    """What the driver answers through the collector's backend (while the pair runs)."""
    from slurm_horus.collect.nvml import PynvmlBackend
    import pynvml

    backend = PynvmlBackend()
    try:
        facts = {"pynvml": getattr(pynvml, "__version__", None),
                 "driver": backend.nvml.nvmlSystemGetDriverVersion(),
                 "device_count": backend.device_count()}
        gpu = backend.read_gpu(0)
        facts["gpu"] = gpu.__dict__ if gpu else None
        time.sleep(1.0)
        backend.processes(0)  # the first call sets the timestamp; the second gets the samples since
        time.sleep(1.0)
        procs = backend.processes(0)
        facts["processes"] = [p.__dict__ for p in procs] if procs is not None else None
        handle = backend._handle(0)
        for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessUtilization"):
            try:
                args = (handle, 0) if query.endswith("Utilization") else (handle,)
                result = getattr(pynvml, query)(*args)
                facts[query] = f"supported ({len(result)} entries)"
            except pynvml.NVMLError as exc:
                facts[query] = f"error: {exc}"
        facts["own_pid"] = os.getpid()
        return facts
    finally:
        backend.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds per phase")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    out = Path(args.out)
    spool = out / "spool.db"
    phases = {}
    collector = subprocess.Popen([sys.executable, "-m", "slurm_horus", "collect", "--backend", "nvml", "--interval", "1",
                                  "--ship-every", "0", "--spool", str(spool), "--node", "gpu0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for kind, job in (("resnet18", 1001), ("transformer", 1002)):
            began = time.time()
            phases[f"{kind} alone"] = {"began": began, "result": finish(start_workload(kind, args.seconds, job)),
                                       "ended": time.time()}
        began = time.time()
        pair = [start_workload("resnet18", args.seconds + 4, 1001), start_workload("transformer", args.seconds + 4, 1002)]
        time.sleep(8.0)  # both past start-up and warm-up
        facts = nvml_facts()
        results = [finish(p) for p in pair]
        phases["both"] = {"began": began, "result": results, "ended": time.time()}
    finally:
        collector.terminate()
        _, collector_err = collector.communicate(timeout=30)
    exported = out / "batches.jsonl"
    with open(exported, "w") as sink:
        subprocess.run([sys.executable, "-m", "slurm_horus", "collect", "--spool", str(spool), "--export", "-"],
                       stdout=sink, check=False)
    samples = [json.loads(line) for line in exported.read_text().splitlines() if line.strip()]
    alone = {phases[f"{k} alone"]["result"]["kind"]: phases[f"{k} alone"]["result"]["steps_per_s"]
             for k in ("resnet18", "transformer")}
    shared = {r["kind"]: r["steps_per_s"] for r in phases["both"]["result"]}
    report = {
        "benchmark": "real_nvml_collector_and_one_pair", "nvml": facts, "phases": phases,
        "normalized_throughput": {k: round(shared[k] / alone[k], 3) for k in alone},
        "combined_throughput": round(sum(shared[k] / alone[k] for k in alone), 3),
        "collector_stderr": collector_err[-2000:], "batches": len(samples),
        "sample_preview": samples[:2] + samples[-2:],
    }
    (out / "nvml_probe.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: report[k] for k in ("nvml", "normalized_throughput", "combined_throughput", "batches")},
                     indent=2, default=str))


if __name__ == "__main__":
    main()
