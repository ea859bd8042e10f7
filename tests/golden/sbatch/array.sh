#!/bin/bash
#SBATCH --array=0-9%4
#SBATCH --gres=gpu:1
#SBATCH --time=30
#SBATCH --output=sweep_%A_%a.out

LR=$(python -c "print(10 ** (-1 - ${SLURM_ARRAY_TASK_ID} / 3))")
python sweep.py --lr "$LR"
