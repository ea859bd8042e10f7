"""Trace readers: every supported format becomes a list of :class:`TraceJob`.

A TraceJob's ``duration`` is its run time alone on its GPUs (seconds): the work the simulator must
get done. Formats (``--trace-format``; ``auto`` guesses from the header / extension):

* ``generic``: CSV with a header; required ``submit_time`` (s), ``duration`` (s), ``num_gpus``;
  optional ``job_id``, ``job_class``, ``gpus_per_node``, ``partition``, ``user``, ``mem_mb``,
  ``time_limit`` (s; empty or 0: none).
* ``philly``: Pollux's ``philly.csv`` (``timestamp,duration,num_gpus,gpu_time,cluster``); the submit
  time is the timestamp minus the earliest one; the virtual cluster becomes the user.
* ``gavel``: Gavel's tab-separated traces, 7 fields (job_type, command, num_steps_arg,
  needs_data_dir, total_steps, arrival_time, scale_factor) or 10 fields (job_type, command,
  working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
  arrival_time); duration = total_steps / the class's measured solo steps/s on the cluster's GPU.
* ``pollux``: Pollux / Sia / DeepBoot workload CSV (``name,time,application,num_replicas,batch_size``
  [``,duration,num_task``]); training rows carry no usable duration, so it is derived from the
  application's traces (see :func:`pollux_duration`); DeepBoot inference rows (``num_task`` ≥ 0)
  keep their ``duration`` and go to the ``infer`` partition.
* ``tiresias``: Tiresias / Muri CSV (``job_id,num_gpu,submit_time,iterations,model_name,duration,...``).
  Some public traces in this format store times in milliseconds: ``time_unit="ms"`` (``--time-unit
  ms``) divides submit times and durations by 1,000; :func:`time_unit_warning` says when durations
  read as seconds look like milliseconds.
* ``alibaba``: Alibaba GPU v2023 pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
  ...,creation_time,deletion_time,scheduled_time``): every pod, CPU-only ones included; a pod asking
  ``gpu_milli`` < 1000 of one GPU is a fractional request (``gpu_milli``), others ask whole GPUs;
  ``gpu_spec`` lists the GPU models it accepts; duration = deletion − scheduled time.

Jobs without a model identity get ``job_class = None``; the simulator assigns classes from the truth
table by seed.
"""

import datetime as dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InputError
from ..textfiles import csv_records, header_of, text_lines

FORMATS = ("auto", "generic", "philly", "gavel", "pollux", "tiresias", "alibaba")
TIME_UNITS = {"s": 1.0, "ms": 1000.0}  # --time-unit: the divisor that turns the trace's times into seconds
# A median run time above a day, read as seconds, is far outside any published DL trace (Philly,
# Helios, Alibaba, Tiresias: minutes to hours) and is what a trace in milliseconds looks like.
MS_SUSPECT_MEDIAN = 86400.0


@dataclass
class TraceJob:
    job_id: str
    submit_time: float
    duration: float  # seconds alone (exclusive)
    num_gpus: int = 1
    gpus_per_node: int = 0  # 0: the simulator packs the job onto as few nodes as possible
    job_class: Optional[str] = None
    partition: str = ""
    user: str = ""
    mem_mb: float = 0.0
    time_limit: Optional[float] = None  # seconds, when the trace gives one (what a live site knows)
    kind: str = "train"  # or "infer"
    gpu_fraction: float = 1.0
    # what the request states of its GPUs (issue 21): 0 = not stated (the interference model's
    # whole-GPU jobs), 1..999 = milli of one GPU, 1000 = whole GPUs (exclusive)
    gpu_milli: int = 0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0
    gpu_types: tuple = ()  # accepted GPU models (lower case), () = any
    source: str = ""  # file:line, for error messages
    extra: Dict[str, str] = field(default_factory=dict)
    # how the job scales with its replica count (Pollux-format workloads: the application's traces)
    scaling: Optional["PolluxApplications"] = None


def _bad(path, line, message):
    return InputError(f"{path}:{line}: {message}")


def _number(path, line, row, key, kind=float, minimum=None):
    raw = row.get(key)
    if not isinstance(raw, str) or raw.strip() == "":
        raise _bad(path, line, f"missing value for {key!r}")
    try:
        value = float(raw)
    except ValueError:
        raise _bad(path, line, f"{key}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise _bad(path, line, f"{key}={raw!r} is not finite")
    if kind is int:
        if not value.is_integer():
            raise _bad(path, line, f"{key}={raw!r} is not a whole number")
        value = int(value)
    if minimum is not None and value < minimum:
        raise _bad(path, line, f"{key}={raw!r} must be >= {minimum}")
    return value


def _optional(path, line, row, key, kind=float, default=0, minimum=None):
    """An optional numeric column: ``default`` when empty, else checked like :func:`_number`."""
    raw = row.get(key)
    if not isinstance(raw, str) or raw.strip() == "":
        return default
    return _number(path, line, row, key, kind, minimum)


def _text(row, key):
    value = row.get(key)
    return value.strip() if isinstance(value, str) else ""


def _csv_rows(path, required: Sequence[str]):
    """(line number, row dict) of a CSV with a header; checks the required columns."""
    reader, records = csv_records(path)
    names = header_of(reader, path)
    if names is None:
        raise _bad(path, 1, "empty file (expected a CSV header)")
    names = [n.strip() for n in names]
    reader.fieldnames = names
    missing = [c for c in required if c not in names]
    if missing:
        raise _bad(path, 1, f"missing column(s) {', '.join(missing)} (header: {','.join(names)})")

    def rows():
        for line, row in records:
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            yield line, row
    return rows()


def read_generic(path, **_) -> List[TraceJob]:
    jobs = []
    for line, row in _csv_rows(path, ("submit_time", "duration", "num_gpus")):
        duration = _number(path, line, row, "duration", minimum=0.0)
        num_gpus = _number(path, line, row, "num_gpus", int, minimum=1)
        gpn = _optional(path, line, row, "gpus_per_node", int, 0, minimum=0)
        if gpn and num_gpus % gpn:
            raise _bad(path, line, f"num_gpus={num_gpus} is not a multiple of gpus_per_node={gpn}")
        limit = _optional(path, line, row, "time_limit", float, 0.0, minimum=0.0) or None
        jobs.append(TraceJob(
            job_id=_text(row, "job_id") or f"job{len(jobs)}",
            submit_time=_number(path, line, row, "submit_time", minimum=0.0), duration=duration,
            num_gpus=num_gpus, gpus_per_node=gpn, job_class=_text(row, "job_class") or None,
            partition=_text(row, "partition"), user=_text(row, "user"),
            mem_mb=_optional(path, line, row, "mem_mb", float, 0.0, minimum=0.0), time_limit=limit,
            source=f"{path}:{line}"))
    return jobs


def read_philly(path, **_) -> List[TraceJob]:
    raw = []
    for line, row in _csv_rows(path, ("timestamp", "duration", "num_gpus")):
        try:
            stamp = dt.datetime.strptime(_text(row, "timestamp"), "%Y-%m-%d %H:%M:%S").timestamp()
        except (ValueError, OverflowError, OSError):
            raise _bad(path, line, f"timestamp={row.get('timestamp')!r} is not YYYY-MM-DD HH:MM:SS") from None
        duration = _number(path, line, row, "duration", minimum=0.0)
        num_gpus = _number(path, line, row, "num_gpus", int, minimum=1)
        raw.append((stamp, duration, num_gpus, _text(row, "cluster"), line))
    if not raw:
        return []
    start = min(r[0] for r in raw)
    return [TraceJob(f"philly{i}", stamp - start, duration, num_gpus, user=cluster, source=f"{path}:{line}")
            for i, (stamp, duration, num_gpus, cluster, line) in enumerate(raw)]


def read_gavel(path, solo_tput: Optional[Callable[[str], Optional[float]]] = None, **_) -> List[TraceJob]:
    """Gavel traces; ``solo_tput(job_class)`` gives steps/s alone on the cluster's GPU type."""
    from ..interference import gavel_class

    jobs = []
    for line, text in enumerate(text_lines(path), 1):
        text = text.rstrip("\r\n")
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) == 7:
            job_type, steps_raw, arrival_raw, scale_raw = fields[0], fields[4], fields[5], fields[6]
        elif len(fields) == 10:
            job_type, steps_raw, scale_raw, arrival_raw = fields[0], fields[5], fields[6], fields[9]
        else:
            raise _bad(path, line, f"{len(fields)} tab-separated fields (Gavel traces have 7 or 10)")
        row = {"total_steps": steps_raw, "arrival_time": arrival_raw, "scale_factor": scale_raw}
        steps = _number(path, line, row, "total_steps", minimum=0.0)
        arrival = _number(path, line, row, "arrival_time")
        scale = _number(path, line, row, "scale_factor", int, minimum=1)
        try:
            job_class = gavel_class(job_type)
        except ValueError as exc:
            raise _bad(path, line, str(exc)) from None
        tput = solo_tput(job_class) if solo_tput else None
        if not tput:
            raise _bad(path, line, f"unknown class {job_class!r} (no solo throughput in the truth/profiles)")
        jobs.append(TraceJob(f"gavel{len(jobs)}", max(0.0, arrival), steps / tput, scale,
                             job_class=job_class, source=f"{path}:{line}"))
    return jobs


def _pollux_traces_dir(path: Path, traces_dir) -> Path:
    if traces_dir:
        return Path(traces_dir)
    for candidate in (path.parent.parent / "traces", path.parent / "traces", path.parent.parent.parent / "traces"):
        if candidate.is_dir():
            return candidate
    raise InputError(f"{path}: cannot find the application traces directory (give --traces-dir)")


def _read_floats(path: Path, columns: Sequence[str]):
    out = []
    for line, row in _csv_rows(path, columns):
        out.append(tuple(_number(path, line, row, c) for c in columns))
    return out


class PolluxApplications:
    """Per-application traces (validation-<bsz>.csv, placements.csv) used to derive durations."""

    def __init__(self, traces_dir: Path, gpus_per_node: int = 4):
        self.dir = Path(traces_dir)
        self.gpus_per_node = gpus_per_node
        self._steps: Dict[str, Dict[int, float]] = {}
        self._placements: Dict[str, Dict[str, List[tuple]]] = {}
        self._scaling: Dict[str, Dict[tuple, List[tuple]]] = {}
        self._ttt: Dict[tuple, float] = {}

    def _validation(self, app: str) -> Dict[int, float]:
        if app not in self._steps:
            found = {}
            app_dir = self.dir / app
            if app_dir.is_dir():
                for f in app_dir.glob("validation-*.csv"):
                    try:
                        bsz = int(f.stem.split("-", 1)[1])
                    except ValueError:
                        continue
                    rows = _read_floats(f, ("iteration",))
                    if rows:
                        found[bsz] = max(r[0] for r in rows)
            self._steps[app] = found
        return self._steps[app]

    def _placement_table(self, app: str) -> Dict[str, List[tuple]]:
        if app not in self._placements:
            table: Dict[str, List[tuple]] = {}
            f = self.dir / app / "placements.csv"
            if f.exists():
                for line, row in _csv_rows(f, ("placement", "local_bsz", "step_time", "sync_time")):
                    table.setdefault(_text(row, "placement"), []).append(
                        (_number(f, line, row, "local_bsz"), _number(f, line, row, "step_time"),
                         _number(f, line, row, "sync_time")))
            self._placements[app] = table
        return self._placements[app]

    def _scalability(self, app: str) -> Dict[tuple, List[tuple]]:
        """``<app>/scalability.csv``: (nodes, replicas) -> [(local_bsz, step_time, sync_time)], the
        measured runs wider than ``placements.csv`` covers."""
        if app not in self._scaling:
            table: Dict[tuple, List[tuple]] = {}
            f = self.dir / app / "scalability.csv"
            if f.exists():
                for line, row in _csv_rows(f, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")):
                    key = (_number(f, line, row, "num_nodes", int, minimum=1),
                           _number(f, line, row, "num_replicas", int, minimum=1))
                    table.setdefault(key, []).append(
                        (_number(f, line, row, "local_bsz"), _number(f, line, row, "step_time"),
                         _number(f, line, row, "sync_time")))
            self._scaling[app] = table
        return self._scaling[app]

    def step_rows(self, app: str, counts: Sequence[int]) -> List[tuple]:
        """Measured (local_bsz, step_time, sync_time) rows of the placement with ``counts`` replicas per
        node: ``placements.csv`` by its key (per-node counts in ascending order, ``(4, 2)`` → ``24``);
        wider placements from ``scalability.csv``, the measured (nodes, replicas) nearest in ratio."""
        counts = sorted(c for c in counts if c > 0)
        key = "".join(str(c) for c in counts)
        table = self._placement_table(app)
        if key in table:
            return sorted(table[key])
        wide = self._scalability(app)
        nodes, replicas = len(counts), sum(counts)
        if wide:
            near = min(wide, key=lambda k: (abs(math.log(k[0] / nodes)) + abs(math.log(k[1] / replicas)), k))
            return sorted(wide[near])
        packed = self.placement_key(replicas)
        return sorted(table.get(packed) or table[max(table, key=lambda k: (len(k), sum(int(c) for c in k)))])

    def local_bsz_range(self, app: str) -> tuple:
        """Smallest and largest per-GPU batch size measured for ``app`` (Pollux's atomic batch range)."""
        sizes = [r[0] for rows in self._placement_table(app).values() for r in rows]
        return (min(sizes), max(sizes)) if sizes else (1.0, 1.0)

    def time_to_target(self, app: str, counts: Sequence[int]) -> float:
        """Seconds to the target metric on a placement (replicas per node), Pollux-style: the job runs
        each measured batch size ``b`` it can (per-GPU batch ``ceil(b / replicas)`` at least the smallest
        measured one; above the largest, gradient accumulation: ``s`` extra micro-steps each costing
        ``step_time - sync_time``), steps to target = the last ``iteration`` of validation-``b``, step
        times interpolated in the local batch size; the best ``b`` wins (Pollux picks the batch size
        of highest goodput). ``inf`` when no batch size fits (too many replicas)."""
        memo_key = (app, tuple(sorted(c for c in counts if c > 0)))
        found = self._ttt.get(memo_key)
        if found is not None:
            return found
        replicas = sum(memo_key[1])
        steps_by_bsz = self._validation(app)
        rows = self.step_rows(app, memo_key[1]) if replicas and self._placement_table(app) else []
        best = math.inf
        if rows and steps_by_bsz:
            lo, hi = self.local_bsz_range(app)
            xs = [r[0] for r in rows]
            for bsz, steps in steps_by_bsz.items():
                local = math.ceil(bsz / replicas - 1e-8)
                if local < lo:
                    continue
                accum = math.ceil(local / hi - 1e-8) - 1
                atomic = math.ceil(local / (accum + 1) - 1e-8)
                step = _interp(xs, [r[1] for r in rows], atomic)
                sync = _interp(xs, [r[2] for r in rows], atomic)
                best = min(best, steps * (step + accum * (step - sync)))
        self._ttt[memo_key] = best
        return best

    def placement_key(self, replicas: int) -> str:
        full, rest = divmod(replicas, self.gpus_per_node)
        digits = ([str(rest)] if rest else []) + [str(self.gpus_per_node)] * full
        return "".join(digits)

    def duration(self, app: str, replicas: int, batch_size: float) -> Optional[float]:
        """See :func:`pollux_duration`."""
        steps_by_bsz = self._validation(app)
        table = self._placement_table(app)
        if not steps_by_bsz or not table:
            return None
        ref_bsz = min(steps_by_bsz, key=lambda b: (abs(math.log(b / batch_size)), b))
        steps = steps_by_bsz[ref_bsz] * ref_bsz / batch_size
        key = self.placement_key(replicas)
        if key not in table:
            # beyond the measured placements (more than 4 nodes): the widest measured one
            key = max(table, key=lambda k: (len(k), sum(int(c) for c in k)))
        local = batch_size / replicas
        _, step_time, sync_time = min(table[key], key=lambda r: abs(r[0] - local))
        return steps * (step_time + sync_time)


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through sorted ``xs`` (flat beyond both ends)."""
    if x <= xs[0]:
        return ys[0]
    for k in range(1, len(xs)):
        if x <= xs[k]:
            x0, x1 = xs[k - 1], xs[k]
            return ys[k] if x1 == x0 else ys[k - 1] + (ys[k] - ys[k - 1]) * (x - x0) / (x1 - x0)
    return ys[-1]


def pollux_duration(apps: PolluxApplications, app: str, replicas: int, batch_size: float):
    """Duration rule for Pollux/Sia/DeepBoot training rows (they carry no duration).

    steps to target = the last ``iteration`` of ``<app>/validation-<b>.csv`` for the measured batch
    size ``b`` closest (in log scale) to the job's batch size, scaled by ``b / batch_size`` (the
    same number of samples); time per step = ``step_time + sync_time`` of ``<app>/placements.csv``
    for the job's replicas packed on 4-GPU nodes (``6`` replicas → placement ``24``) at the local
    batch size closest to ``batch_size / replicas``; duration = steps × time per step.
    """
    return apps.duration(app, replicas, batch_size)


def read_pollux(path, traces_dir=None, **_) -> List[TraceJob]:
    path = Path(path)
    apps = None
    jobs = []
    for line, row in _csv_rows(path, ("name", "time", "application", "num_replicas", "batch_size")):
        replicas = _number(path, line, row, "num_replicas", int, minimum=1)
        submit = _number(path, line, row, "time", minimum=0.0)
        app = _text(row, "application")
        num_task = _optional(path, line, row, "num_task", float, -1.0)
        if num_task >= 0 or app.startswith("infer"):
            duration = _number(path, line, row, "duration", minimum=0.0)
            model = app.split("-")[1] if app.count("-") >= 1 else app
            jobs.append(TraceJob(_text(row, "name"), submit, duration, replicas, job_class=f"infer-{model}",
                                 partition="infer", kind="infer", source=f"{path}:{line}",
                                 extra={"application": app}))
            continue
        if apps is None:
            apps = PolluxApplications(_pollux_traces_dir(path, traces_dir))
        batch = _number(path, line, row, "batch_size", minimum=1.0)
        duration = pollux_duration(apps, app, replicas, batch)
        if duration is None:
            raise _bad(path, line, f"unknown application {app!r} (no traces under {apps.dir / app})")
        jobs.append(TraceJob(_text(row, "name"), submit, duration, replicas, job_class=None,
                             partition="train" if "num_task" in row else "", source=f"{path}:{line}",
                             extra={"application": app}, scaling=apps))
    return jobs


def read_tiresias(path, time_unit: str = "s", **_) -> List[TraceJob]:
    """Tiresias CSV; ``time_unit`` (``s`` or ``ms``) is the unit of its submit times and durations."""
    divisor = _time_divisor(time_unit)
    jobs = []
    for line, row in _csv_rows(path, ("num_gpu", "submit_time", "duration")):
        model = _text(row, "model_name")
        jobs.append(TraceJob(_text(row, "job_id") or f"job{len(jobs)}",
                             _number(path, line, row, "submit_time", minimum=0.0) / divisor,
                             _number(path, line, row, "duration", minimum=0.0) / divisor,
                             _number(path, line, row, "num_gpu", int, minimum=1),
                             job_class=None, source=f"{path}:{line}", extra={"model": model} if model else {}))
    return jobs


def _time_divisor(time_unit: str) -> float:
    if time_unit not in TIME_UNITS:
        raise InputError(f"time unit {time_unit!r}: expected one of {', '.join(TIME_UNITS)}")
    return TIME_UNITS[time_unit]


def time_unit_warning(jobs: Sequence[TraceJob]) -> Optional[str]:
    """A warning when the durations read (in seconds) look like milliseconds, else None."""
    durations = sorted(j.duration for j in jobs if j.kind == "train")
    if not durations:
        return None
    median = durations[len(durations) // 2]
    if median < MS_SUSPECT_MEDIAN:
        return None
    return (f"warning: the median job duration is {median:,.0f} s ({median / 86400:.1f} days): "
            f"the trace's times look like milliseconds (use --time-unit ms if they are)")


def read_alibaba(path, **_) -> List[TraceJob]:
    """Alibaba's GPU v2023 pod list (FGD's traces): every pod, CPU-only ones included, with its
    ``cpu_milli``, ``memory_mib``, ``gpu_milli`` (of one GPU when ``num_gpu`` is 1, else 1000 per
    GPU) and ``gpu_spec`` (GPU models it accepts, ``|``-separated)."""
    raw = []
    for line, row in _csv_rows(path, ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time")):
        num_gpu = _number(path, line, row, "num_gpu", int, minimum=0)
        milli = _number(path, line, row, "gpu_milli", minimum=0.0)
        if num_gpu == 1 and milli > 1000:
            raise _bad(path, line, f"gpu_milli={milli:g} is more than one GPU (1000)")
        created = _number(path, line, row, "creation_time")
        started = _optional(path, line, row, "scheduled_time", float, created)
        deleted = _number(path, line, row, "deletion_time")
        if deleted < started:
            raise _bad(path, line, f"deletion_time {deleted} before start {started} (negative duration)")
        if num_gpu == 0:
            units = 0
        elif num_gpu == 1 and 0 < milli < 1000:
            units = int(round(milli))
        else:
            units = 1000
        spec = _text(row, "gpu_spec")
        types = tuple(t.strip().lower() for t in spec.split("|") if t.strip() and t.strip().lower() != "nan")
        raw.append(TraceJob(_text(row, "name"), created, deleted - started, num_gpu,
                            gpu_fraction=units / 1000.0 if num_gpu == 1 else 1.0, gpu_milli=units,
                            cpu_milli=_optional(path, line, row, "cpu_milli", float, 0.0, minimum=0.0),
                            memory_mib=_optional(path, line, row, "memory_mib", float, 0.0, minimum=0.0),
                            gpu_types=types, source=f"{path}:{line}"))
    if raw:
        first = min(j.submit_time for j in raw)
        for j in raw:
            j.submit_time -= first
    return raw


READERS = {"generic": read_generic, "philly": read_philly, "gavel": read_gavel, "pollux": read_pollux,
           "tiresias": read_tiresias, "alibaba": read_alibaba}


def guess_format(path) -> str:
    path = Path(path)
    if path.suffix == ".trace":
        return "gavel"
    header = next(text_lines(path), "").strip().lower()
    cols = set(c.strip() for c in header.split(","))
    if "\t" in header:
        return "gavel"
    if {"timestamp", "duration", "num_gpus"} <= cols:
        return "philly"
    if {"application", "num_replicas", "batch_size"} <= cols:
        return "pollux"
    if {"gpu_milli", "num_gpu"} <= cols:
        return "alibaba"
    if {"num_gpu", "submit_time"} <= cols:
        return "tiresias"
    return "generic"


def read_trace(path, fmt: str = "auto", **options) -> List[TraceJob]:
    """Read ``path`` in format ``fmt`` (see the module docstring); errors name file:line."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such trace file")
    if fmt == "auto":
        fmt = guess_format(path)
    if fmt not in READERS:
        raise InputError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    unit = options.pop("time_unit", "s")
    _time_divisor(unit)
    if unit != "s":
        if fmt != "tiresias":
            raise InputError(f"{path}: --time-unit {unit} applies to Tiresias-format traces only "
                             f"(this one reads as {fmt})")
        options["time_unit"] = unit
    jobs = READERS[fmt](path, **options)
    for job in jobs:
        if job.duration < 0:
            raise InputError(f"{job.source}: negative duration {job.duration}")
    return jobs
