#!/bin/sh
#SBATCH --partition=train-lend
# A multi-node training job that survives being shrunk off a lent inference node (Slurm 22.05:
# `scontrol update JobId=N NodeList=<kept nodes>` frees the node at once; a step running there is
# killed, the job goes on). Each epoch is one job step over the nodes the job holds *now*: the job
# re-reads its allocation from squeue before every step, because the environment Slurm gave it at
# start still names the released node (Slurm writes a slurm_job_N_resize.sh only in the directory of
# whoever ran scontrol). A real job checkpoints at epoch ends and restarts its workers on the new
# node set (e.g. torchrun's elastic rendezvous); this one only prints where each epoch ran.
# A step asked for just before a shrink waits for the released node for ever ("Requested nodes are
# busy"): each epoch gets STEP_TIMEOUT seconds, then runs again on the nodes left.
EPOCHS="${EPOCHS:-30}"
EPOCH_S="${EPOCH_S:-0.3}"
STEP_TIMEOUT="${STEP_TIMEOUT:-20}"
i=0
while [ "$i" -lt "$EPOCHS" ]; do
    nodes=$(squeue -h -j "$SLURM_JOB_ID" -o %N)
    n=$(squeue -h -j "$SLURM_JOB_ID" -o %D)
    export SLURM_JOB_NODELIST="$nodes" SLURM_NODELIST="$nodes" SLURM_JOB_NUM_NODES="$n" SLURM_NNODES="$n"
    if timeout "$STEP_TIMEOUT" srun -N "$n" -n "$n" sleep "$EPOCH_S"; then
        echo "epoch $i on $nodes at $(date +%s.%N)"
        i=$((i + 1))
    else
        echo "epoch $i lost a node at $(date +%s.%N): again on the nodes left"
    fi
done
echo "done epochs=$EPOCHS"
