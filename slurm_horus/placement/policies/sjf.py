"""sjf: shortest job first on exclusive GPUs.

Source: the classic SJF baseline of the GPU-sharing papers (e.g. SJF-BSBF, arXiv 2407.13088, and
Tiresias' discussion of duration-aware scheduling). Rule: the queue is ordered by predicted run time
(alone), shortest first; each job gets the first free GPUs; GPUs are never shared.
"""

from ..framework import Policy, SJFMixin


class SJF(SJFMixin, Policy):
    name = "sjf"
    share = False
