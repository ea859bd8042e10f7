#!/bin/bash
#SBATCH --gres=gpu:1
#SBATCH --time=10

echo "written on Windows"
python train.py
