#!/usr/bin/env python3
# -*- coding: utf-8 -*-
#SBATCH --gpus=1
#SBATCH --time=15
#SBATCH --job-name=eval-vit
"""Evaluate a ViT checkpoint; résumé of results goes to stdout."""
import os
import torch

print(os.environ.get("HORUS_DECISION"), torch.cuda.device_count())
