"""Read and write the interchange formats ``profiles.csv`` and ``observations.csv``.

Both are plain CSV with a header row (see docs/interference.md). Loading validates every row and
raises :class:`InputError` naming ``file:line`` and the column: a missing column, an empty required
field, a value that is not a finite number, a negative value, a utilization above 100, a badly
formed job class or GPU type, a duplicate profile.
"""

import csv
import math
import re

from ..errors import InputError
from ..textfiles import csv_records, header_of
from .base import Observation, SoloProfile
from .classes import CLASS_NAME_RE

GPU_TYPE_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
PROFILE_COLUMNS = ("job_class", "gpu_type", "gpu_util", "mem_util", "gmem_mb", "solo_tput")
OBSERVATION_COLUMNS = ("gpu_type", "job_class", "corunner_class", "norm_tput")
_PERCENT_COLUMNS = ("gpu_util", "mem_util")


def _rows(path, required):
    """Yield (line number, row dict) after checking the header; a missing file, or one that is not
    UTF-8 text, is an InputError."""
    reader, records = csv_records(path)
    header = [name.strip() for name in (header_of(reader, path) or [])]
    missing = [name for name in required if name not in header]
    if missing:
        raise InputError(f"{path}:1: missing column(s): {', '.join(missing)}")
    reader.fieldnames = header
    for line, row in records:
        if None in row:  # more fields than the header names
            raise InputError(f"{path}:{line}: more fields than columns in the header")
        yield line, {k: (v or "").strip() for k, v in row.items()}


def _number(path, line, column, text, required):
    if text == "":
        if required:
            raise InputError(f"{path}:{line}: {column} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{path}:{line}: {column} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise InputError(f"{path}:{line}: {column} is not a finite number: {text!r}")
    if value < 0:
        raise InputError(f"{path}:{line}: {column} is negative: {text!r}")
    if column in _PERCENT_COLUMNS and value > 100:
        raise InputError(f"{path}:{line}: {column} is a percentage, got {text!r}")
    return value


def _name(path, line, column, text, pattern, what):
    if not text:
        raise InputError(f"{path}:{line}: {column} is empty")
    if not pattern.match(text):
        raise InputError(f"{path}:{line}: {column} {text!r} is not a valid {what}")
    return text


def _class(path, line, column, text):
    return _name(path, line, column, text, CLASS_NAME_RE, "job class (lower-case letters, digits, . _ + -)")


def _gpu(path, line, text):
    return _name(path, line, "gpu_type", text, GPU_TYPE_RE, "GPU type (lower-case, e.g. v100, rtx3090)")


def load_profiles_csv(path):
    """Read ``profiles.csv`` -> list of SoloProfile; extra numeric columns go to ``extra``."""
    profiles, seen = [], {}
    for line, row in _rows(path, PROFILE_COLUMNS):
        job_class = _class(path, line, "job_class", row["job_class"])
        gpu_type = _gpu(path, line, row["gpu_type"])
        key = (job_class, gpu_type)
        if key in seen:
            raise InputError(f"{path}:{line}: duplicate profile for {job_class} on {gpu_type} (first at line {seen[key]})")
        seen[key] = line
        values = {c: _number(path, line, c, row[c], False) for c in PROFILE_COLUMNS[2:]}
        extra = {}
        for column, text in row.items():
            if column not in PROFILE_COLUMNS and column:
                value = _number(path, line, column, text, False)
                if value is not None:
                    extra[column] = value
        profiles.append(SoloProfile(job_class, gpu_type, extra=extra, **values))
    return profiles


def load_observations_csv(path):
    """Read ``observations.csv`` -> list of Observation (one row per direction)."""
    observations = []
    for line, row in _rows(path, OBSERVATION_COLUMNS):
        observations.append(Observation(
            _gpu(path, line, row["gpu_type"]),
            _class(path, line, "job_class", row["job_class"]),
            _class(path, line, "corunner_class", row["corunner_class"]),
            _number(path, line, "norm_tput", row["norm_tput"], True),
        ))
    return observations


def _text(value):
    return "" if value is None else format(float(value), ".10g")


def write_profiles_csv(path, profiles):
    extras = sorted({name for p in profiles for name in p.extra})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(list(PROFILE_COLUMNS) + extras)
        for p in profiles:
            writer.writerow([p.job_class, p.gpu_type, _text(p.gpu_util), _text(p.mem_util), _text(p.gmem_mb),
                             _text(p.solo_tput)] + [_text(p.extra.get(name)) for name in extras])


def write_observations_csv(path, observations):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(OBSERVATION_COLUMNS)
        for o in observations:
            writer.writerow([o.gpu_type, o.job_class, o.corunner_class, _text(o.norm_tput)])
