"""HTML report of a replay: the live and simulated figures per policy, and their JCT distributions."""

import jinja2
from markupsafe import Markup

from ..report.svg import line_chart
from ..resources import resource_dir
from ..sim.metrics import job_times as sim_job_times
from ..sim.report import cdf_points
from .live import job_times as live_job_times

TEMPLATE = "replay_report.html.j2"


def jct_cdf(times, points=200):
    return cdf_points((j.end - j.submit for j in times if j.end is not None), points)


def write_report(path, payload, setup, runs):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    series = {}
    for name, run in runs.items():
        series[f"{name} live"] = jct_cdf(live_job_times(run["live"], setup.truth, setup.gpu_type))
        series[f"{name} sim"] = jct_cdf(sim_job_times(run["sim"]))
    cdf = line_chart(series, "JCT CDF, live (sacct) and simulated", "job completion time (trace h)",
                     "fraction of jobs", y_max=1.0)
    html = env.get_template(TEMPLATE).render(payload=payload, policies=payload["policies"], plots=[Markup(cdf)])
    with open(path, "w") as handle:
        handle.write(html)
