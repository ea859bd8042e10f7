"""horusd's ledger: its own placements that squeue does not show yet.

Between two refreshes horusd places jobs (at submission, from an offer, or from its queue) faster
than squeue can show them. Each placement is recorded here and put back into every new cluster
state until squeue shows the job with its placed ``horus:<id> ... gpus=`` token (from then on the
queue itself holds the job on its GPUs, see snapshot.py), or until it expires (Slurm refused the
job, or it was cancelled before it showed).
"""

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional

from ..placement.state import ClusterState, RunningJob


@dataclass
class LedgerEntry:
    decision_id: str
    job: RunningJob
    expires: float
    uid: Optional[int] = None  # who asked (a horus-sbatch decision is confirmed for this uid only)
    from_user: bool = False  # asked on the user socket (horus-sbatch), not by job_submit.lua
    token: dict = field(default_factory=dict)  # mode, slowdown, job_class, gpulist: what confirm answers
    job_id: str = ""  # the Slurm job, for a job horusd placed from its queue


class Ledger:
    def __init__(self, ttl_s=60.0):
        self.ttl_s = ttl_s
        self.entries: Dict[str, LedgerEntry] = {}

    def __contains__(self, decision_id):
        return decision_id in self.entries

    def __len__(self):
        return len(self.entries)

    def get(self, decision_id) -> Optional[LedgerEntry]:
        return self.entries.get(decision_id)

    def add(self, entry: LedgerEntry):
        self.entries[entry.decision_id] = entry

    def remove(self, decision_id) -> Optional[LedgerEntry]:
        return self.entries.pop(decision_id, None)

    def settle(self, shown: Iterable[str], now: float):
        """Forget the entries squeue shows placed, and those expired."""
        shown = set(shown)
        for decision_id in [d for d, e in self.entries.items() if d in shown or e.expires < now]:
            del self.entries[decision_id]

    def reapply(self, state: ClusterState):
        """Put every entry into a fresh state (whose GPUs it knows)."""
        for entry in self.entries.values():
            if all(g < state.n_gpus for g in entry.job.gpus) and entry.job.job_id not in state.jobs:
                state.place(RunningJob(**{**entry.job.__dict__, "class_id": -1}))

    def held_for_user(self, uid, now):
        """GPUs held by ``uid``'s unconfirmed decisions from the user socket."""
        return sum(len(e.job.gpus) for e in self.entries.values() if e.from_user and e.uid == uid and e.expires >= now)

    def queue_ids(self):
        """Slurm job ids this ledger placed from the queue (squeue may still show them kept)."""
        return {e.job_id for e in self.entries.values() if e.job_id}
