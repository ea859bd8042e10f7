"""The only room that runs Slurm commands or parses their output.

``runner`` runs a Slurm CLI with the cluster's ``SLURM_CONF``; ``gres`` parses GRES strings;
``parse`` turns ``sinfo/squeue/sacct --json`` (Slurm 22.05, openapi v0.0.38) into small records;
``queries`` glues the two together.
"""

from .gres import GresItem, parse_gres, parse_tres_gres
from .queries import sacct, sinfo, squeue, submit_batch
from .parse import AcctJob, NodeInfo, QueueJob, parse_sacct, parse_sinfo, parse_squeue
from .runner import SlurmCommandError, run_slurm

__all__ = [
    "AcctJob", "GresItem", "NodeInfo", "QueueJob", "SlurmCommandError", "parse_gres",
    "parse_sacct", "parse_sinfo", "parse_squeue", "parse_tres_gres", "run_slurm", "sacct", "sinfo",
    "squeue", "submit_batch",
]
