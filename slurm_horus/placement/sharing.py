"""Which pairs of job classes share a GPU now, read from the cluster state.

``horus``'s ``probe_once`` rule reads it: a pair only predicted (not yet measured on this cluster) is
formed where it shares no GPU already, so that one probe at a time pays to learn it, instead of a
cycle pairing twenty jobs on a prediction that the first measurement would have corrected. The
answer is derived from the state (the jobs on each GPU), not from the decisions a policy took: live,
horusd's state holds the jobs Slurm started without asking, and a restart or a reload loses nothing.
"""

from typing import Callable, Dict, List, Tuple

import numpy as np

PairKey = Tuple[int, int, int]  # (GPU type id, class id, class id), the smaller class id first


class SharingPairs:
    """Per pair of classes on a GPU type: how many GPUs run jobs of both now. Kept from the state's
    change log (a change re-reads the residents of the GPUs it touched); a new state, or a log that
    moved past what was read, is read afresh."""

    def __init__(self):
        self._state = None
        self._seen = 0  # the position in the state's change log read up to
        self._on: Dict[int, Tuple[PairKey, ...]] = {}  # GPU -> the pairs sharing it
        self.count: Dict[PairKey, int] = {}

    def update(self, state, watch: Callable[[PairKey], bool]) -> List[PairKey]:
        """Read what changed on ``state`` since the last call. Returns the pairs for which
        ``watch(key)`` holds that started sharing their first GPU or left their last one."""
        base, changes = state.changes_base, state.changes
        if self._state is state and self._seen == base + len(changes):
            return []
        if self._state is not state or self._seen < base:
            old_count = self.count
            self._state, self._on, self.count = state, {}, {}
            touched = np.flatnonzero(state.gpu_njobs >= 2).tolist()
        else:
            old_count = None
            touched = {g for _sign, job in changes[self._seen - base:] for g in job.gpus}
        self._seen = base + len(changes)
        moved = []
        count, on = self.count, self._on
        for g in touched:
            new = _pairs_on(state, g)
            old = on.get(g, ())
            if new == old:
                continue
            for key in old:
                if key not in new:
                    left = count[key] - 1
                    if left:
                        count[key] = left
                    else:
                        del count[key]
                        if watch(key):
                            moved.append(key)
            for key in new:
                if key not in old:
                    had = count.get(key, 0)
                    count[key] = had + 1
                    if not had and old_count is None and watch(key):
                        moved.append(key)
            if new:
                on[g] = new
            else:
                on.pop(g, None)
        if old_count is not None:  # read afresh: compare what shares with what shared
            moved = [key for key in set(old_count).symmetric_difference(count) if watch(key)]
        return moved

    def pairs(self, type_id: int) -> np.ndarray:
        """The pairs of class ids sharing some GPU of the type ``type_id``: an array of shape (k, 2)."""
        found = [(a, b) for t, a, b in self.count if t == type_id]
        return np.array(found, dtype=np.intp).reshape(len(found), 2)


def _pairs_on(state, g: int) -> Tuple[PairKey, ...]:
    residents = state.gpu_jobs[g]
    if len(residents) < 2:
        return ()
    jobs = state.jobs
    ids = [jobs[j].class_id for j in residents if j in jobs]
    t = int(state.gpu_type_id[g])
    return tuple(sorted({(t, min(a, b), max(a, b)) for i, a in enumerate(ids) for b in ids[i + 1:]}))
