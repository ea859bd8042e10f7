"""Render report dicts (report/build.py) as terminal tables or as HTML with SVG plots (jinja2)."""

import time

import jinja2

from ..resources import resource_dir
from . import svg


def _fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(headers, rows):
    """A plain aligned text table."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def when(epoch):
    return "-" if not epoch else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def job_text(report):
    job = report["job"]
    lines = [
        f"Job {job['job_id']} ({job['name']}) user={job['user']} account={job['account']} "
        f"partition={job['partition']} class={job['job_class']}",
        f"  state {job['state']}  exit {_fmt(job['exit_code'])}  elapsed {_fmt(job['elapsed_s'])} s  "
        f"start {when(job['start_time'])}  end {when(job['end_time'])}",
        f"  nodes {job['nodes']}  GPUs {', '.join(report['gpu_list']) or '-'}  GRES {job['gres_alloc'] or '-'}",
        f"  predicted slowdown {_fmt(report['predicted_slowdown'])}  "
        f"observed slowdown {_fmt(report['observed_slowdown'])}",
        "",
        table(["GPU", "samples", "mean SM %", "max SM %", "max mem MB", "GPU mem MB", "shared"],
              [[f"{g['node']}:{g['gpu_index']}", g["samples"], g["mean_sm_util"], g["max_sm_util"],
                g["max_mem_mb"], g["mem_total_mb"], g["shared_fraction"]] for g in report["gpus"]])
        if report["gpus"] else "  no GPU samples (collector not running for this job)",
        "",
    ]
    if report["corunners"]:
        lines.append("Co-runners:")
        lines.append(table(["job", "name", "user", "class", "overlap s", "GPUs", "obs. slowdown"],
                           [[c["job_id"], c["name"], c["user"], c["job_class"], c["overlap_s"],
                             " ".join(c["gpus"]), c["observed_slowdown"]] for c in report["corunners"]]))
    else:
        lines.append("Co-runners: none")
    lines.append("")
    lines.append("Flags: " + (", ".join(report["flags"]) or "none"))
    return "\n".join(lines)


def group_text(report):
    key = report["by"][:-1]
    return table([key, "jobs", "GPU-h", "used GPU-h", "mean util %", "saved GPU-h", "shared jobs", "hurt jobs"],
                 [[r[key], r["jobs"], r["gpu_hours"], r["used_gpu_hours"], r["mean_util"],
                   r["saved_gpu_hours"], r["shared_jobs"], r["hurt_jobs"]] for r in report["rows"]])


def cluster_text(report):
    lines = [f"GPU jobs {report['gpu_jobs']}, shared {report['shared_jobs']} "
             f"(sharing rate {_fmt(report['sharing_rate'])}), observations {report['observations']}, "
             f"GPU samples {report.get('gpu_samples', 0)}",
             "States: " + ", ".join(f"{k} {v}" for k, v in sorted(report["states"].items())), ""]
    if report["timeline"]:
        lines.append(f"Utilization per {report['bucket_s']} s (last 24 buckets):")
        lines.append(table(["from", "GPUs", "mean GPU util %", "busy fraction"],
                           [[when(t["t"]), t["gpus"], t["mean_gpu_util"], t["busy_fraction"]]
                            for t in report["timeline"][-24:]]))
        lines.append("")
    if report["models"]:
        lines.append(table(["model", "predictor", "created", "origin", "observations", "MAE before",
                            "MAE after"],
                           [[m["id"], m["name"], m["created"], m["origin"], m["n_observations"],
                             m["error_before"], m["error_after"]] for m in report["models"]]))
    return "\n".join(lines)


def _plots(kind, report):
    if kind == "job":
        job = report["job"]
        plots = [svg.timeline_chart(
            [(f"{job['job_id']} (this job)", job["start_time"], job["end_time"] or time.time())]
            + [(f"{c['job_id']} {c['job_class'] or ''}", c["start_time"], c["end_time"] or time.time())
               for c in report["corunners"]],
            title="This job and its co-runners over time")]
        if report["gpus"]:
            plots.append(svg.line_chart(
                [(f"{g['node']}:{g['gpu_index']}", [(p[0], p[1]) for p in g["series"]]) for g in report["gpus"]],
                y_max=100, y_label="SM util %", title="SM utilization of this job per GPU"))
            plots.append(svg.line_chart(
                [(f"{g['node']}:{g['gpu_index']}", [(p[0], p[2]) for p in g["series"]]) for g in report["gpus"]],
                y_max=max([g["mem_total_mb"] or 0 for g in report["gpus"]]) or None,
                y_label="memory MB", title="GPU memory of this job per GPU"))
        return plots
    if kind == "cluster":
        timeline = report["timeline"]
        return [
            svg.line_chart([("mean GPU util %", [(t["t"], t["mean_gpu_util"]) for t in timeline]),
                            ("busy %", [(t["t"], 100 * t["busy_fraction"]) for t in timeline])],
                           y_max=100, y_label="%", title="Cluster utilization over time"),
            svg.bar_chart([(label, m[key]) for m in report["models"][-3:] if m["origin"] == "refit"
                           for label, key in ((f"#{m['id']} before", "error_before"),
                                              (f"#{m['id']} after", "error_after"))],
                          title="Model error (MAE of normalized throughput) before/after refits",
                          y_label="MAE"),
        ]
    key = report["by"][:-1]
    return [
        svg.bar_chart([(r[key], r["gpu_hours"]) for r in report["rows"][:20]],
                      title=f"GPU-hours allocated per {key}", y_label="GPU-h"),
        svg.bar_chart([(r[key], r["mean_util"]) for r in report["rows"][:20]],
                      title=f"Mean GPU utilization per {key}", y_label="%"),
    ]


def html(kind, report, text):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    template = env.get_template("report.html.j2")
    return template.render(kind=kind, report=report, text=text, plots=_plots(kind, report),
                           generated=when(time.time()))
