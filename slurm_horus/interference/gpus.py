"""GPU memory sizes (MB) used by the memory-safety rule.

The built-in table uses the common single-GPU size of each name; a site overrides any entry (or adds
a GPU type) with ``--gpu-memory-mb TYPE=MB`` or a ``gpu_mem_mb`` column in profiles.csv. ``v100`` is
the 16 GB card (assumed for Gavel's measurements); a 32 GB V100 is ``v100-32gb``.
"""

from ..errors import InputError

GPU_MEMORY_MB = {
    "k80": 12288,  # one of the two dies of a K80 board
    "p100": 16384,
    "v100": 16384,
    "v100-32gb": 32768,
    "t4": 16384,
    "rtx2080ti": 11264,
    "rtx3090": 24576,  # Lucid's GPU_MEMORY_LIMITATION
    "rtx4090": 24576,
    "a10": 24576,
    "a30": 24576,
    "a40": 49152,
    "l4": 24576,
    "l40s": 49152,
    "a100": 40960,
    "a100-40gb": 40960,
    "a100-80gb": 81920,
    "h100": 81920,
    "h200": 144384,
}


def gpu_memory_mb(gpu_type, overrides=None):
    """Memory of one GPU of ``gpu_type`` in MB: ``overrides`` first, then the built-in table."""
    if overrides and gpu_type in overrides:
        return float(overrides[gpu_type])
    if gpu_type in GPU_MEMORY_MB:
        return float(GPU_MEMORY_MB[gpu_type])
    raise InputError(
        f"unknown GPU type {gpu_type!r}: its memory size is not known "
        f"(give it with --gpu-memory-mb {gpu_type}=MB or a gpu_mem_mb column in profiles.csv)"
    )


def memory_from_profiles(profiles):
    """GPU memory sizes given by the optional ``gpu_mem_mb`` column of profiles.csv."""
    sizes = {}
    for profile in profiles:
        size = profile.extra.get("gpu_mem_mb")
        if size:
            sizes[profile.gpu_type] = float(size)
    return sizes


# Peak dense throughput (TFLOP/s) from the vendors' data sheets: (FP32, FP16 on tensor cores with FP32
# accumulation; FP32 again where there are none). Used by the utilization model (utilmodel.py) only.
GPU_PEAK_TFLOPS = {
    "k80": (4.4, 4.4),  # one of the two dies
    "p100": (9.3, 18.7),
    "v100": (15.7, 125.0),
    "v100-32gb": (15.7, 125.0),
    "t4": (8.1, 65.0),
    "rtx2080ti": (13.4, 53.8),
    "rtx3090": (35.6, 71.0),
    "rtx4090": (82.6, 165.2),
    "a10": (31.2, 125.0),
    "a30": (10.3, 165.0),
    "a40": (37.4, 149.7),
    "l4": (30.3, 121.0),
    "l40s": (91.6, 362.0),
    "a100": (19.5, 312.0),
    "a100-40gb": (19.5, 312.0),
    "a100-80gb": (19.5, 312.0),
    "h100": (67.0, 989.0),
    "h200": (67.0, 989.0),
}
