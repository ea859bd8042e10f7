"""Small hand-made profiles and observations whose right answers are known."""

from slurm_horus.interference import Observation, SoloProfile


def additive_world(gpu="v100", classes=8):
    """norm_tput(t, c) = 0.9 - 0.05 * t - 0.04 * c on ``gpu``: sensitivity grows with the target's
    index, aggressiveness with the co-runner's. Returns (names, profiles, truth dict)."""
    names = [f"job{i}-bs32" for i in range(classes)]
    profiles = [SoloProfile(name, gpu, solo_tput=10.0 + i) for i, name in enumerate(names)]
    truth = {(t, c): 0.9 - 0.05 * i - 0.04 * j for i, t in enumerate(names) for j, c in enumerate(names)}
    return names, profiles, truth


def observations_of(truth, gpu="v100", skip=()):
    return [Observation(gpu, t, c, value) for (t, c), value in truth.items() if (t, c) not in skip]
