#!/bin/bash -l
#SBATCH -J bert-finetune
#SBATCH -N 1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH -t 1-00:00
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=alice@example.org
#HORUS --class bert-base-bs32

set -euo pipefail
export MASTER_ADDR=$(hostname)
srun torchrun --nproc_per_node=2 finetune.py --model bert-base-uncased --batch-size 32
