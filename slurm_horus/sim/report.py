"""HTML report of a simulation: comparison table, JCT CDF and utilization over time (inline SVG)."""

from typing import List

import jinja2
import numpy as np
from markupsafe import Markup

from ..resources import resource_dir
from .engine import SimResult
from ..report.svg import line_chart

TEMPLATE = "sim_report.html.j2"


def jct_cdf(result: SimResult, points: int = 200):
    jct = np.sort([j.end - j.trace.submit_time for j in result.jobs if j.end is not None])
    if len(jct) == 0:
        return []
    picks = np.unique(np.linspace(0, len(jct) - 1, min(points, len(jct))).astype(int))
    return [(float(jct[i]) / 3600.0, (i + 1) / len(jct)) for i in picks]


def utilization_series(result: SimResult):
    return [((t - result.start_time) / 3600.0, rate / result.n_gpus) for t, _busy, rate in result.timeline]


def write_report(path, payload: dict, results: List[SimResult]):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    template = env.get_template(TEMPLATE)
    cdf = line_chart({r.policy: jct_cdf(r) for r in results}, "JCT CDF", "job completion time (h)",
                     "fraction of jobs", y_max=1.0)
    util = line_chart({r.policy: utilization_series(r) for r in results}, "Effective utilization over time",
                      "time since the first arrival (h)", "useful work / GPUs", step=True)
    html = template.render(payload=payload, policies=payload["policies"],
                           ratios=payload.get("ratios_to_slurm_default", {}),
                           plots=[Markup(cdf), Markup(util)])
    with open(path, "w") as handle:
        handle.write(html)


def write_arrival_report(path, payload: dict):
    """FGD's protocol: allocated vs arrived GPU capacity per policy, one plot, and the table."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    template = env.get_template("sim_arrivals.html.j2")
    curves = {name: [tuple(point) for point in s["allocation_curve"]] for name, s in payload["policies"].items()}
    chart = line_chart(curves, "GPU capacity allocated as requests arrive (nothing departs)",
                       "GPU capacity arrived (%)", "GPU capacity allocated (%)")
    policies = {name: {k: v for k, v in s.items() if k != "allocation_curve"}
                for name, s in payload["policies"].items()}
    html = template.render(payload=payload, policies=policies, ratios={}, plots=[Markup(chart)])
    with open(path, "w") as handle:
        handle.write(html)
