"""``mlp``: a small neural network on target and co-runner features (the issue's IAPP family:
interference prediction by a neural network over job features; numpy only, no framework).

Inputs of one (GPU type, target, co-runner) row, each for both jobs: GPU and memory-controller
utilization, peak memory as a share of the GPU's memory (0 and a known-flag when unknown), the
standardized log solo throughput and log speed-up over other GPU types (see cf.class_side), and the
job's mean observed normalized throughput as a target and as a co-runner on this GPU type (from the
training observations, leave-one-out while training, shrunk towards the overall mean; every
training row is also shown with the target's, the co-runner's and both histories hidden, so that a
new class is predicted from its profile); plus the pair's time-slicing baseline
``1/max(1, u_t + u_c)``. One hidden layer (tanh; ``layers`` gives several, see ``mlp-deep``), sigmoid output,
trained by Adam on the feasible observations with L2 weight decay; several seeds averaged.
Covers a pair when both classes have a profile or observations.
"""

import numpy as np

from .cf import class_side
from .table import TablePredictor, pair_observation_arrays

SHRINK = 3.0  # pseudo-observations pulling a class's observed mean towards the overall mean
# columns of a row (see _rows) holding the target's and the co-runner's (mean, confidence)
TARGET_HISTORY, CORUNNER_HISTORY = slice(-5, -3), slice(-3, -1)


def adam_step(params, grads, first, second, rate, step):
    """One Adam update (β 0.9 / 0.999) of ``params`` in place; ``first``/``second`` are its moments."""
    for p, grad, m1, m2 in zip(params, grads, first, second):
        m1 *= 0.9
        m1 += 0.1 * grad
        m2 *= 0.999
        m2 += 0.001 * grad * grad
        p -= rate * (m1 / (1 - 0.9 ** step)) / (np.sqrt(m2 / (1 - 0.999 ** step)) + 1e-8)


class _Means:
    """Observed mean normalized throughput of each class as target (rows) and co-runner (cols)."""

    def __init__(self, count, t, c, y, prior):
        self.prior = prior
        self.row_sum = np.bincount(t, y, count)
        self.row_n = np.bincount(t, minlength=count).astype(float)
        self.col_sum = np.bincount(c, y, count)
        self.col_n = np.bincount(c, minlength=count).astype(float)

    def _shrunk(self, total, n, leave_out):
        """(mean shrunk towards the prior, confidence 0..1 from the count), minus one's own row."""
        if leave_out is not None:
            total, n = total - leave_out, n - 1
        return (total + SHRINK * self.prior) / (n + SHRINK), np.minimum(n, 10) / 10.0

    def rows(self, t, leave_out=None):
        return self._shrunk(self.row_sum[t], self.row_n[t], leave_out)

    def cols(self, c, leave_out=None):
        return self._shrunk(self.col_sum[c], self.col_n[c], leave_out)


class MLPPredictor(TablePredictor):
    name = "mlp"
    options = {"hidden": 16, "layers": (), "epochs": 600, "rate": 0.02, "decay": 3e-3, "seeds": 2}

    def _class_inputs(self, gpu_type):
        f = self.profile_table.features(gpu_type)
        u = f["gpu_util"] / 100.0
        m = np.where(np.isnan(f["mem_util"]), u, f["mem_util"] / 100.0)
        g = f["gmem_mb"] / self.memory.capacity_mb(gpu_type)
        known = (~np.isnan(u)).astype(float)
        return np.column_stack([np.nan_to_num(u), np.nan_to_num(m), np.nan_to_num(g), known,
                                class_side(self.profile_table, gpu_type)])

    def _rows(self, gpu_type, t, c, means, leave_out=None):
        x = self._class_inputs(gpu_type)
        u = x[:, 0]
        row_mean, row_conf = means.rows(t, leave_out)
        col_mean, col_conf = means.cols(c, leave_out)
        baseline = np.where((x[t, 3] > 0) & (x[c, 3] > 0), 1.0 / np.maximum(1.0, u[t] + u[c]), 0.5)
        return np.column_stack([x[t], x[c], row_mean, row_conf, col_mean, col_conf, baseline])

    def _means_for(self, gpu_type):
        means = self._means.get(gpu_type)
        if means is None:  # a GPU type never observed: class means over all types
            means = self._all_means
        return means

    def _fit(self):
        count = len(self.index)
        g, t, c, y = pair_observation_arrays(self.index, self.observations, self.gpu_types)
        feasible = y > 0
        g, t, c, y = g[feasible], t[feasible], c[feasible], y[feasible]
        prior = float(y.mean()) if len(y) else 0.5
        self._all_means = _Means(count, t, c, y, prior)
        self._means, blocks, answers = {}, [], []
        for position, gpu in enumerate(self.gpu_types):
            mine = g == position
            means = self._means[gpu] = _Means(count, t[mine], c[mine], y[mine], prior)
            if mine.any():
                rows = self._rows(gpu, t[mine], c[mine], means, leave_out=y[mine])
                blocks.append(rows)
                answers.append(y[mine])
                # the same rows as if the target, the co-runner or both had no history, so the net
                # also learns to answer from profiles alone (a new job class)
                for hide in (TARGET_HISTORY, CORUNNER_HISTORY, slice(TARGET_HISTORY.start, CORUNNER_HISTORY.stop)):
                    unseen = rows.copy()
                    unseen[:, hide] = [prior, 0.0] * ((hide.stop - hide.start) // 2)
                    blocks.append(unseen)
                    answers.append(y[mine])
        self._known = np.zeros(count, bool)
        for gpu in self.profile_table.gpu_types:
            self._known |= ~np.isnan(self.profile_table.own("solo_tput", gpu)) | ~np.isnan(
                self.profile_table.own("gpu_util", gpu))
        self._known[t] = self._known[c] = True
        self.nets = []
        if not blocks:
            return
        x, y = np.vstack(blocks), np.concatenate(answers)
        self._center, self._spread = x.mean(axis=0), x.std(axis=0) + 1e-6
        x = (x - self._center) / self._spread
        for seed in range(self.settings["seeds"]):
            self.nets.append(self._train(x, y, seed))

    def _sizes(self, inputs):
        layers = tuple(self.settings.get("layers") or (self.settings["hidden"],))
        return (inputs,) + tuple(int(n) for n in layers)

    def _train(self, x, y, seed):
        """Adam on squared error, tanh hidden layers (``layers``, default one of ``hidden``), sigmoid output."""
        rng = np.random.default_rng(seed)
        rate, decay = self.settings["rate"], self.settings["decay"]
        sizes = self._sizes(x.shape[1])
        params = []
        for a, b in zip(sizes, sizes[1:]):
            params += [rng.normal(0, 1 / np.sqrt(a), (a, b)), np.zeros(b)]
        params += [rng.normal(0, 1 / np.sqrt(sizes[-1]), sizes[-1]), np.zeros(1)]
        first = [np.zeros_like(p) for p in params]
        second = [np.zeros_like(p) for p in params]
        n = len(y)
        for step in range(1, self.settings["epochs"] + 1):
            acts = [x]
            for k in range(0, len(params) - 2, 2):
                acts.append(np.tanh(acts[-1] @ params[k] + params[k + 1]))
            w_out, b_out = params[-2], params[-1]
            out = 1.0 / (1.0 + np.exp(-(acts[-1] @ w_out + b_out[0])))
            d_out = (out - y) * out * (1 - out) * (2.0 / n)
            grads = [None] * len(params)
            grads[-2], grads[-1] = acts[-1].T @ d_out + decay * w_out, np.array([d_out.sum()])
            d_h = np.outer(d_out, w_out) * (1 - acts[-1] ** 2)
            for k in range(len(params) - 4, -1, -2):
                grads[k], grads[k + 1] = acts[k // 2].T @ d_h + decay * params[k], d_h.sum(axis=0)
                if k:
                    d_h = (d_h @ params[k].T) * (1 - acts[k // 2] ** 2)
            adam_step(params, grads, first, second, rate, step)
        return params

    def _forward(self, x):
        x = (x - self._center) / self._spread
        outputs = []
        for params in self.nets:
            h = x
            for k in range(0, len(params) - 2, 2):
                h = np.tanh(h @ params[k] + params[k + 1])
            outputs.append(1.0 / (1.0 + np.exp(-(h @ params[-2] + params[-1][0]))))
        return np.mean(outputs, axis=0)

    def _pair_matrix(self, gpu_type):
        count = len(self.index)
        if not self.nets:
            return np.full((count, count), np.nan)
        t, c = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
        values = self._forward(self._rows(gpu_type, t.ravel(), c.ravel(), self._means_for(gpu_type)))
        values = values.reshape(count, count)
        values[~self._known, :] = np.nan
        values[:, ~self._known] = np.nan
        return values


class DeepMLPPredictor(MLPPredictor):
    """``mlp-deep``: the same inputs and training through three hidden layers (64, 32, 16): closer to
    the "deep neural network" of IAPP than ``mlp``'s single layer of 16 (compared in
    bench/bench_interference.py and, inside ``iasp-iapp``, in bench/bench_sim.py)."""

    name = "mlp-deep"
    source = "mlp"
    options = dict(MLPPredictor.options, layers=(64, 32, 16), epochs=800, rate=0.01)
