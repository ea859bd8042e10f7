"""``horus local-cluster``: a private, throw-away Slurm cluster with fake GPUs on one machine."""

from .cluster import ClusterError, ClusterLayout, LocalCluster, poll
from .prereq import PrerequisiteError, check_prerequisites, prerequisite_problems

__all__ = [
    "ClusterError", "ClusterLayout", "LocalCluster", "PrerequisiteError", "check_prerequisites",
    "poll", "prerequisite_problems",
]
