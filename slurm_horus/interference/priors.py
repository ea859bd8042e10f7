"""Built-in priors: Gavel's measured V100 and P100 throughputs (MIT), shipped in slurm_horus/data/.

Converted once by scripts/convert_gavel.py; origin and license in slurm_horus/data/README.md.
"""

from pathlib import Path

from .io import load_observations_csv, load_profiles_csv

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def builtin_priors():
    """(profiles, observations) of the shipped Gavel data (26 job classes, v100 and p100)."""
    return (load_profiles_csv(DATA_DIR / "gavel_profiles.csv"),
            load_observations_csv(DATA_DIR / "gavel_observations.csv"))
