"""The one chart drawer of slurm-horus: small inline SVG line, bar and timeline charts, no plotting
library. The history reports (report/render.py) and the simulator's report (sim/report.py) both
draw with it.

What every chart does the same way:

* ticks at round values (1, 2, 2.5 or 5 times a power of ten) labelled with only the digits the step
  needs; a time axis (``x_kind="epoch"``) ticks at round clock times (every 10 s, 1 min, 15 min, 1 h,
  1 d...) labelled ``HH:MM`` or ``HH:MM:SS``, its date in the axis label;
* a left margin as wide as the widest tick label, so the rotated axis title never overlaps them;
* a legend to the right of the plot; series with identical points are drawn once and named together
  (``n1:0 = n1:1``), and later series are dashed, so a line lying on another stays visible;
* a point with no neighbour (a gap on both sides) is drawn as a dot, never lost.
"""

import math
import time
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
DASHES = ("", "6,3", "2,2", "8,3,2,3", "4,4")
CHAR_W = 6.6  # px per character at font-size 11 (sans-serif, generous)
FONT = 'font-family="sans-serif" font-size="11"'
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               172800, 604800)


def nice_step(span, count=5):
    """A round step (1, 2, 2.5 or 5 x 10^k) giving about ``count`` intervals over ``span``."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / count
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if mult * power >= raw * 0.999:
            return mult * power
    return 10 * power


def nice_ticks(lo, hi, count=5):
    """Round tick values covering [lo, hi] (first <= lo, last >= hi) and the step between them."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo, count)
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    k = 0
    while True:
        value = first + k * step
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        if value >= hi - step * 1e-9:
            break
        k += 1
    return ticks, step


def number_label(value, step, thousands=False):
    """``value`` with as many decimals as ``step`` needs (step 0.25 -> 2, 2.5 -> 1, 5 -> 0);
    ``thousands``: in k (12000 -> 12k)."""
    if thousands:
        value, step = value / 1000, step / 1000
    decimals = 0
    while decimals < 6 and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:
        decimals += 1
    text = f"{value:.{decimals}f}"
    text = "0" if float(text) == 0 else text
    return text + "k" if thousands and text != "0" else text


def axis_labels(ticks, step):
    """Labels of one axis, all in the same form (in k when the numbers reach 10,000)."""
    thousands = max(abs(t) for t in ticks) >= 10000 and step >= 1000
    return [number_label(t, step, thousands) for t in ticks]


def time_ticks(lo, hi, count=6):
    """Round clock times (epoch seconds) over [lo, hi], the step, and the label format."""
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= count), _TIME_STEPS[-1])
    offset = -time.localtime(lo).tm_gmtoff  # round in local time, as the labels are read
    first = math.ceil((lo - offset) / step) * step + offset
    ticks = []
    value = first
    while value <= hi + 1e-6:
        ticks.append(value)
        value += step
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    return ticks, step, fmt


def duration(seconds):
    """A readable length of time: ``45 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    seconds = float(seconds)
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _open(width, height, title, title_x):
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" {FONT}>']
    if title:
        out.append(f'<text x="{title_x}" y="15" font-size="13" font-weight="bold">{escape(title)}</text>')
    return out


def _empty(width, _height, title, why="no data"):
    """A chart without data: its title and one grey line saying so (no empty frame)."""
    out = _open(width, 40, title, 10)
    out.append(f'<text x="10" y="33" fill="#666">{escape(why)}</text></svg>')
    return "".join(out)


MIN_LEFT = 72  # charts stacked on one page keep their plot areas aligned


def _series_list(series):
    """[(label, [(x, y), ...])] from a list of pairs or a dict; identical series merged into one."""
    items = list(series.items()) if isinstance(series, dict) else list(series)
    merged = []
    for label, points in items:
        points = [(float(x), None if y is None else float(y)) for x, y in points if x is not None]
        for entry in merged:
            if entry[1] == points and points:
                entry[0].append(str(label))
                break
        else:
            merged.append(([str(label)], points))
    return [(" = ".join(labels), points) for labels, points in merged]


def line_chart(series, title="", x_label="", y_label="", x_kind="number", y_max=None, y_min=0.0,
               step=False, width=720, height=260, y_unit_scale=1.0, x_range=None, ref_lines=()):
    """Lines over a shared x axis. ``series``: [(label, [(x, y), ...])] or {label: points}; a None y
    breaks the line. ``x_kind="epoch"``: x are Unix times (clock-time ticks). ``step``: hold each
    value until the next point. ``y_max``: the axis reaches at least this (default: the data's top).
    Values are divided by ``y_unit_scale`` for the axis (e.g. 1024 for MiB -> GiB). ``x_range``:
    (first, last) x shown (default: the data's). ``ref_lines``: [(y, label)] drawn as thin grey
    lines across the plot (e.g. the GPU's memory), in the data's unit."""
    lines = _series_list(series)
    known = [(x, y / y_unit_scale) for _, pts in lines for x, y in pts if y is not None]
    if not known:
        return _empty(width, height, title)
    x_lo, x_hi = x_range if x_range else (min(p[0] for p in known), max(p[0] for p in known))
    if x_hi <= x_lo:
        x_hi = x_lo + (60.0 if x_kind == "epoch" else 1.0)
    refs = [(value / y_unit_scale, text) for value, text in ref_lines if value is not None]
    data_hi = max([p[1] for p in known] + [value for value, _ in refs])
    data_lo = min(p[1] for p in known)
    lo = min(y_min, data_lo) if y_min is not None else data_lo
    top = (y_max / y_unit_scale) if y_max is not None else data_hi
    y_ticks, y_step = nice_ticks(lo, max(top, data_hi), 4)
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    y_labels = axis_labels(y_ticks, y_step)

    legend_w = min(200, int(max(len(label) for label, _ in lines) * CHAR_W) + 34)
    left = max(MIN_LEFT, 22 + int(max(len(t) for t in y_labels) * CHAR_W) + 8)
    right, top_m, bottom = legend_w + 10, 26, 42
    pw, ph = width - left - right, height - top_m - bottom

    def sx(x):
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    pad = 4  # px between the lowest tick and the frame: a line at 0 stays visible above it

    def sy(y):
        return top_m + ph - pad - (min(max(y, y_lo), y_hi) - y_lo) / (y_hi - y_lo) * (ph - pad)

    out = _open(width, height, title, left)
    out.append(f'<rect x="{left}" y="{top_m}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    for value, text in refs:
        y = sy(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#888" '
                   f'stroke-dasharray="1,3"/><text x="{left + pw - 4}" y="{y - 4:.1f}" text-anchor="end" '
                   f'fill="#555">{escape(text)}</text>')
    for value, text in zip(y_ticks, y_labels):
        y = sy(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" fill="#333">{text}</text>')
    if x_kind == "epoch":
        x_ticks, _x_step, fmt = time_ticks(x_lo, x_hi)
        x_texts = [time.strftime(fmt, time.localtime(t)) for t in x_ticks]
        day = time.strftime("%Y-%m-%d", time.localtime(x_lo))
        x_label = f"{x_label or 'time'} ({day}, local time)"
    else:
        x_ticks, x_step = nice_ticks(x_lo, x_hi, 6)
        x_ticks = [t for t in x_ticks if x_lo - 1e-9 <= t <= x_hi + 1e-9]
        x_texts = axis_labels(x_ticks, x_step) if x_ticks else []
    min_gap = max(len(t) for t in x_texts) * CHAR_W + 6 if x_texts else 0
    last_x = -1e9
    for value, text in zip(x_ticks, x_texts):
        x = sx(value)
        if x < left - 0.5 or x > left + pw + 0.5 or x - last_x < min_gap or x + len(text) * CHAR_W / 2 > width:
            continue  # outside the plot, over its neighbour, or off the chart
        last_x = x
        out.append(f'<line x1="{x:.1f}" y1="{top_m + ph}" x2="{x:.1f}" y2="{top_m + ph + 4}" stroke="#666"/>'
                   f'<text x="{x:.1f}" y="{top_m + ph + 16}" text-anchor="middle" fill="#333">{escape(text)}</text>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" text-anchor="middle">{escape(x_label)}</text>')
    mid = top_m + ph / 2
    out.append(f'<text x="13" y="{mid:.0f}" text-anchor="middle" transform="rotate(-90 13 {mid:.0f})">'
               f'{escape(y_label)}</text>')
    for k, (label, pts) in enumerate(lines):
        color = PALETTE[k % len(PALETTE)]
        dash = DASHES[k % len(DASHES)]
        width_px = 2.5 if k == 0 else 1.6
        path, previous = [], None
        isolated = []
        for i, (x, y) in enumerate(pts):
            if y is None:
                previous = None
                continue
            y /= y_unit_scale
            before = i > 0 and pts[i - 1][1] is not None
            after = i + 1 < len(pts) and pts[i + 1][1] is not None
            if not before and not after:
                isolated.append((x, y))
            if previous is None:
                path.append(f"M{sx(x):.1f},{sy(y):.1f}")
            else:
                if step:
                    path.append(f"L{sx(x):.1f},{sy(previous):.1f}")
                path.append(f"L{sx(x):.1f},{sy(y):.1f}")
            previous = y
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        if any(part.startswith("L") for part in path):  # at least one segment (lone points: circles)
            out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="{width_px}"'
                       f'{dash_attr}><title>{escape(label)}</title></path>')
        out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in isolated)
        ly = top_m + 8 + 16 * k
        if ly > top_m + ph:
            continue  # more series than the legend has room for
        text = label if len(label) <= 28 else label[:27] + "…"
        out.append(f'<line x1="{left + pw + 10}" y1="{ly}" x2="{left + pw + 30}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2.5"{dash_attr}/><text x="{left + pw + 35}" y="{ly + 4}">{escape(text)}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(items, title="", y_label="", width=720, height=260):
    """Vertical bars, one per (label, value); None counts as no bar."""
    if not items:
        return _empty(width, height, title)
    values = [v for _, v in items if v is not None]
    ticks, tick_step = nice_ticks(0.0, max(values) if values and max(values) > 0 else 1.0, 4)
    top_value = ticks[-1]
    labels = axis_labels(ticks, tick_step)
    left = max(MIN_LEFT, 22 + int(max(len(t) for t in labels) * CHAR_W) + 8)
    top_m = 26
    slot = (width - left - 10) / len(items)
    bar_w = min(slot * 0.7, 80.0)
    max_chars = max(3, int(slot / CHAR_W) - 1)
    long_labels = any(len(str(label)) > max_chars for label, _ in items)
    bottom = 70 if long_labels else 36
    pw, ph = width - left - 10, height - top_m - bottom
    out = _open(width, height, title, left)
    for value, text in zip(ticks, labels):
        y = top_m + ph - value / top_value * ph
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" fill="#333">{text}</text>')
    mid = top_m + ph / 2
    out.append(f'<text x="13" y="{mid:.0f}" text-anchor="middle" transform="rotate(-90 13 {mid:.0f})">'
               f'{escape(y_label)}</text>')
    for number, (label, value) in enumerate(items):
        label = str(label)
        center = left + (number + 0.5) * slot
        x = center - bar_w / 2
        if value is not None:
            h = value / top_value * ph
            out.append(f'<rect x="{x:.1f}" y="{top_m + ph - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[0]}"><title>{escape(label)}: {value:.3g}</title></rect>')
            out.append(f'<text x="{center:.1f}" y="{top_m + ph - h - 4:.1f}" text-anchor="middle" fill="#333">'
                       f'{value:.3g}</text>')
        shown = label if len(label) <= 18 else label[:17] + "…"
        if long_labels:  # slanted, so long names do not run into each other
            out.append(f'<text x="{center:.1f}" y="{top_m + ph + 12}" text-anchor="end" '
                       f'transform="rotate(-35 {center:.1f} {top_m + ph + 12})">{escape(shown)}</text>')
        else:
            out.append(f'<text x="{center:.1f}" y="{top_m + ph + 16}" text-anchor="middle">{escape(shown)}</text>')
    out.append(f'<line x1="{left}" y1="{top_m + ph}" x2="{left + pw}" y2="{top_m + ph}" stroke="#888"/>')
    out.append("</svg>")
    return "".join(out)


def timeline_chart(rows, title="", width=720):
    """One horizontal bar per (label, start, end) on a shared clock-time axis (a Gantt chart)."""
    rows = [r for r in rows if r[1] is not None and r[2] is not None]
    if not rows:
        return _empty(width, 80, title)
    left = min(220, 16 + int(max(len(str(r[0])) for r in rows) * CHAR_W))
    right, top_m, row_h = 32, 26, 22  # room for half a clock-time label at the end of the axis
    height = top_m + row_h * len(rows) + 40
    t0, t1 = min(r[1] for r in rows), max(r[2] for r in rows)
    if t1 <= t0:
        t1 = t0 + 60
    pw = width - left - right

    def sx(t):
        return left + (t - t0) / (t1 - t0) * pw

    out = _open(width, height, title, left)
    bottom_y = top_m + row_h * len(rows)
    ticks, _step, fmt = time_ticks(t0, t1)
    texts = [time.strftime(fmt, time.localtime(t)) for t in ticks]
    min_gap = max(len(t) for t in texts) * CHAR_W + 6 if texts else 0
    last_x = -1e9
    for value, text in zip(ticks, texts):
        x = sx(value)
        if x - last_x < min_gap or x + len(text) * CHAR_W / 2 > width or x - len(text) * CHAR_W / 2 < 0:
            continue  # it would overlap its neighbour or run off the chart
        last_x = x
        out.append(f'<line x1="{x:.1f}" y1="{top_m}" x2="{x:.1f}" y2="{bottom_y + 4}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{bottom_y + 16}" text-anchor="middle" fill="#333">{text}</text>')
    for number, (label, start, end) in enumerate(rows):
        y = top_m + number * row_h
        w = max(2.0, sx(end) - sx(start))
        shown = str(label) if len(str(label)) <= 32 else str(label)[:31] + "…"
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(shown)}</text>')
        out.append(f'<rect x="{sx(start):.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                   f'fill="{PALETTE[number % len(PALETTE)]}"><title>{escape(str(label))}: '
                   f'{duration(end - start)}</title></rect>')
    day = time.strftime("%Y-%m-%d", time.localtime(t0))
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" text-anchor="middle">'
               f'time ({day}, local time)</text>')
    out.append("</svg>")
    return "".join(out)
