#!/bin/bash
#SBATCH --job-name=small-cnn
#SBATCH --gres=gpu:1
#SBATCH --time=45
#HORUS --model resnet18 --batch-size 128

python train.py --batch-size "${HORUS_MICRO_BATCH:-128}" --accum "${HORUS_GRAD_ACCUM:-1}"
