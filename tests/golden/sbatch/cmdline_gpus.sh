#!/bin/bash
#SBATCH --gpus=2
#SBATCH --gres=gpu:1,tmpdisk:100
#SBATCH --time=20

python train.py
