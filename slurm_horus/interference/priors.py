"""Built-in priors: Gavel's measured V100 and P100 throughputs (MIT), shipped in slurm_horus/data/.

Converted once by scripts/convert_gavel.py; origin and license in slurm_horus/data/README.md.
"""

import csv
from pathlib import Path
from typing import Dict, Tuple

from .io import load_observations_csv, load_profiles_csv

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def builtin_priors():
    """(profiles, observations) of the shipped Gavel data (26 job classes, v100 and p100)."""
    return (load_profiles_csv(DATA_DIR / "gavel_profiles.csv"),
            load_observations_csv(DATA_DIR / "gavel_observations.csv"))


def builtin_scaling() -> Dict[Tuple[str, str, int], Tuple[float, float]]:
    """Gavel's multi-GPU throughputs: (gpu_type, job_class, gpus) -> (steps/s with every GPU in one
    server, steps/s spread over servers), scale factors 2, 4 and 8 of 19 job classes (``gavel_scaling.csv``)."""
    out = {}
    with open(DATA_DIR / "gavel_scaling.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            out[(row["gpu_type"], row["job_class"], int(row["gpus"]))] = (
                float(row["consolidated_tput"]), float(row["unconsolidated_tput"]))
    return out
