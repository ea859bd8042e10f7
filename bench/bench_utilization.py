"""Horus's utilization predictor on Lucid's measured solo utilizations (RTX 3090), leave one model out.

Reads Lucid's ``analyzer__single_data.csv`` from the shared data folder (``$HORUS_SHARED_DATA`` or
``../shared/data``; evaluation only, never shipped): 65 rows of 11 models at several batch sizes,
with and without AMP. For each model, every predictor is fitted on the other ten models' rows and
predicts the held-out model's rows from its features alone (no profiling). Prints JSON: per
predictor the RMSLE (``sqrt(mean((log(1+pred) − log(1+true))²))`` on utilization in percent, the
metric of Horus/HotCloud'20, which report 0.154 on their own data) and the MAE in percentage points.

Predictors: ``mean`` (the training rows' mean), ``prior`` (the analytic model, no training: what
ships as the default knowledge, since no measured utilization may be shipped), ``gbr`` (the shipped
regressor when a site has measured utilizations: numpy gradient-boosted trees), ``ridge`` (the
simpler alternative: ridge on the residual to the prior), ``sklearn-gbr`` (scikit-learn's
GradientBoostingRegressor with its defaults on the same features, if installed; not a dependency),
and ``selected``: in each outer fold the predictor among prior/ridge/gbr with the lowest inner
leave-one-model-out RMSLE on the ten training models (nested: an honest figure for choosing the
predictor by this comparison). The prior's constants and the regressors' settings were set before
these figures were seen; the choice of ``gbr`` as the default regressor was made on them (see
``selected`` for what that choice is worth on an unseen model).
"""

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from shared_data import LUCID_GPU, load_lucid  # noqa: E402

from slurm_horus.interference.utilmodel import UtilizationModel, _logit, parse_class  # noqa: E402

HORUS_RMSLE = 0.154


def rmsle(pred, true):
    pred, true = np.asarray(pred), np.asarray(true)
    return float(np.sqrt(np.mean((np.log1p(pred) - np.log1p(true)) ** 2)))


def main():
    profiles, _, _ = load_lucid()
    rows = [(p.job_class, LUCID_GPU, p.gpu_util) for p in profiles if p.gpu_util is not None]
    model = UtilizationModel()
    rows = [r for r in rows if model.raw(r[0], r[1]) is not None]
    family = [parse_class(c)[0] for c, _, _ in rows]
    truth = np.array([u for _, _, u in rows])
    x = np.array([model.raw(c, g) for c, g, _ in rows])
    prior = np.array([model.prior_of(v) for v in x])
    y = np.array([_logit(u) for u in truth])
    try:
        from sklearn.ensemble import GradientBoostingRegressor
    except ImportError:
        GradientBoostingRegressor = None
    names = ["mean", "prior", "ridge", "gbr", "selected"] + (["sklearn-gbr"] if GradientBoostingRegressor else [])
    preds = {name: np.zeros(len(rows)) for name in names}
    chosen = {}

    def lomo(indices, method):
        """Predictions for ``indices`` (row positions), each model left out in turn."""
        out = {}
        fams = sorted({family[i] for i in indices})
        for held in fams:
            test = [i for i in indices if family[i] == held]
            train = [rows[i] for i in indices if family[i] != held]
            fitted = UtilizationModel(method=method).fit(train) if method != "prior" else UtilizationModel()
            for i in test:
                out[i] = fitted.predict(*rows[i][:2]) if method != "prior" else prior[i]
        return out

    for held in sorted(set(family)):
        test = np.array([f == held for f in family])
        train = ~test
        tr = [rows[i] for i in np.flatnonzero(train)]
        preds["mean"][test] = truth[train].mean()
        preds["prior"][test] = prior[test]
        for method in ("ridge", "gbr"):
            fitted = UtilizationModel(method=method).fit(tr)
            preds[method][test] = [fitted.predict(c, g) for c, g, _ in (rows[i] for i in np.flatnonzero(test))]
        inner = {}
        for method in ("prior", "ridge", "gbr"):
            got = lomo(list(np.flatnonzero(train)), method)
            keys = sorted(got)
            inner[method] = rmsle([got[i] for i in keys], truth[keys])
        best = min(inner, key=inner.get)
        chosen[held] = best
        preds["selected"][test] = preds[best][test]
        if GradientBoostingRegressor is not None:
            gbr = GradientBoostingRegressor(random_state=0).fit(x[train], y[train])
            preds["sklearn-gbr"][test] = 100.0 / (1.0 + np.exp(-gbr.predict(x[test])))
    out = {"rows": len(rows), "models": len(set(family)), "gpu": LUCID_GPU, "horus_reported_rmsle": HORUS_RMSLE,
           "selected_per_fold": chosen, "predictors": {}}
    for name, pred in preds.items():
        per_model = {held: round(rmsle(pred[[f == held for f in family]], truth[[f == held for f in family]]), 3)
                     for held in sorted(set(family))}
        out["predictors"][name] = {"rmsle": round(rmsle(pred, truth), 3),
                                   "mae_pp": round(float(np.mean(np.abs(pred - truth))), 1),
                                   "rmsle_per_held_out_model": per_model}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
