"""Readers for the shared evaluation data of the benchmarks (never used by tests or the package).

The data lives OUTSIDE the repository: ``../shared/data`` relative to the repository root, or the
folder named by ``$HORUS_SHARED_DATA``. Lucid's data (S-Lab License, non-commercial) is read here
for evaluation only and is never copied into the project.
"""

import csv
import os
from pathlib import Path

from slurm_horus.interference import Observation, SoloProfile, class_name

REPO = Path(__file__).resolve().parent.parent
LUCID_GPU = "rtx3090"


def shared_data_dir():
    return Path(os.environ.get("HORUS_SHARED_DATA", REPO.parent / "shared" / "data"))


def lucid_class(model, dataset, batch_size, amp):
    return class_name(model, int(batch_size), amp=int(amp) == 1, dataset=dataset)


def load_lucid():
    """(profiles, observations, model family of each class) from Lucid's RTX 3090 measurements."""
    folder = shared_data_dir() / "lucid"
    profiles, family = [], {}
    with open(folder / "analyzer__single_data.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            name = lucid_class(row["model"], row["dataset"], row["batchsize"], row["amp"])
            family[name] = row["model"]
            profiles.append(SoloProfile(name, LUCID_GPU, gpu_util=float(row["gpu_util"]),
                                        mem_util=float(row["gmem_util"]), gmem_mb=float(row["gmem"]),
                                        solo_tput=float(row["speed"])))
    observations = []
    with open(folder / "data__colocate_info.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            first = lucid_class(row["model1"], row["dataset1"], row["batchsize1"], row["amp1"])
            second = lucid_class(row["model2"], row["dataset2"], row["batchsize2"], row["amp2"])
            family.setdefault(first, row["model1"])
            family.setdefault(second, row["model2"])
            observations.append(Observation(LUCID_GPU, first, second, float(row["speed1"])))
            observations.append(Observation(LUCID_GPU, second, first, float(row["speed2"])))
    return profiles, observations, family
