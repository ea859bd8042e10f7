"""Render report dicts (report/build.py) as terminal tables or as HTML with SVG plots (jinja2)."""

import time

import jinja2

from ..resources import resource_dir
from . import svg
from .build import hms


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


def _pct(value):
    return "-" if value is None else f"{value:.1f} %"


def efficiency_lines(eff):
    """The seff-style lines: CPU, memory and time efficiency, each with what it is a share of."""
    cores = eff["n_cpus"] or 0
    memory = f"{eff['mem_mb']:.0f} MiB" if eff["mem_mb"] else "-"
    peak = f", peak {eff['max_rss_mb']:.0f} MiB" if eff["max_rss_mb"] is not None else ""
    limit = hms(eff["time_limit_min"] * 60) if eff["time_limit_min"] else "no limit"
    return [
        f"  CPU efficiency     {_pct(eff['cpu_eff'])} of {hms(eff['core_walltime_s'])} core-walltime "
        f"({cores} core{'s' if cores != 1 else ''}; CPU time used {hms(eff['cpu_time_s'])})",
        f"  Memory efficiency  {_pct(eff['mem_eff'])} of {memory}{peak}",
        f"  Time efficiency    {_pct(eff['time_eff'])} of {limit}",
    ]


def notes_lines(notes):
    if not notes:
        return ["Flags: none"]
    lines = ["Flags:"]
    for note in notes:
        lines.append(f"  {note['flag']}: {note['note']}")
        lines.append(f"    advice: {note['advice']}")
    return lines


def job_text(report):
    job = report["job"]
    lines = [
        f"Job {report['job_name']} ({job['name']}) user={job['user']} account={job['account']} "
        f"partition={job['partition']} class={job['job_class']}",
        f"  state {job['state']}  exit {_fmt(job['exit_code'])}  elapsed {hms(job['elapsed_s'])}  "
        f"start {when(job['start_time'])}  end {when(job['end_time'])}",
        f"  nodes {job['nodes']}  GPUs {', '.join(report['gpu_list']) or '-'}  GRES {job['gres_alloc'] or '-'}",
        f"  predicted slowdown {_fmt(report['predicted_slowdown'])}  "
        f"observed slowdown {_fmt(report['observed_slowdown'])}",
        *efficiency_lines(report["efficiency"]),
        "",
        table(["GPU", "samples", "mean SM %", "max SM %", "max mem MB", "GPU mem MB", "shared"],
              [[f"{g['node']}:{g['gpu_index']}", g["samples"], g["mean_sm_util"], g["max_sm_util"],
                g["max_mem_mb"], g["mem_total_mb"], g["shared_fraction"]] for g in report["gpus"]])
        if report["gpus"] else "  no GPU samples (collector not running for this job)",
        "",
    ]
    if report["corunners"]:
        lines.append("Co-runners:")
        lines.append(table(["job", "name", "user", "class", "overlap", "GPUs", "obs. slowdown"],
                           [[c["job_id"], c["name"], c["user"], c["job_class"], hms(c["overlap_s"]),
                             " ".join(c["gpus"]), c["observed_slowdown"]] for c in report["corunners"]]))
    else:
        lines.append("Co-runners: none")
    lines.append("")
    lines.extend(notes_lines(report["notes"]))
    return "\n".join(lines)


JOB_LIST_HEADERS = ["job", "name", "user", "state", "elapsed", "GPUs", "GPU util %", "GPU mem peak",
                    "CPU eff %", "mem eff %", "time eff %", "flags"]


def _job_list(rows):
    return table(JOB_LIST_HEADERS,
                 [[r["job"], r["name"], r["user"], r["state"], hms(r["elapsed_s"]), r["gpus"], r["gpu_util"],
                   f"{r['gpu_mem_peak_mb']:.0f} MiB" if r["gpu_mem_peak_mb"] is not None else None,
                   r["cpu_eff"], r["mem_eff"], r["time_eff"], ",".join(r["flags"]) or None] for r in rows])


def jobs_text(report):
    head = f"{len(report['rows'])} of {report['total']} jobs" + (f" of {report['user']}" if report["user"] else "")
    if not report["rows"]:
        return head
    return head + " (newest first)\n" + _job_list(report["rows"])


def array_text(array):
    states = ", ".join(f"{count} {state}" for state, count in array["states"].items())
    lines = [f"Array {array['array_job_id']}: {len(array['tasks'])} tasks ({states}), "
             f"{array['gpu_hours']:.3f} GPU-hours, CPU efficiency {_pct(array['cpu_eff'])}", "",
             _job_list(array["tasks"]), ""]
    flagged = {}
    for report in array["reports"]:
        for note in report["notes"]:
            flagged.setdefault(note["flag"], (note, []))[1].append(report["job_name"])
    if flagged:
        lines.append("Flags:")
        for flag, (note, tasks) in flagged.items():
            lines.append(f"  {flag} ({', '.join(tasks)}): {note['note']}")
            lines.append(f"    advice: {note['advice']}")
    else:
        lines.append("Flags: none")
    return "\n".join(lines)


def group_text(report):
    key = report["by"][:-1]
    return table([key, "jobs", "GPU-hours", "used GPU-hours", "mean util %", "saved GPU-hours", "shared jobs",
                  "hurt jobs"],
                 [[r[key], r["jobs"], r["gpu_hours"], r["used_gpu_hours"], r["mean_util"],
                   r["saved_gpu_hours"], r["shared_jobs"], r["hurt_jobs"]] for r in report["rows"]])


def cluster_text(report):
    lines = [f"GPU jobs {report['gpu_jobs']}, shared {report['shared_jobs']} "
             f"(sharing rate {_fmt(report['sharing_rate'])}), observations {report['observations']}",
             "States: " + ", ".join(f"{k} {v}" for k, v in sorted(report["states"].items())), ""]
    if report["timeline"]:
        lines.append(f"Utilization per {hms(report['bucket_s'])} (last 24 buckets):")
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


def _memory_axis(largest_mb):
    """(divide by, label) for a memory axis: GiB from 2 GiB up, else MiB."""
    return (1024.0, "GPU memory (GiB)") if largest_mb >= 2048 else (1.0, "GPU memory (MiB)")


def _plots(kind, report):
    if kind == "job":
        job = report["job"]
        end = job["end_time"] or time.time()
        plots = [svg.timeline_chart(
            [(f"{job['job_id']} (this job)", job["start_time"], end)]
            + [(f"{c['job_id']} {c['job_class'] or ''}", c["start_time"], c["end_time"] or time.time())
               for c in report["corunners"]],
            title="This job and its co-runners over time")]
        if report["gpus"]:
            gpus = report["gpus"]
            span = (job["start_time"], end) if job["start_time"] else None
            plots.append(svg.line_chart(
                [(f"{g['node']}:{g['gpu_index']}", [(p[0], p[1]) for p in g["series"]]) for g in gpus],
                title="SM utilization of this job per GPU", y_label="SM utilization (%)", x_kind="epoch",
                y_max=100, x_range=span))
            total = max([g["mem_total_mb"] or 0 for g in gpus])
            scale, label = _memory_axis(max([total] + [g["max_mem_mb"] or 0 for g in gpus]))
            gib = total / 1024
            plots.append(svg.line_chart(
                [(f"{g['node']}:{g['gpu_index']}", [(p[0], p[2]) for p in g["series"]]) for g in gpus],
                title="GPU memory of this job per GPU", y_label=label, x_kind="epoch", y_unit_scale=scale,
                x_range=span, ref_lines=[(total, f"the GPU's memory: {gib:.3g} GiB")] if total else ()))
        return plots
    if kind == "cluster":
        timeline = report["timeline"]
        return [
            svg.line_chart([("mean GPU utilization", [(t["t"], t["mean_gpu_util"]) for t in timeline]),
                            ("GPUs busy", [(t["t"], 100 * t["busy_fraction"]) for t in timeline])],
                           title=f"Cluster utilization over time ({report['bucket_s']} s buckets)",
                           y_label="%", x_kind="epoch", y_max=100),
            svg.bar_chart([(label, m[key]) for m in report["models"][-3:] if m["origin"] == "refit"
                           for label, key in ((f"#{m['id']} before", "error_before"),
                                              (f"#{m['id']} after", "error_after"))],
                          title="Model error (MAE of normalized throughput) before/after refits",
                          y_label="MAE"),
        ]
    if kind in ("jobs", "array"):
        rows = (report["rows"] if kind == "jobs" else report["tasks"])[:30]
        if not rows:
            return []
        return [svg.timeline_chart([(f"{r['job']} {r['name'] or ''}", r["start_time"],
                                     (r["start_time"] or 0) + (r["elapsed_s"] or 0)) for r in rows],
                                   title="When each job ran"),
                svg.bar_chart([(r["job"], r["gpu_util"]) for r in rows],
                              title="Mean GPU utilization per job (no bar: not sampled)", y_label="GPU utilization (%)")]
    key = report["by"][:-1]
    return [
        svg.bar_chart([(r[key], r["gpu_hours"]) for r in report["rows"][:20]],
                      title=f"GPU-hours allocated per {key}", y_label="GPU-hours"),
        svg.bar_chart([(r[key], r["mean_util"]) for r in report["rows"][:20]],
                      title=f"Mean GPU utilization per {key}", y_label="%"),
    ]


def html(kind, report, text):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    template = env.get_template("report.html.j2")
    return template.render(kind=kind, report=report, text=text, plots=_plots(kind, report),
                           generated=when(time.time()), hms=hms, pct=_pct)
