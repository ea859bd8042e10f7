"""sjf-bsbf: shortest job first, best-sharing-benefit first.

Source: "Scheduling Deep Learning Jobs in Multi-Tenant GPU Clusters via Wise Resource Sharing"
(SJF-BSBF, arXiv 2407.13088). Rule: SJF queue order; a free GPU is taken exclusively; otherwise the
new job ``a`` may join the job ``b`` running alone on a GPU only if their mean completion time when
sharing beats ``a`` waiting for ``b``. With E the remaining exclusive time and ξ the slowdown
(Ê = ξ·E): if Ê_a ≥ Ê_b, T_con = ½E_a + (1 − 1/(2ξ_a))·Ê_b, symmetric otherwise;
T_seq = E_b + ½E_a; share iff T_con < T_seq. Among qualifying GPUs the largest benefit
T_seq − T_con wins. At most 2 jobs per GPU.
"""

import numpy as np

from ..framework import NEG_INF, Policy, SJFMixin


def pair_benefit(e_a, e_b, tput_a, tput_b):
    """T_seq − T_con of the SJF-BSBF rule (vectorized); > 0 means sharing is worth it.

    Written with tput = 1/ξ: Ê = E/tput, and (1 − 1/(2ξ))·Ê = Ê − tput·Ê/2, so the branch that
    applies is the one of the smaller Ê (fewer temporaries on the decision path).
    """
    tput_a = np.maximum(tput_a, 1e-9)
    tput_b = np.maximum(tput_b, 1e-9)
    eh_a = e_a / tput_a
    eh_b = e_b / tput_b
    a_last = eh_a >= eh_b
    shorter = np.minimum(eh_a, eh_b)
    t_con = np.where(a_last, 0.5 * e_a + shorter * (1.0 - 0.5 * tput_a),
                     0.5 * e_b + shorter * (1.0 - 0.5 * tput_b))
    return (e_b + 0.5 * e_a) - t_con


class SJFBSBF(SJFMixin, Policy):
    name = "sjf-bsbf"
    share = True
    max_jobs_per_gpu = 2
    uses_duration = True

    def score_gpus(self, cycle):
        free = cycle.free
        score = np.full(len(cycle.idx), NEG_INF)
        # a free GPU beats any sharing; among free GPUs first fit
        score[free] = 1e9
        if not free.all():
            shared = ~free
            e_a = cycle.req.expected_duration()
            e_b = np.maximum(cycle.state.gpu_end0[cycle.idx[shared]] - cycle.ctx.now, 1.0)
            benefit = pair_benefit(e_a, e_b, cycle.job_tput[shared], cycle.res_tput[shared])
            score[shared] = np.where(benefit > 0, benefit, NEG_INF)
        if np.isinf(score).all() and not free.any():
            cycle.notes["wait_reason"] = "sharing would not beat waiting (SJF-BSBF rule)"
        return score
