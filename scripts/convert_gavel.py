#!/usr/bin/env python3
"""Convert Gavel's measured throughputs into slurm-horus profiles.csv / observations.csv (run once).

Reads ``simulation_throughputs.json`` from the shared data folder (``../shared/data/gavel`` relative
to the repository root, or ``$HORUS_SHARED_DATA/gavel``) and writes the built-in priors shipped in
``slurm_horus/data/``. For the interference priors only single-GPU entries (scale factor 1) of
``v100`` and ``p100`` are kept: the model predicts jobs sharing one GPU. Gavel's schema:
``d[gpu]["('<job>', 1)"]["null"]`` is the isolated steps/s, ``d[gpu][A][B] = [tput of A, tput of B]``
when A and B share the GPU; 0 means the pair could not run together.

``gavel_scaling.csv`` keeps the multi-GPU entries (scale factors 2, 4, 8): the isolated steps/s of a
job on that many GPUs of one server (``d[gpu]``) and spread over servers (``d[gpu + "_unconsolidated"]``),
which is what spreading a job across nodes costs (the simulator's communication model).
"""

import ast
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_horus.interference.base import Observation, SoloProfile  # noqa: E402
from slurm_horus.interference.classes import gavel_class  # noqa: E402
from slurm_horus.interference.io import write_observations_csv, write_profiles_csv  # noqa: E402

GPU_TYPES = ("v100", "p100")


def convert(throughputs):
    profiles, observations = [], []
    for gpu in GPU_TYPES:
        table = throughputs[gpu]
        solo = {}
        for key, entry in table.items():
            job, scale = ast.literal_eval(key)
            if scale == 1:
                solo[job] = entry["null"]
        for job in sorted(solo, key=gavel_class):
            profiles.append(SoloProfile(gavel_class(job), gpu, solo_tput=round(solo[job], 6)))
        for job in sorted(solo, key=gavel_class):
            entry = table[repr((job, 1))]
            for other in sorted(solo, key=gavel_class):
                shared = entry.get(repr((other, 1)))
                if shared is None:  # only the other direction was recorded
                    shared = table[repr((other, 1))][repr((job, 1))][::-1]
                norm = shared[0] / solo[job] if solo[job] > 0 else 0.0
                observations.append(Observation(gpu, gavel_class(job), gavel_class(other), round(norm, 6)))
    return profiles, observations


def convert_scaling(throughputs):
    """Rows (gpu_type, job_class, gpus, consolidated steps/s, unconsolidated steps/s) for scale > 1."""
    rows = []
    for gpu in GPU_TYPES:
        together, spread = throughputs[gpu], throughputs.get(gpu + "_unconsolidated", {})
        for key in sorted(together, key=lambda k: (gavel_class(ast.literal_eval(k)[0]), ast.literal_eval(k)[1])):
            job, scale = ast.literal_eval(key)
            if scale > 1 and key in spread:
                rows.append((gpu, gavel_class(job), scale, round(together[key]["null"], 6),
                             round(spread[key]["null"], 6)))
    return rows


def write_scaling_csv(path, rows):
    with open(path, "w") as handle:
        handle.write("gpu_type,job_class,gpus,consolidated_tput,unconsolidated_tput\n")
        for row in rows:
            handle.write(",".join(str(v) for v in row) + "\n")


def main():
    shared = Path(os.environ.get("HORUS_SHARED_DATA", REPO.parent / "shared" / "data"))
    with open(shared / "gavel" / "simulation_throughputs.json") as handle:
        throughputs = json.load(handle)
    profiles, observations = convert(throughputs)
    scaling = convert_scaling(throughputs)
    out = REPO / "slurm_horus" / "data"
    write_profiles_csv(out / "gavel_profiles.csv", profiles)
    write_observations_csv(out / "gavel_observations.csv", observations)
    write_scaling_csv(out / "gavel_scaling.csv", scaling)
    print(f"{len(profiles)} profiles, {len(observations)} observations, {len(scaling)} scaling rows -> {out}")


if __name__ == "__main__":
    main()
