#!/bin/bash
#SBATCH --gres=gpu:1
#HORUS --off

python benchmark.py   # timing run: must not share a GPU
