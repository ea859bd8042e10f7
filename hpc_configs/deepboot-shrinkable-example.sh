#!/bin/sh
#SBATCH --partition=train-lend
# A multi-node training job that gives a lent inference node back without a restart, by shrinking
# itself. Whoever reclaims the node (an operator, a reclaim script) asks with a signal to the batch
# script:  scancel --batch --signal=USR1 <job>   and the job, at the end of the epoch it is in (no job
# step running), shrinks itself by one node:  scontrol update JobId=$SLURM_JOB_ID NumNodes=<n-1>;
# Slurm releases the last node of the allocation (never the batch host) at once, and the job goes on
# with the rest. Shrinking between steps matters: a shrink that releases a node on which a job step
# still runs kills that step on 22.05 and aborts slurmctld on 24.11.5 and 26.05.5 (measured, from
# outside the job and from inside alike; with no step there it works on all three).
# Each epoch is one job step over the nodes the job holds *now*: the job re-reads its allocation from
# squeue before every step, because the environment Slurm gave it at start still names the released
# node. A real job checkpoints at epoch ends and restarts its workers on the new node set (e.g.
# torchrun's elastic rendezvous); this one only prints where each epoch ran. A step that cannot start
# within STEP_TIMEOUT seconds is tried again.
EPOCHS="${EPOCHS:-30}"
EPOCH_S="${EPOCH_S:-0.3}"
STEP_TIMEOUT="${STEP_TIMEOUT:-20}"
shrink=0
trap 'shrink=1' USR1  # sh runs it once the step in the foreground has ended
i=0
while [ "$i" -lt "$EPOCHS" ]; do
    n=$(squeue -h -j "$SLURM_JOB_ID" -o %D)
    if [ "$shrink" = 1 ]; then
        shrink=0
        if [ "$n" -gt 1 ] && scontrol update JobId="$SLURM_JOB_ID" NumNodes=$((n - 1)); then
            n=$((n - 1))
            echo "shrank itself to $n node(s) at $(date +%s.%N)"
        fi
    fi
    nodes=$(squeue -h -j "$SLURM_JOB_ID" -o %N)
    export SLURM_JOB_NODELIST="$nodes" SLURM_NODELIST="$nodes" SLURM_JOB_NUM_NODES="$n" SLURM_NNODES="$n"
    if timeout "$STEP_TIMEOUT" srun -N "$n" -n "$n" sleep "$EPOCH_S"; then
        echo "epoch $i on $nodes at $(date +%s.%N)"
        i=$((i + 1))
    else
        echo "epoch $i failed at $(date +%s.%N): again"
    fi
done
echo "done epochs=$EPOCHS"
