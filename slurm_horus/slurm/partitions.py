"""Which jobs Slurm may start by preempting others: ``scontrol show config`` and ``scontrol show partition -o``.

horusd keeps a GPU job it cannot place for its own queue; a kept job has a begin time ahead, so Slurm
would not preempt anything for it. A job Slurm could start *by preempting* must therefore be left to
Slurm: with ``PreemptType=preempt/partition_prio`` the jobs of a partition with a higher
``PriorityTier`` than another partition on one of its nodes (DeepBoot-style lending:
hpc_configs/slurm.conf.deepboot), with ``preempt/qos`` any job (the QOS decides). 22.05 has no
``--json`` for either command, so both are read from their text forms here.
"""

from dataclasses import dataclass, field
from typing import FrozenSet, Tuple

from ..errors import InputError
from ..hostlist import expand_hostlist
from .runner import run_slurm

ANY = "*"  # every partition may preempt (preempt/qos)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: Tuple[str, ...]
    tier: int
    default: bool


@dataclass(frozen=True)
class Preemption:
    preemptors: FrozenSet[str] = field(default_factory=frozenset)  # partition names, or {ANY}
    default_partition: str = ""

    def may_preempt(self, partition):
        """Whether a job of ``partition`` ("" or "a,b": the default partition, or any of several)
        could be started by Slurm preempting other jobs."""
        if ANY in self.preemptors:
            return True
        names = [p for p in (partition or "").split(",") if p] or [self.default_partition]
        return any(name in self.preemptors for name in names)


def parse_preempt_type(config_text):
    for line in (config_text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PreemptType":
            return value.strip()
    return "preempt/none"


def parse_partitions(text):
    """``scontrol show partition -o`` (one partition per line, ``Key=Value`` words) -> [Partition]."""
    partitions = []
    for line in (text or "").splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "PartitionName" not in fields:
            continue
        nodes = fields.get("Nodes", "")
        try:
            names = tuple(expand_hostlist(nodes)) if nodes not in ("", "(null)") else ()
            tier = int(fields.get("PriorityTier", "1"))
        except (InputError, ValueError):
            raise InputError(f"scontrol show partition: cannot read partition {fields['PartitionName']}") from None
        partitions.append(Partition(fields["PartitionName"], names, tier, fields.get("Default") == "YES"))
    return partitions


def preemption(preempt_type, partitions):
    """The partitions whose jobs may preempt others under ``preempt_type``."""
    default = next((p.name for p in partitions if p.default), "")
    kind = preempt_type.split("/", 1)[-1].strip().lower()
    if kind == "qos":
        return Preemption(frozenset({ANY}), default)
    if kind != "partition_prio":
        return Preemption(frozenset(), default)
    preemptors = {p.name for p in partitions for q in partitions
                  if q.tier < p.tier and set(p.nodes) & set(q.nodes)}
    return Preemption(frozenset(preemptors), default)


def read_preemption(slurm_conf=None, timeout=10.0):
    config = run_slurm(["scontrol", "show", "config"], slurm_conf=slurm_conf, timeout=timeout).stdout
    parts = run_slurm(["scontrol", "show", "partition", "-o"], slurm_conf=slurm_conf, timeout=timeout).stdout
    return preemption(parse_preempt_type(config), parse_partitions(parts))
