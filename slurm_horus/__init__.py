"""slurm-horus: interference-aware GPU co-location for Slurm clusters."""

__version__ = "0.1.0"
