#!/bin/bash
#SBATCH --gpus-per-task=1
#SBATCH --ntasks=2
#SBATCH --time=10

srun python worker.py
