#!/bin/bash
#SBATCH --job-name=resnet50-train
#SBATCH --partition=gpu
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%j.out

# Train ResNet-50 on ImageNet subset
module load cuda/12.1
source ~/venvs/torch/bin/activate
python train.py --arch resnet50 --batch-size 64 --epochs 30
