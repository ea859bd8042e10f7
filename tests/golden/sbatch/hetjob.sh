#!/bin/bash
#SBATCH --job-name=server-client
#SBATCH --gres=gpu:1 --ntasks=1
#SBATCH hetjob
#SBATCH --ntasks=4 --cpus-per-task=2

srun --het-group=0 python inference_server.py &
srun --het-group=1 python load_generator.py
wait
