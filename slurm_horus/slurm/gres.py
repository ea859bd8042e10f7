"""GRES strings as Slurm prints them (22.05, 24.11, 26.05), parsed into :class:`GresItem` records,
and the one writer of a GRES request in the spelling a version wants (:func:`format_tres`).

Shapes handled (all seen on real 22.05.8, 24.11.5 and 26.05.5 clusters):

* node/job GRES lists: ``gpu:g0:1,gpu:g1:1,shard:8``, ``gpu:g0:1(S:0)``
* with indices: ``gpu:g1:1(IDX:1)``, ``shard:g2:1(IDX:2)``, ``gpu:g0:0(IDX:N/A)``, ``gpu:2(IDX:0-1,3)``
* with per-GPU use by position (24.11+ for shards): a job's ``shard:1(0/2,1/2)`` (one of the
  second GPU's two shards: GPU 1), a node's ``shard:g1:1(1/2)`` (the type names the GPU)
* request strings with the ``gres:`` (22.05) or ``gres/`` (later) prefix: ``gres:gpu:g1:1,gres:gpu:g3:1``,
  ``gres/gpu:2``
* TRES strings: ``cpu=1,gres/gpu:g3=1,gres/gpu=1,mem=250M`` (see :func:`parse_tres_gres`)
"""

import re
from dataclasses import dataclass, field
from typing import Optional, Tuple

from ..errors import InputError
from ..hostlist import split_outside

_ITEM = re.compile(r"^(?P<body>[^()]+?)(?:\((?P<attrs>[^()]*)\))?$")
_POSITIONS = re.compile(r"^\d+/\d+(?:,\d+/\d+)*$")
_INDEX_TYPE = re.compile(r"^g(\d+)$")


@dataclass(frozen=True)
class GresItem:
    """One GRES entry: ``name`` (gpu, shard, mps), optional ``type`` (g2), ``count``, ``indices``."""

    name: str
    type: Optional[str]
    count: int
    indices: Tuple[int, ...] = field(default=())

    def __str__(self):
        text = self.name if self.type is None else f"{self.name}:{self.type}"
        text += f":{self.count}"
        if self.indices:
            text += f"(IDX:{format_index_list(self.indices)})"
        return text


def parse_index_list(text):
    """``0-1,3`` -> (0, 1, 3); ``N/A`` or empty -> ()."""
    text = text.strip()
    if text in ("", "N/A"):
        return ()
    indices = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = part.split("-", 1)
            if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
                raise InputError(f"bad GRES index range {part!r} in {text!r}")
            indices.extend(range(int(low), int(high) + 1))
        elif part.isdigit():
            indices.append(int(part))
        else:
            raise InputError(f"bad GRES index {part!r} in {text!r}")
    return tuple(indices)


def format_index_list(indices):
    """(0, 1, 3) -> ``0-1,3`` (the inverse of :func:`parse_index_list`)."""
    parts = []
    ordered = sorted(set(indices))
    start = prev = None
    for index in ordered:
        if start is None:
            start = prev = index
        elif index == prev + 1:
            prev = index
        else:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = index
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def split_gres_list(text):
    """Split a comma-separated GRES list, keeping commas inside ``(...)`` (``IDX:0-1,3``)."""
    return split_outside(text, "(", ")")


def parse_gres_item(text):
    """Parse one entry such as ``gpu:g1:1(IDX:1)`` or ``gres:gpu:2``."""
    match = _ITEM.match(text.strip())
    if not match:
        raise InputError(f"bad GRES entry {text!r}")
    body = match.group("body")
    if body.startswith(("gres:", "gres/")):  # a request: gres:gpu:1 (22.05), gres/gpu:1 (later)
        body = body[len("gres:"):]
    fields = body.split(":")
    if not fields or not fields[0]:
        raise InputError(f"bad GRES entry {text!r}")
    name, rest = fields[0], fields[1:]
    gres_type, count = None, 1
    if len(rest) == 1:
        if rest[0].isdigit():
            count = int(rest[0])
        else:
            gres_type = rest[0]
    elif len(rest) == 2:
        gres_type = rest[0]
        if not rest[1].isdigit():
            raise InputError(f"bad GRES count {rest[1]!r} in {text!r}")
        count = int(rest[1])
    elif len(rest) > 2:
        raise InputError(f"bad GRES entry {text!r}")
    indices = ()
    # Attributes look like "IDX:0-1,3" or "S:0"; IDX comes last and its ranges hold commas.
    attrs = match.group("attrs") or ""
    if "IDX:" in attrs:
        indices = parse_index_list(attrs.split("IDX:", 1)[1])
    elif _POSITIONS.match(attrs) and gres_type is None:
        indices = positions_in_use(attrs)
    return GresItem(name, gres_type, count, indices)


def positions_in_use(text):
    """``0/2,1/2`` (per GPU: used/total, in the node's order) -> (1,): the positions in use.

    Slurm 24.11+ prints a job's shards so. The position is the node's n-th shard record, which is
    the GPU index where each GPU has one shard line in gres.conf (the shard binding's set-up)."""
    used = []
    for position, pair in enumerate(text.split(",")):
        count, _, _total = pair.partition("/")
        if int(count) > 0:
            used.append(position)
    return tuple(used)


def parse_gres(text):
    """Parse a whole GRES list (``gpu:g0:1,gpu:g1:1(IDX:1),shard:8``); ``None``/``(null)`` -> []."""
    if text is None:
        return []
    text = text.strip()
    if text in ("", "(null)", "N/A"):
        return []
    return [parse_gres_item(item) for item in split_gres_list(text)]


def parse_tres_gres(text):
    """The GRES entries of a TRES string: ``gres/gpu:g3=1,gres/gpu=1,mem=250M`` -> GresItems."""
    items = []
    for part in (text or "").split(","):
        key, _, value = part.strip().partition("=")
        if not key.startswith("gres/"):
            continue
        name, _, gres_type = key[len("gres/"):].partition(":")
        if not value.isdigit():
            raise InputError(f"bad TRES count in {part!r}")
        items.append(GresItem(name, gres_type or None, int(value)))
    return items


def typed_gpu_indices(items, name="gpu"):
    """GPU indices named by per-GPU types (``gpu:g2`` -> 2) among ``items`` of ``name``.

    The local cluster (and a horus site using indexed binding) gives each GPU its own type ``gK``,
    so the type alone says which GPU a job holds, even where Slurm prints no IDX (sacct).
    """
    indices = set()
    for item in items:
        index = type_index(item)
        if item.name == name and item.count > 0 and index is not None:
            indices.add(index)
    return tuple(sorted(indices))


def type_index(item):
    """The GPU index a per-GPU type names (``g2`` -> 2), else None."""
    match = _INDEX_TYPE.match(item.type or "")
    return int(match.group(1)) if match else None


def held_indices(item):
    """GPU indices an entry holds: its IDX or positions, else the index its per-GPU type names."""
    if item.count <= 0:
        return ()
    if item.indices:
        return item.indices
    index = type_index(item)
    return () if index is None else (index,)


def spelling_of(tres, default="gres:"):
    """The GRES prefix a ``tres_per_node`` request is spelled with (``gres:`` or ``gres/``), else ``default``."""
    match = re.match(r"gres[:/]", tres or "")
    return match.group(0) if match else default


def format_tres(items, prefix):
    """GresItems as a ``tres_per_node`` request in a version's spelling (``prefix``: ``gres:`` up to
    22.05, ``gres/`` later; see SlurmVersion.gres_prefix): ``gres/shard:g2:1,gres/gpu:2``."""
    return ",".join(prefix + (item.name if item.type is None else f"{item.name}:{item.type}") + f":{item.count}"
                    for item in items)
