"""sjf-ffs: shortest job first with first-fit sharing.

Source: the SJF-FFS baseline of "Scheduling Deep Learning Jobs in Multi-Tenant GPU Clusters via
Wise Resource Sharing" (SJF-BSBF, arXiv 2407.13088). Rule: SJF queue order; the job goes to the first
GPU that qualifies, in GPU order, where a GPU qualifies if it is free or runs at most one job and the
memory of both fits. Interference is not looked at (only a predicted OOM is avoided).
"""

from ..framework import Policy, SJFMixin


class SJFFFS(SJFMixin, Policy):
    name = "sjf-ffs"
    share = True
    max_jobs_per_gpu = 2
