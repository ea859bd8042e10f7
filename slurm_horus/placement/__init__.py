"""The placement core: ClusterState, JobRequest, the filter → score → select pipeline, policies.

Pure: imports numpy and the interference contract only (no Slurm, SQLite, sockets or simulator),
so ``horusd``, ``horus-sbatch`` and ``horus simulate`` run the very same decisions.
"""

from .cycle import CycleOptions, CycleResult, PendingQueue, run_cycle
from .framework import Cycle, Policy, SchedulingContext
from .pairs import PairTable
from .policies import POLICY_NAMES, PolicyModels, make_policy
from .request import Candidate, Decision, JobRequest
from .state import ClassIndex, ClusterState, NodeGroup, RunningJob, build_cluster, parse_cluster_spec

__all__ = ["ClassIndex", "ClusterState", "NodeGroup", "RunningJob", "build_cluster", "parse_cluster_spec",
           "JobRequest", "Decision", "Candidate", "Policy", "SchedulingContext", "Cycle", "PairTable",
           "POLICY_NAMES", "PolicyModels", "make_policy", "PendingQueue", "CycleOptions", "CycleResult", "run_cycle"]
