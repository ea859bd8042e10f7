"""Every NVML call of slurm-horus goes through this module.

Two backends share one small interface (:class:`GpuBackend`):

* :class:`PynvmlBackend`: the real one, ``pynvml`` from the ``nvidia-ml-py`` distribution. Each call
  goes through :func:`nvml_call`, which turns NotSupported, NotFound, GPU-is-lost, no-permission and
  a missing library into ``None`` (the nvitop way), so a GPU that falls off the bus or a driver that
  lacks a query never crashes the collector.
* :class:`StandinBackend`: synthetic devices for GPU-less machines (the tests and the local cluster).
  Its processes are real processes of this machine: those whose environment carries
  ``GPU_DEVICE_ORDINAL`` (set by Slurm for gpu and shard GRES, also on fake GPUs) and
  ``HORUS_FAKE_GPU_UTIL`` (the synthetic SM utilization the fake job claims, 0..100) and, optionally,
  ``HORUS_FAKE_GPU_MEM_MB``. A fake job that feels interference (``horus fake-job``,
  ``slurm_horus/sim/fakejob.py``) also names its class (``HORUS_FAKE_CLASS``) and publishes what it
  shows *now* (its utilization drops with its speed when it shares) in a small status file under
  ``HORUS_FAKE_GPU_DIR`` (:func:`fake_status_path`); the stand-in reports that value.
  GPU utilization is the sum of its processes' utilization, capped at 100.
"""

import json
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..proc import list_pids, parent_pid, read_environ
from . import procfs


@dataclass
class GpuReading:
    index: int
    uuid: Optional[str]
    name: Optional[str]
    gpu_util: Optional[float]  # percent of time a kernel ran (NVML utilization.gpu)
    mem_util: Optional[float]  # percent of time memory was read/written
    mem_used_mb: Optional[float]
    mem_total_mb: Optional[float]


@dataclass
class ProcessReading:
    pid: int
    used_mem_mb: Optional[float] = None
    sm_util: Optional[float] = None
    mem_util: Optional[float] = None


class GpuBackend:
    """What the sampler needs from NVML (or its stand-in)."""

    name = "base"

    def device_count(self) -> int:
        raise NotImplementedError

    def read_gpu(self, index) -> Optional[GpuReading]:
        """One GPU's reading, or None when the GPU is gone."""
        raise NotImplementedError

    def processes(self, index) -> Optional[List[ProcessReading]]:
        """Compute processes on the GPU with per-process utilization where NVML gives it."""
        raise NotImplementedError

    def close(self):
        pass


# --- the real NVML -------------------------------------------------------------------------------

def _soft_errors(pynvml):
    """NVML error classes that mean "no value" rather than "bug"."""
    names = [
        "NVMLError_NotSupported", "NVMLError_NotFound", "NVMLError_GpuIsLost",
        "NVMLError_NoPermission", "NVMLError_FunctionNotFound", "NVMLError_Unknown",
        "NVMLError_InvalidArgument", "NVMLError_Uninitialized", "NVMLError_LibraryNotFound",
        "NVMLError_DriverNotLoaded",
    ]
    found = tuple(getattr(pynvml, name) for name in names if hasattr(pynvml, name))
    return found or (pynvml.NVMLError,)


def nvml_call(pynvml, function, *args, default=None):
    """Call ``pynvml.<function>(*args)``; NotSupported/missing/lost -> ``default``. The choke point."""
    func = getattr(pynvml, function, None)
    if func is None:  # an older nvidia-ml-py without this query
        return default
    try:
        return func(*args)
    except _soft_errors(pynvml):
        return default
    except pynvml.NVMLError:
        return default


def _mb(value):
    return None if value is None else value / (1024 * 1024)


class PynvmlBackend(GpuBackend):
    """NVML through pynvml; raises :class:`NvmlUnavailable` when no driver/library is there."""

    name = "nvml"

    def __init__(self):
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(f"pynvml is not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot start: {exc}") from None
        self.nvml = pynvml
        self._last_seen = {}  # index -> last process-utilization timestamp (microseconds)

    def device_count(self):
        return nvml_call(self.nvml, "nvmlDeviceGetCount", default=0)

    def _handle(self, index):
        return nvml_call(self.nvml, "nvmlDeviceGetHandleByIndex", index)

    def read_gpu(self, index):
        handle = self._handle(index)
        if handle is None:
            return None
        util = nvml_call(self.nvml, "nvmlDeviceGetUtilizationRates", handle)
        memory = nvml_call(self.nvml, "nvmlDeviceGetMemoryInfo", handle)
        name = nvml_call(self.nvml, "nvmlDeviceGetName", handle)
        uuid = nvml_call(self.nvml, "nvmlDeviceGetUUID", handle)
        return GpuReading(
            index=index,
            uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
            name=name.decode() if isinstance(name, bytes) else name,
            gpu_util=None if util is None else float(util.gpu),
            mem_util=None if util is None else float(util.memory),
            mem_used_mb=None if memory is None else _mb(memory.used),
            mem_total_mb=None if memory is None else _mb(memory.total),
        )

    def processes(self, index):
        handle = self._handle(index)
        if handle is None:
            return None
        running = nvml_call(self.nvml, "nvmlDeviceGetComputeRunningProcesses", handle, default=[])
        readings = {}
        for proc in running or []:
            used = getattr(proc, "usedGpuMemory", None)
            readings[proc.pid] = ProcessReading(pid=proc.pid, used_mem_mb=_mb(used) if used else None)
        # Samples newer than the last call only; the mean over them is this interval's utilization.
        samples = nvml_call(
            self.nvml, "nvmlDeviceGetProcessUtilization", handle, self._last_seen.get(index, 0), default=[]
        )
        per_pid = {}
        for sample in samples or []:
            per_pid.setdefault(sample.pid, []).append(sample)
            self._last_seen[index] = max(self._last_seen.get(index, 0), sample.timeStamp)
        for pid, items in per_pid.items():
            reading = readings.setdefault(pid, ProcessReading(pid=pid))
            reading.sm_util = sum(s.smUtil for s in items) / len(items)
            reading.mem_util = sum(s.memUtil for s in items) / len(items)
        return list(readings.values())

    def close(self):
        nvml_call(self.nvml, "nvmlShutdown")


class NvmlUnavailable(RuntimeError):
    """No usable NVML on this machine."""


# --- the stand-in ------------------------------------------------------------------------------

FAKE_UTIL_VAR = "HORUS_FAKE_GPU_UTIL"
FAKE_MEM_VAR = "HORUS_FAKE_GPU_MEM_MB"
FAKE_CLASS_VAR = "HORUS_FAKE_CLASS"
FAKE_DIR_VAR = "HORUS_FAKE_GPU_DIR"


@dataclass
class FakeGpuProcess:
    """A process of a fake GPU job, as its environment describes it."""

    pid: int
    job_id: Optional[str]
    gpus: List[int]
    util: Optional[float]  # the utilization it claims alone
    mem_mb: Optional[float]
    job_class: Optional[str]
    status_path: Optional[str]  # where it publishes what it does now (None: it does not)


def fake_gpu_process(pid, env, node=None, slurm_conf=None) -> Optional[FakeGpuProcess]:
    """The fake GPU process ``pid`` of this node and cluster, or None (not one, or not ours).

    The one reading of the fake jobs' variables: the stand-in NVML and the fake jobs themselves
    (who else is on my GPU) both see processes through it."""
    if not env or FAKE_UTIL_VAR not in env or "GPU_DEVICE_ORDINAL" not in env:
        return None
    if not procfs.is_ours(env, node, slurm_conf):
        return None
    job_id = env.get("SLURM_JOB_ID") or None
    return FakeGpuProcess(pid=pid, job_id=job_id, gpus=procfs.parse_gpu_list(env["GPU_DEVICE_ORDINAL"]),
                          util=_float(env.get(FAKE_UTIL_VAR)), mem_mb=_float(env.get(FAKE_MEM_VAR)),
                          job_class=env.get(FAKE_CLASS_VAR) or None,
                          status_path=fake_status_path(env.get(FAKE_DIR_VAR), job_id, pid))


def fake_status_path(directory, job_id, pid):
    """Where the fake job ``job_id``/``pid`` publishes its current reading (None without a directory)."""
    if not directory:
        return None
    return os.path.join(directory, f"{job_id or 'nojob'}.{pid}.json")


def write_fake_status(path, status):
    """Publish a fake job's current reading (atomically: a reader sees the old or the new one)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(status, handle, separators=(",", ":"))
    os.replace(tmp, path)


def read_fake_status(path):
    """The reading a fake job published, or None (none yet, or gone)."""
    if not path:
        return None
    try:
        with open(path) as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


@dataclass
class StandinBackend(GpuBackend):
    """Synthetic GPUs whose processes are this machine's fake GPU job processes.

    ``node`` / ``slurm_conf``: only job processes of this node and cluster count (several slurmd, even
    several local clusters, share one host; see ``procfs.is_ours``). ``lost``: indices that behave like a GPU fallen off the bus.
    ``extra_processes``: {index: [ProcessReading]} added as if NVML had reported them.
    """

    gpus: int = 4
    node: Optional[str] = None
    slurm_conf: Optional[str] = None
    gpu_name: str = "Stand-in GPU"
    mem_total_mb: float = 16384.0
    lost: set = field(default_factory=set)
    extra_processes: Dict[int, List[ProcessReading]] = field(default_factory=dict)
    proc_root: str = "/proc"
    name = "standin"
    reuse_s: float = 0.05  # one look at /proc serves every GPU of one sample

    def device_count(self):
        return self.gpus

    def _fake_processes(self):
        """{gpu index: [ProcessReading]} from the fake GPU jobs' environments."""
        now = time.monotonic()
        cached = getattr(self, "_last_look", None)
        if cached is not None and now - cached[0] < self.reuse_s:
            return cached[1]
        by_gpu = self._look()
        self._last_look = (now, by_gpu)
        return by_gpu

    def _look(self):
        by_gpu = {}
        for pid in list_pids(self.proc_root):
            env = read_environ(pid, self.proc_root)
            fake = fake_gpu_process(pid, env, self.node, self.slurm_conf)
            if fake is None:
                continue
            # A job's children inherit the variables; only the topmost carrier is "the" GPU process.
            parent_env = read_environ(parent_pid(pid, self.proc_root) or 0, self.proc_root)
            if parent_env and parent_env.get(FAKE_UTIL_VAR) is not None and \
                    parent_env.get("SLURM_JOB_ID") == env.get("SLURM_JOB_ID"):
                continue
            indices = fake.gpus
            util, mem = fake.util, fake.mem_mb
            status = read_fake_status(fake.status_path)
            if status is not None and _float(status.get("util")) is not None:
                util = _float(status["util"])  # what the job shows now (slower when it shares)
            for index in indices:
                # A multi-GPU process spreads its claimed memory; utilization is per GPU.
                by_gpu.setdefault(index, []).append(
                    ProcessReading(pid=pid, used_mem_mb=None if mem is None else mem / len(indices),
                                   sm_util=util, mem_util=None if util is None else util / 2)
                )
        return by_gpu

    def read_gpu(self, index):
        if index in self.lost or index >= self.gpus:
            return None
        procs = self.processes(index) or []
        sm = [p.sm_util for p in procs if p.sm_util is not None]
        mem = [p.used_mem_mb for p in procs if p.used_mem_mb is not None]
        return GpuReading(
            index=index, uuid=f"GPU-standin-{self.node or 'local'}-{index}", name=self.gpu_name,
            gpu_util=min(100.0, sum(sm)), mem_util=min(100.0, sum(sm) / 2),
            mem_used_mb=sum(mem), mem_total_mb=self.mem_total_mb,
        )

    def processes(self, index):
        if index in self.lost or index >= self.gpus:
            return None
        procs = list(self._fake_processes().get(index, []))
        procs.extend(self.extra_processes.get(index, []))
        return procs


def _float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def open_backend(kind="auto", **standin_options):
    """``nvml``, ``standin`` or ``auto`` (NVML when it starts, else the stand-in)."""
    if kind == "standin":
        return StandinBackend(**standin_options)
    try:
        return PynvmlBackend()
    except NvmlUnavailable:
        if kind == "nvml":
            raise
        return StandinBackend(**standin_options)


