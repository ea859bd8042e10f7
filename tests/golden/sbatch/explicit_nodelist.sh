#!/bin/bash
#SBATCH --nodelist=n4
#SBATCH --gres=gpu:2
#SBATCH --time=10

nvidia-smi
