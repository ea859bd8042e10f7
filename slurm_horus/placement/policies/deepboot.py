"""deepboot: lend idle inference GPUs to training, take them back when inference needs them.

Source: Chen et al., "DeepBoot: Dynamic Scheduling System for Training and Inference Deep Learning
Tasks in GPU Cluster", IEEE TPDS 34(9), 2023. Rule: the cluster has a training partition and an
inference partition; inference jobs go first and only to the inference partition; a training job
uses its own partition first and may borrow idle inference GPUs (``lend``); when an inference job
finds no free inference GPU, the borrowed GPUs are reclaimed from the most recently started
borrowers (least work lost) and those training jobs restart later with a restart cost (charged by
the caller). GPUs are exclusive. ``lend=False`` gives the same cluster without lending.
"""

import numpy as np

from ..framework import Policy

INFERENCE = "infer"


class DeepBoot(Policy):
    name = "deepboot"
    share = False
    lending = True
    inference_partition = INFERENCE

    def __init__(self, pairs=None, lend: bool = True, **options):
        super().__init__(pairs, **options)
        self.lending = bool(lend)

    def queue_key(self, req):
        return (0 if req.partition == self.inference_partition else 1, req.submit_time, req.job_id)

    def score_gpus(self, cycle):
        # own partition before borrowed GPUs, first fit within each
        state, req = cycle.state, cycle.req
        if req.partition and req.partition in state.partition_mask:
            return state.partition_mask[req.partition][cycle.idx].astype(float)
        return np.zeros(len(cycle.idx))

    def reclaim(self, state, req, ctx):
        if req.partition != self.inference_partition or not self.lending:
            return []
        mask = state.partition_mask.get(self.inference_partition)
        if mask is None:
            return []
        free_inference = int(((state.gpu_njobs == 0) & mask).sum())
        need = req.n_gpus - free_inference
        if need <= 0:
            return []
        borrowers = sorted((job for job in state.jobs.values()
                            if job.partition != self.inference_partition and mask[list(job.gpus)].any()),
                           key=lambda job: -job.start)
        chosen, freed = [], 0
        for job in borrowers:
            chosen.append(job.job_id)
            freed += int(mask[list(job.gpus)].sum())
            if freed >= need:
                return chosen
        return []
