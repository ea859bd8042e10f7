"""``python -m slurm_horus`` is the ``horus`` command."""

from .cli import main

main()
