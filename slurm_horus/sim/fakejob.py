"""Fake GPU jobs that feel interference: the simulator's progress rule, run by real job processes.

``horus fake-job --work W [--class C] [--truth T]`` is the payload of a fake GPU job on a GPU-less
cluster (the local cluster, the replay, the demo). It does ``W`` seconds of solo work. Every
``period`` seconds (0.1 s; the issue asks for at most 0.2 s) it looks at who else runs on its fake
GPU(s) and progresses, until the next look, at the **truth's normalized throughput** for that set
(``Truth.set_tputs``, the very rule the simulator applies: a pair's measured value, three or more
composed by additive slowdown); a job on several GPUs progresses at its slowest GPU's rate.

Who else is on my GPU: the fake GPU processes the stand-in NVML sees
(:func:`slurm_horus.collect.nvml.fake_gpu_process`): processes of this node and cluster
(``SLURMD_NODENAME``, ``SLURM_CONF``) whose ``GPU_DEVICE_ORDINAL`` (set by Slurm for ``gpu`` and
``shard`` GRES) names one of my GPUs, counted once per Slurm job, their class from
``HORUS_FAKE_CLASS`` (a co-runner without one is of an unknown class: the truth's ``missing`` value).

* **Start**: the work clock starts when the job's process started (``/proc/self/stat``; the batch
  script ``exec``s the payload, so that is when slurmstepd started the script), so the interpreter's
  start-up counts as work done at the rate first seen.
* **Out of memory**: a set the truth marks 0 (cannot run together) fails its newest member — the
  job whose process started last — at once, like a CUDA OOM, with exit code :data:`OOM_EXIT`; the
  simulator fails the new job of such a pair the same way. An older member ignores the newcomers that
  are failing meanwhile.
* **What it shows**: it publishes ``util = solo utilization x current rate`` (and the rate) where the
  stand-in NVML reads it (:func:`slurm_horus.collect.nvml.write_fake_status`), so the collector
  records a job that is slowed down as one that uses less of the GPU.
* At the end it prints one line (``fake-job: ...``) with its start, end, mean rate and time shared.

The environment carries the markers the stand-in reads (``HORUS_FAKE_GPU_UTIL``,
``HORUS_FAKE_CLASS``, ``HORUS_FAKE_GPU_DIR``); when started without them (``horus fake-job`` in a
user's script) the payload ``exec``s itself once with them set (same PID, same start time).
"""

import os
import signal
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ..collect import nvml, procfs
from ..proc import EnvironWatch, start_time
from .truth import Truth

OOM_EXIT = 3  # exit code of a fake job failed like an out-of-memory co-location
DEFAULT_PERIOD_S = 0.1
UNKNOWN_CLASS = "unknown"

# SM utilization a fake job of a model family shows alone (percent): compute-bound convolutional
# models keep the GPU busier than memory-bound recommendation models. Believable, not measured.
SOLO_UTIL_BY_FAMILY = {"resnet50": 90.0, "resnet18": 60.0, "transformer": 80.0, "lm": 70.0,
                       "recommendation": 35.0, "cyclegan": 85.0, "a3c": 40.0}
DEFAULT_SOLO_UTIL = 70.0


def solo_util(job_class: Optional[str]) -> float:
    family = (job_class or "").split("-bs")[0]
    return SOLO_UTIL_BY_FAMILY.get(family, DEFAULT_SOLO_UTIL)


# ---- the rule (pure) ---------------------------------------------------------------------------

Member = Tuple[float, str, str]  # (process start time, job id, class) of one job on one GPU


def gpu_rate(truth: Truth, gpu_type: str, members: Sequence[Member], me: str) -> Tuple[float, bool]:
    """(my normalized throughput on one GPU, whether I must fail) for the jobs on it (me included).

    Members are ordered by start time (then job id); when the truth says the set cannot run
    together, its newest member fails; an older one computes its rate without the newer members
    that are failing.
    """
    ordered = sorted(members, key=lambda m: (m[0], _job_order(m[1])))
    while len(ordered) > 1:
        classes = [m[2] for m in ordered]
        tputs = truth.set_tputs(classes, gpu_type)
        if min(tputs) > 0.0:
            mine = next(k for k, m in enumerate(ordered) if m[1] == me)
            return tputs[mine], False
        if ordered[-1][1] == me:
            return 0.0, True
        ordered = ordered[:-1]  # the newest fails; it is gone in a moment
    return 1.0, False


def _job_order(job_id: str):
    return (0, int(job_id)) if str(job_id).isdigit() else (1, str(job_id))


def job_rate(truth: Truth, gpu_type: str, by_gpu: Dict[int, List[Member]], me: str,
             my_gpus: Sequence[int]) -> Tuple[float, bool, List[str]]:
    """(rate, fail, classes of my co-runners) over all my GPUs: the slowest GPU sets the pace."""
    rate, fail, partners = 1.0, False, []
    for gpu in my_gpus:
        members = by_gpu.get(gpu) or []
        if not any(m[1] == me for m in members):
            members = list(members) + [(0.0, me, UNKNOWN_CLASS)]  # not seen yet: I am there all the same
        value, failing = gpu_rate(truth, gpu_type, members, me)
        rate = min(rate, value)
        fail = fail or failing
        partners += [m[2] for m in members if m[1] != me]
    return rate, fail, partners


# ---- who is on my GPU ----------------------------------------------------------------------------

class GpuNeighbours:
    """The fake jobs on the GPUs of one node and cluster, looked up cheaply every fraction of a second."""

    def __init__(self, node: Optional[str], slurm_conf: Optional[str], proc_root: str = "/proc"):
        self.node = node
        self.slurm_conf = slurm_conf
        self.proc_root = proc_root
        self.watch = EnvironWatch(self._classify, proc_root)
        self._starts: Dict[int, float] = {}

    def _classify(self, env):
        if nvml.fake_gpu_process(0, env, self.node, self.slurm_conf) is not None:
            return True
        if env.get("SLURM_JOB_ID") and procfs.is_ours(env, self.node, self.slurm_conf):
            return None  # a job's process that may still exec into a fake job (its batch shell)
        return False

    def by_gpu(self) -> Dict[int, List[Member]]:
        """{gpu index: [(start time, job id, class)]}, one entry per job (its earliest process)."""
        jobs: Dict[Tuple[int, str], Member] = {}
        found = self.watch.scan()
        self._starts = {pid: t for pid, t in self._starts.items() if pid in found}
        for pid, env in found.items():
            fake = nvml.fake_gpu_process(pid, env, self.node, self.slurm_conf)
            if fake is None or fake.job_id is None:
                continue
            if pid not in self._starts:
                self._starts[pid] = start_time(pid, self.proc_root) or time.time()
            member = (self._starts[pid], fake.job_id, fake.job_class or UNKNOWN_CLASS)
            for gpu in fake.gpus:
                key = (gpu, fake.job_id)
                if key not in jobs or member[0] < jobs[key][0]:
                    jobs[key] = member
        out: Dict[int, List[Member]] = {}
        for (gpu, _job), member in jobs.items():
            out.setdefault(gpu, []).append(member)
        return out


# ---- the payload ---------------------------------------------------------------------------------

class FakeJob:
    """One running fake job: its work, its rate, what it publishes."""

    def __init__(self, work_s: float, job_class: str, truth: Truth, gpu_type: str, util: float,
                 env=None, period_s: float = DEFAULT_PERIOD_S, clock=time.time, sleep=time.sleep,
                 neighbours: Optional[GpuNeighbours] = None, started: Optional[float] = None):
        env = os.environ if env is None else env
        self.work_s = max(0.0, float(work_s))
        self.job_class = job_class
        self.truth = truth
        self.gpu_type = gpu_type
        self.util = util
        self.period_s = period_s
        self.clock = clock
        self.sleep = sleep
        self.job_id = env.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
        self.gpus = procfs.parse_gpu_list(env.get("GPU_DEVICE_ORDINAL"))
        self.neighbours = neighbours or GpuNeighbours(env.get("SLURMD_NODENAME"), env.get("SLURM_CONF"))
        self.status_path = nvml.fake_status_path(env.get(nvml.FAKE_DIR_VAR), env.get("SLURM_JOB_ID"),
                                                 os.getpid())
        self.started = started if started is not None else (start_time(os.getpid()) or clock())
        self.done = 0.0
        self.shared_s = 0.0
        self.partners_seen: List[str] = []
        self._published = None

    def look(self) -> Tuple[float, bool, List[str]]:
        if not self.gpus:
            return 1.0, False, []  # no GPU: nobody to share with
        return job_rate(self.truth, self.gpu_type, self.neighbours.by_gpu(), self.job_id, self.gpus)

    def _publish(self, rate: float, partners: List[str]):
        status = {"util": round(min(100.0, self.util * rate), 1), "rate": round(rate, 4),
                  "class": self.job_class, "corunners": sorted(partners)}
        if self.status_path and status != self._published:
            try:
                nvml.write_fake_status(self.status_path, status)
                self._published = status
            except OSError:
                pass  # the stand-in then shows the solo claim: nothing else is lost

    def run(self) -> int:
        """Work until done (0) or fail like an OOM (OOM_EXIT)."""
        last = self.started
        rate = None
        while True:
            now = self.clock()
            new_rate, fail, partners = self.look()
            if fail:
                others = ", ".join(sorted(set(partners))) or "?"
                print(f"fake-job: CUDA out of memory (emulated): {self.job_class} cannot share GPU "
                      f"{self.gpus} with {others} (truth {self.truth.name})", file=sys.stderr, flush=True)
                self._cleanup()
                return OOM_EXIT
            if rate is None:
                rate = new_rate  # start-up: the first set seen is the one it started with
            elapsed = max(0.0, now - last)
            self.done += rate * elapsed
            if rate < 1.0:
                self.shared_s += elapsed
            last, rate = now, new_rate
            for partner in partners:
                if partner not in self.partners_seen:
                    self.partners_seen.append(partner)
            self._publish(rate, partners)
            left = self.work_s - self.done
            if left <= 1e-6:
                break
            self.sleep(min(self.period_s, left / rate) if rate > 0 else self.period_s)
        end = self.clock()
        wall = end - self.started
        cpu = sum(os.times()[:2])  # what looking every period cost (the interpreter's start included)
        print(f"fake-job: job={self.job_id} class={self.job_class} work={self.work_s:.3f}s wall={wall:.3f}s "
              f"mean_rate={self.work_s / wall if wall > 0 else 1.0:.4f} shared={self.shared_s:.3f}s "
              f"start={self.started:.3f} end={end:.3f} gpus={','.join(map(str, self.gpus)) or '-'} "
              f"corunners={','.join(self.partners_seen) or '-'} cpu={cpu:.3f}s", flush=True)
        self._cleanup()
        return 0

    def _cleanup(self):
        if self.status_path:
            try:
                os.unlink(self.status_path)
            except OSError:
                pass


def exec_with_markers(argv: Sequence[str], job_class: str, util: float, env=None):
    """Re-run this command with the stand-in's variables set, unless they are (same PID: exec)."""
    env = dict(os.environ if env is None else env)
    wanted = {nvml.FAKE_UTIL_VAR: f"{util:g}", nvml.FAKE_CLASS_VAR: job_class,
              nvml.FAKE_DIR_VAR: env.get(nvml.FAKE_DIR_VAR) or os.path.join(
                  tempfile.gettempdir(), f"horus-fake-gpu-{os.getuid()}")}
    os.makedirs(wanted[nvml.FAKE_DIR_VAR], exist_ok=True)
    if all(env.get(k) == v for k, v in wanted.items()):
        return
    env.update(wanted)
    os.execve(sys.executable, [sys.executable, "-m", "slurm_horus", *argv], env)


def gpu_type_of(truth: Truth, gpu_type: Optional[str]) -> str:
    from ..errors import InputError

    if gpu_type:
        return gpu_type.lower()
    if truth.name.startswith("gavel:"):
        return truth.name.split(":", 1)[1]
    if len(truth.gpu_types) == 1:
        return truth.gpu_types[0]
    if truth.constant is not None:
        return "any"
    raise InputError(f"--truth {truth.name}: several GPU types ({', '.join(truth.gpu_types)}); give --gpu-type")


def run_fake_job(work_s: float, job_class: Optional[str], truth_spec: str, gpu_type: Optional[str] = None,
                 util: Optional[float] = None, period_s: float = DEFAULT_PERIOD_S, argv=None) -> int:
    """The ``horus fake-job`` command: check, (re-)exec with the markers, load the truth, run."""
    from ..errors import InputError
    from .truth import load_truth

    if work_s < 0:
        raise InputError("--work must be >= 0 seconds")
    if not 0 < period_s <= 0.2:
        raise InputError("--period must be in (0, 0.2] seconds")
    job_class = job_class or os.environ.get(nvml.FAKE_CLASS_VAR) or UNKNOWN_CLASS
    if util is None:
        claimed = os.environ.get(nvml.FAKE_UTIL_VAR)
        util = float(claimed) if claimed and job_class == os.environ.get(nvml.FAKE_CLASS_VAR) \
            else solo_util(job_class)
    if not 0 <= util <= 100:
        raise InputError("--util must be within 0..100")
    if argv is not None:
        exec_with_markers(argv, job_class, util)
    truth = load_truth(truth_spec)
    job = FakeJob(work_s, job_class, truth, gpu_type_of(truth, gpu_type), util, period_s=period_s)
    signal.signal(signal.SIGTERM, lambda *_: (job._cleanup(), os._exit(143)))
    return job.run()


def job_script(work_s: float, job_class: str, truth: str = "gavel:v100", status_dir: Optional[str] = None,
               util: Optional[float] = None, gpu_type: Optional[str] = None, python: str = sys.executable,
               period_s: float = DEFAULT_PERIOD_S) -> str:
    """A batch script whose job is a fake GPU job: it exports the stand-in's variables and ``exec``s
    the payload (so the payload's start is the script's start)."""
    import shlex

    util = solo_util(job_class) if util is None else util
    env = [f"{nvml.FAKE_CLASS_VAR}={shlex.quote(job_class)}", f"{nvml.FAKE_UTIL_VAR}={util:g}"]
    if status_dir:
        env.append(f"{nvml.FAKE_DIR_VAR}={shlex.quote(str(status_dir))}")
    command = [python, "-m", "slurm_horus", "fake-job", "--work", f"{work_s:.3f}", "--truth", truth,
               "--period", f"{period_s:g}"]
    if gpu_type:
        command += ["--gpu-type", gpu_type]
    return "#!/bin/sh\nexport " + " ".join(env) + "\nexec " + " ".join(shlex.quote(str(c)) for c in command) + "\n"
