"""The ``--json`` output of Slurm's commands, any supported version: the one loader.

Slurm 22.05 (openapi v0.0.38) prints plain numbers and state strings. From 23.02 on (``data_parser``
v0.0.39 and later; 24.11 prints v0.0.42, 26.05 v0.0.45) many numbers are wrapped as
``{"set": true, "infinite": false, "number": 5}`` and states and flags are lists (``["RUNNING"]``,
``["IDLE", "DRAIN"]``). :func:`loads` unwraps every wrapped number while it decodes the document, so
no reader ever sees one: ``set`` gives the number, ``infinite`` gives :data:`INFINITE`, neither
gives ``None``. States stay as Slurm prints them; :func:`words` reads either form.

Every document carries the version of the command that printed it (``meta.Slurm`` in 22.05,
``meta.slurm`` later): :func:`document_version`.
"""

import json

from ..errors import InputError
from .version import SlurmVersion

INFINITE = float("inf")
_WRAPPED_KEYS = frozenset(("set", "infinite", "number"))


def unwrap(value):
    """``{"set": .., "infinite": .., "number": N}`` -> N, INFINITE or None; anything else unchanged."""
    if isinstance(value, dict) and "set" in value and "number" in value and value.keys() <= _WRAPPED_KEYS:
        if value.get("infinite"):
            return INFINITE
        return value["number"] if value.get("set") else None
    return value


def _unwrap_tree(value):
    if isinstance(value, dict):
        return unwrap({k: _unwrap_tree(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_unwrap_tree(v) for v in value]
    return value


def _nothing_found(error):
    """22.05's sacct --json reports an empty answer as an error (9003, "Nothing found"): it is none."""
    return isinstance(error, dict) and (error.get("error_number") == 9003 or error.get("description") == "Nothing found")


def loads(text, command, key=None):
    """Decode ``command``'s ``--json`` output with every wrapped number unwrapped.

    Raises :class:`InputError` (one line) when it is not JSON, when Slurm reported errors in it, or
    when ``key`` is given and the document has no list under it.
    """
    try:
        if isinstance(text, (str, bytes, bytearray)):
            data = json.loads(text, object_hook=unwrap)
        else:  # an already decoded document (a test's, or a saved file's)
            data = _unwrap_tree(text)
    except ValueError as exc:
        raise InputError(f"{command} --json: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{command} --json: not a JSON object")
    errors = [e for e in data.get("errors") or [] if e and not _nothing_found(e)]
    if errors:
        raise InputError(f"{command} --json reported errors: {errors}")
    if key is not None and not isinstance(data.get(key), list):
        raise InputError(f"{command} --json: no {key!r} list in the output")
    return data


def words(value):
    """A state or flag set as a tuple of words: ``"RUNNING"`` (22.05) or ``["IDLE", "DRAIN"]``."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return (str(value),)


# 22.05 printed a job's state flags in place of its state (job_state_string); later versions list
# them after it. These keep the 22.05 reading, so "COMPLETING" means the same on every version.
_JOB_STATE_FLAGS = ("COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED", "STAGE_OUT", "STOPPED")


def job_state(value, default=""):
    """``"RUNNING"`` or ``["RUNNING", "COMPLETING"]`` -> the state word 22.05 would print."""
    state = words(value)
    for flag in _JOB_STATE_FLAGS:
        if flag in state[1:]:
            return flag
    return state[0] if state else default


def whole(value):
    """An unwrapped number as an int; None when unset, infinite or not a number."""
    if value is None or value == INFINITE or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def text_list(value):
    """A comma-separated string (22.05: ``features``) or a list (later) -> tuple of non-empty words."""
    if isinstance(value, str):
        return tuple(v for v in value.split(",") if v)
    return tuple(str(v) for v in value or () if v)


def document_version(doc):
    """The Slurm version of the command that printed ``doc`` (None when it names none)."""
    meta = doc.get("meta") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return None
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    version = slurm.get("version") if isinstance(slurm, dict) else None
    if isinstance(version, dict):
        try:
            return SlurmVersion(int(version["major"]), int(version["minor"]), int(version.get("micro") or 0))
        except (KeyError, TypeError, ValueError):
            return None
    return SlurmVersion.parse(slurm.get("release")) if isinstance(slurm, dict) else None
