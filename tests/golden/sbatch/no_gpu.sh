#!/bin/sh
#SBATCH --ntasks=8
#SBATCH --mem-per-cpu=2G
#SBATCH --time=00:20:00

srun ./preprocess --input data/raw --output data/clean
