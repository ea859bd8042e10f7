"""Slurm hostlist expressions: ``n[1-3,5]``, ``gpu[001-002],login1`` -> lists of names.

The one reader of hostlists: squeue's and sacct's node lists (slurm/parse.py) and the history's
(store/queries.py). Pure, so that every room may use it.
"""

import re

from .errors import InputError

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>.*)$")


def split_outside(text, opening, closing):
    """Split ``text`` on the commas that are not between ``opening`` and ``closing``."""
    items, depth, current = [], 0, []
    for char in text:
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def expand_hostlist(text):
    """``n[1-2],m3`` -> ['n1', 'n2', 'm3'] (zero padding kept: ``gpu[08-10]`` -> gpu08, gpu09, gpu10)."""
    names = []
    for part in split_outside(text or "", "[", "]"):
        match = _BRACKET.match(part)
        if not match:
            if "[" in part or "]" in part:
                raise InputError(f"bad hostlist {text!r}")
            names.append(part)
            continue
        for item in match.group("ranges").split(","):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise InputError(f"bad hostlist {text!r}")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                for rest in expand_hostlist(match.group("suffix")) if match.group("suffix") else [""]:
                    names.append(f"{match.group('prefix')}{number:0{width}d}{rest}")
    return names
