"""sjf-ffs: shortest job first with first-fit sharing (the baseline of SJF-BSBF).

Source: the SJF-FFS baseline of "Scheduling Deep Learning Jobs in Multi-Tenant GPU Clusters via
Wise Resource Sharing" (SJF-BSBF, arXiv 2407.13088), as its reference code places a job
(``merge_alloc_res``): SJF queue order; the GPUs that may take the job are those where its memory
fits and that run at most one job; **free GPUs are taken first**, and a job shares a GPU only when
too few free GPUs are left for it (then the first qualifying GPUs in GPU order). Interference is not
looked at (only a predicted OOM is avoided). Our reading: the reference orders nodes by their number
of jobs before taking free GPUs; here free GPUs are taken in GPU order (first fit), as stock Slurm does.
"""

import numpy as np

from ..framework import Policy, SJFMixin


class SJFFFS(SJFMixin, Policy):
    name = "sjf-ffs"
    share = True
    max_jobs_per_gpu = 2

    def score_gpus(self, cycle):
        # a free GPU always beats a shared one; equal scores keep GPU order (first fit)
        return np.where(cycle.free, 1.0, 0.0)
