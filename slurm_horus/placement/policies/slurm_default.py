"""slurm-default: what a stock Slurm 22.05 cluster does (the baseline).

Source: Slurm ``select/cons_tres`` with ``--gres=gpu:N`` and the priority/basic FIFO order. Rule: a
GPU belongs to one job at a time (exclusive), jobs are started in submission order, and each job
gets the first GPUs that are free (first fit); a job that does not fit is skipped for now while
smaller ones behind it may start (what the backfill scheduler does when it cannot delay the head).
"""

from ..framework import Policy


class SlurmDefault(Policy):
    name = "slurm-default"
    share = False
