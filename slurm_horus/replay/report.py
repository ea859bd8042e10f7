"""HTML report of a replay: the live and simulated figures per policy, and their JCT distributions."""

import jinja2
import numpy as np
from markupsafe import Markup

from ..resources import resource_dir
from ..sim.metrics import job_times as sim_job_times
from ..sim.svg import line_chart
from .live import job_times as live_job_times

TEMPLATE = "replay_report.html.j2"


def jct_cdf(times, points=200):
    jct = np.sort([j.end - j.submit for j in times if j.end is not None])
    if len(jct) == 0:
        return []
    picks = np.unique(np.linspace(0, len(jct) - 1, min(points, len(jct))).astype(int))
    return [(float(jct[i]) / 3600.0, (i + 1) / len(jct)) for i in picks]


def write_report(path, payload, setup, runs):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    series = {}
    for name, run in runs.items():
        series[f"{name} live"] = jct_cdf(live_job_times(run["live"], setup.truth, setup.gpu_type))
        series[f"{name} sim"] = jct_cdf(sim_job_times(run["sim"]))
    cdf = line_chart(series, "JCT CDF, live (sacct) and simulated", "job completion time (trace h)",
                     "fraction of jobs")
    html = env.get_template(TEMPLATE).render(payload=payload, policies=payload["policies"], plots=[Markup(cdf)])
    with open(path, "w") as handle:
        handle.write(html)
