"""oracle: the flagship rule reading the true pair matrix (an upper bound, for reference only).

Source: this project (the standard "perfect knowledge" reference of the scheduling papers). Rule:
exactly :mod:`horus` (SJF order, benefit-aware pairing), but its pair table is the ground truth
of the simulator, it never learns, and it knows every job's true duration whatever the other
policies are told (``perfect_knowledge``); no live cluster can run it.
"""

from .horus import Horus


class Oracle(Horus):
    name = "oracle"
    perfect_knowledge = True

    def observe(self, gpu_type, target, corunner, norm_tput):
        return None
