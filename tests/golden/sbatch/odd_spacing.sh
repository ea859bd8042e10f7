#!/bin/bash
#SBATCH	-J odd  --gres gpu:a100:1   # trailing comment -N 4
#SBATCH   --time=2:00:00	--mem 8G

# SBATCH --exclusive   (not a directive: space after #)
   #SBATCH --nodelist=n9   (indented: not a directive)
#SBATCH --comment="two words" --constraint='a100&ib'

  
#SBATCH -p
#SBATCH debug
echo start
#SBATCH --exclusive   (after the first command: ignored)
python run.py
