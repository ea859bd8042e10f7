"""Which Slurm slurm-horus talks to, and what differs there.

slurm-horus is tested on Slurm 22.05 (Debian 12), 24.11 (Debian 13) and 26.05 (Debian sid), each with
the whole Slurm-backed test suite. What changes between them, as far as slurm-horus is concerned:

* the GRES spelling of ``tres_per_node`` (job_submit.lua's job_desc, squeue): ``gres:gpu:g1:1`` up to
  22.05, ``gres/gpu:g1:1`` later, and 24.11 refuses the old spelling when a job_submit plugin sets it;
* the JSON of the commands (see :mod:`.openapi`): wrapped numbers, state lists, ``sinfo --json``
  grouping nodes (one record per node comes from ``scontrol --json show nodes`` there);
* a shard's GPU in ``gres_detail``: ``shard:1(IDX:1)`` in 22.05, per-GPU use by position
  (``shard:1(0/2,1/2)``) later.

Where the version itself is needed it is read from the JSON a command printed (its ``meta``), or from
``scontrol version``. The release in which each change happened between 22.05 and 24.11 is not
pinned down here: versions in between are taken to behave like 24.11 and reported as untested.
"""

import re
from dataclasses import dataclass

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")

TESTED = ((22, 5), (24, 11), (26, 5))
OLDEST = (22, 5)  # shard GRES (co-location through typed shards) came with 22.05
NEW_SPELLING = (23, 2)  # first release taken to spell tres_per_node with "gres/"


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text):
        """``slurm-wlm 24.11.5``, ``slurm 22.05.8``, ``24.11`` -> SlurmVersion; None when there is none."""
        match = _VERSION.search(str(text or ""))
        if not match:
            return None
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    def __str__(self):
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def release(self):
        """``24.11``: the release (what the tests and ``--slurm`` name)."""
        return f"{self.major}.{self.minor:02d}"

    @property
    def gres_prefix(self):
        """How ``tres_per_node`` spells a GRES request on this version: ``gres:`` or ``gres/``."""
        return "gres/" if (self.major, self.minor) >= NEW_SPELLING else "gres:"

    @property
    def tested(self):
        return (self.major, self.minor) in TESTED

    @property
    def supported(self):
        return (self.major, self.minor) >= OLDEST


def support_lines(version):
    """What slurm-horus does on ``version``, for ``horus doctor``: [(level, message)]."""
    if version is None:
        return [("warning", "could not tell the Slurm version (scontrol version gave none)")]
    if not version.supported:
        return [("error", f"Slurm {version}: slurm-horus needs 22.05 or later (shard GRES, --json output)")]
    spelling = f"job_submit.lua and horusd spell GRES as {version.gres_prefix}gpu:gK:1"
    if (version.major, version.minor) < NEW_SPELLING:
        how = "nodes from sinfo --json; a shard's GPU from IDX"
    else:
        how = "nodes from scontrol --json show nodes; a shard's GPU from its position in gres_detail"
    level, state = ("info", "tested") if version.tested else ("warning", "untested, handled like the nearest "
                                                                         "tested release")
    tested = ", ".join(SlurmVersion(*t).release for t in TESTED)
    return [(level, f"Slurm {version}: {state} (slurm-horus is tested on {tested}); {spelling}; {how}")]
