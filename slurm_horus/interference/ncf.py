"""``ncf``: neural collaborative filtering over (target, co-runner, GPU type) — IASP's "deep
collaborative filtering" (numpy only).

Paper: Xu et al., "Interference-aware parallelization for deep learning workload in GPU cluster",
Cluster Computing 23, 2020 (IASP: interference-aware similarity prediction by deep collaborative
filtering); the network after He et al., "Neural Collaborative Filtering", WWW 2017 (NeuMF: a
generalized matrix factorization branch and an MLP branch over learned embeddings, fused by a last
layer). Here: learned embeddings of the target class, the co-runner class and the GPU type (``dim``
each); a GMF branch (the element-wise product of the target's and the co-runner's embeddings) and
an MLP branch (the three embeddings and both classes' side information — standardized log solo
throughput and speed-up, see cf.class_side — through tanh layers ``layers``), fused by a sigmoid
output; Adam on squared error with L2 decay, several seeds averaged. Like ``cf`` it covers pairs
whose two classes were both observed co-located on some GPU type.
"""

import numpy as np

from .cf import class_side, feasible_pair_arrays
from .mlp import adam_step
from .table import TablePredictor


class NCFPredictor(TablePredictor):
    name = "ncf"
    source = "cf"
    options = {"dim": 8, "layers": (32, 16), "epochs": 800, "rate": 0.01, "decay": 1e-4, "seeds": 2}

    def _fit(self):
        count, gpus = len(self.index), len(self.gpu_types)
        g, t, c, y = feasible_pair_arrays(self)
        self._side = {gpu: class_side(self.profile_table, gpu) for gpu in self.gpu_types}
        self._gpu_position = {gpu: i for i, gpu in enumerate(self.gpu_types)}
        self.nets = []
        if not len(y):
            return
        side = np.stack([self._side[gpu] for gpu in self.gpu_types])  # (gpus, count, features)
        for seed in range(self.settings["seeds"]):
            self.nets.append(self._train(count, gpus, side, g, t, c, y, seed))

    def _init(self, count, gpus, n_side, rng):
        dim = self.settings["dim"]
        sizes = (3 * dim + 2 * n_side,) + tuple(int(n) for n in self.settings["layers"])
        params = {"et": rng.normal(0, 0.1, (count, dim)), "ec": rng.normal(0, 0.1, (count, dim)),
                  "eg": rng.normal(0, 0.1, (gpus, dim)), "mlp": [], "out": None}
        for a, b in zip(sizes, sizes[1:]):
            params["mlp"].append([rng.normal(0, 1 / np.sqrt(a), (a, b)), np.zeros(b)])
        params["out"] = [rng.normal(0, 0.1, dim + sizes[-1]), np.zeros(1)]
        return params

    @staticmethod
    def _forward(params, side, g, t, c, keep=False):
        et, ec, eg = params["et"][t], params["ec"][c], params["eg"][g]
        gmf = et * ec
        h = np.concatenate([et, ec, eg, side[g, t], side[g, c]], axis=1)
        acts = [h]
        for w, b in params["mlp"]:
            acts.append(np.tanh(acts[-1] @ w + b))
        fused = np.concatenate([gmf, acts[-1]], axis=1)
        w, b = params["out"]
        out = 1.0 / (1.0 + np.exp(-(fused @ w + b[0])))
        return (out, acts, fused, et, ec) if keep else out

    def _train(self, count, gpus, side, g, t, c, y, seed):
        rng = np.random.default_rng(seed)
        params = self._init(count, gpus, side.shape[2], rng)
        rate, decay, dim = self.settings["rate"], self.settings["decay"], self.settings["dim"]
        flat = lambda p: [p["et"], p["ec"], p["eg"]] + [a for layer in p["mlp"] for a in layer] + p["out"]  # noqa: E731
        first = [np.zeros_like(a) for a in flat(params)]
        second = [np.zeros_like(a) for a in flat(params)]
        n = len(y)
        one_t, one_c, one_g = np.eye(count)[t], np.eye(count)[c], np.eye(gpus)[g]  # scatter-adds as products
        for step in range(1, self.settings["epochs"] + 1):
            out, acts, fused, et, ec = self._forward(params, side, g, t, c, keep=True)
            d_out = (out - y) * out * (1 - out) * (2.0 / n)
            w_out = params["out"][0]
            grads_out = [fused.T @ d_out + decay * w_out, np.array([d_out.sum()])]
            d_fused = np.outer(d_out, w_out)
            d_gmf, d_h = d_fused[:, :dim], d_fused[:, dim:]
            grads_mlp = []
            for k in range(len(params["mlp"]) - 1, -1, -1):
                w, _ = params["mlp"][k]
                d_h = d_h * (1 - acts[k + 1] ** 2)
                grads_mlp.insert(0, [acts[k].T @ d_h + decay * w, d_h.sum(axis=0)])
                d_h = d_h @ w.T
            d_et = d_gmf * ec + d_h[:, :dim]
            d_ec = d_gmf * et + d_h[:, dim:2 * dim]
            d_eg = d_h[:, 2 * dim:3 * dim]
            grads = [one_t.T @ d_et + decay * params["et"], one_c.T @ d_ec + decay * params["ec"],
                     one_g.T @ d_eg + decay * params["eg"]]
            grads += [a for layer in grads_mlp for a in layer] + grads_out
            adam_step(flat(params), grads, first, second, rate, step)
        return params

    def _pair_matrix(self, gpu_type):
        count = len(self.index)
        if not self.nets:
            return np.full((count, count), np.nan)
        position = self._gpu_position.get(gpu_type)
        side = np.stack([self._side[gpu] for gpu in self.gpu_types]) if position is not None else \
            class_side(self.profile_table, gpu_type)[None]
        t, c = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
        t, c = t.ravel(), c.ravel()
        if position is None:  # a GPU type never observed: the mean over the known GPU types' embeddings
            values = []
            for net in self.nets:
                mean_net = dict(net, eg=net["eg"].mean(axis=0, keepdims=True))
                values.append(self._forward(mean_net, side, np.zeros(len(t), np.intp), t, c))
        else:
            g = np.full(len(t), position, np.intp)
            values = [self._forward(net, side, g, t, c) for net in self.nets]
        values = np.mean(values, axis=0).reshape(count, count)
        values[~self._seen, :] = np.nan
        values[:, ~self._seen] = np.nan
        return values
