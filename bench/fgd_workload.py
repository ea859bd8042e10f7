"""A workload and a cluster of the shape of FGD's default experiment (Alibaba GPU v2023, openb).

Built, not copied: no Alibaba row ships with slurm-horus. What the shape rests on:

* cluster: 1,213 GPU nodes, 6,216 GPUs (the paper's openb cluster: 1,213 GPU nodes, 6,212 GPUs); node
  kinds (GPU model, GPUs, CPU milli, host MiB) as they appear in the public node list
  (``openb_node_list_gpu_node.csv``), their counts estimated from its first 457 rows and scaled;
* requests (8,152 as in ``openb_pod_list_default.csv``): 13.3 % CPU-only, 37.8 % a fraction of one
  GPU (43.6 % of GPU requests: the issue's and the paper's figure), 48.0 % one whole GPU, 0.3 % each
  2, 4 and 8 GPUs; the fractions and CPU requests drawn from the values seen in the first 226 rows
  of the pod list (milli-GPU 50–810, CPU 3,152–18,708 milli), host memory not stated (not checked).

So it has the published *shape* (mix of request kinds, node kinds, sizes), not the trace's exact
rows: a policy's figure on it is comparable to the paper's only as far as that shape decides it.
"""

import csv
import numpy as np

# (model, GPUs, cpu_milli, memory_mib, nodes)
NODE_KINDS = [
    ("G2", 8, 96000, 393216, 509), ("T4", 2, 104000, 524288, 330), ("P100", 2, 16000, 122880, 128),
    ("P100", 2, 64000, 262144, 56), ("G3", 8, 128000, 786432, 64), ("V100M32", 8, 96000, 786432, 30),
    ("V100M32", 4, 48000, 376832, 8), ("V100M16", 4, 32000, 131072, 38), ("V100M16", 8, 64000, 262144, 10),
    ("V100M16", 1, 8000, 32768, 10), ("T4", 4, 96000, 393216, 20), ("P100", 1, 8000, 61440, 10),
]
GPU_MEMORY_MB = {"G2": 32768, "G3": 32768, "T4": 16384, "P100": 16384, "V100M16": 16384, "V100M32": 32768,
                 "A10": 22731}

KIND_WEIGHTS = [("cpu", 13.3), ("share", 37.8), ("gpu1", 48.0), ("gpu2", 0.3), ("gpu4", 0.3), ("gpu8", 0.3)]
# (milli-GPU, cpu_milli, weight) of fractional requests
SHARE = [(470, 8000, 10), (470, 11908, 4), (460, 6000, 12), (320, 4000, 6), (320, 8000, 4), (220, 4000, 6),
         (220, 8000, 2), (810, 3152, 5), (810, 4152, 1), (550, 4152, 3), (230, 4000, 2), (230, 8000, 1),
         (160, 4000, 2), (160, 6000, 1), (650, 8000, 2), (110, 4000, 2), (440, 8000, 1), (480, 4000, 1),
         (50, 4000, 1), (270, 4152, 1), (590, 3152, 1)]
WHOLE_CPU = [(3152, 40), (12000, 18), (16000, 15), (18708, 8), (8000, 8), (4000, 5), (11908, 3), (9810, 2),
             (15700, 1)]
CPU_ONLY = [(8000, 60), (20000, 15), (32000, 15), (12500, 10)]
MULTI_CPU = {2: 32000, 4: 64000, 8: 88000}


def write_nodes(path, seed=0):
    """The node list, kinds interleaved at random as in the published list."""
    rows = [(model, gpus, cpu, mem) for model, gpus, cpu, mem, count in NODE_KINDS for _ in range(count)]
    order = np.random.default_rng(seed).permutation(len(rows))
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for k, i in enumerate(order):
            model, gpus, cpu, mem = rows[i]
            out.writerow([f"node-{k:04d}", cpu, mem, gpus, model])
    return sum(c for *_, c in NODE_KINDS), sum(g * c for _m, g, _c, _mm, c in NODE_KINDS)


def _pick(rng, items, weight_index=-1):
    w = np.array([it[weight_index] for it in items], dtype=float)
    return items[int(rng.choice(len(items), p=w / w.sum()))]


def write_pods(path, n=8152, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                      "creation_time", "deletion_time", "scheduled_time"])
        for k in range(n):
            kind = _pick(rng, KIND_WEIGHTS)[0]
            if kind == "cpu":
                cpu, gpus, milli = _pick(rng, CPU_ONLY)[0], 0, 0
            elif kind == "share":
                milli, cpu, _ = _pick(rng, SHARE)
                gpus = 1
            elif kind == "gpu1":
                cpu, gpus, milli = _pick(rng, WHOLE_CPU)[0], 1, 1000
            else:
                gpus = int(kind[3:])
                cpu, milli = MULTI_CPU[gpus], 1000
            out.writerow([f"pod-{k:04d}", cpu, 0, gpus, milli, "", "LS", "Running", k, k + 3600, k])
    return n
