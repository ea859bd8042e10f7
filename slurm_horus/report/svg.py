"""A tiny SVG line/step chart (no plotting library): enough for utilization-over-time plots."""

from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def line_chart(series, width=640, height=220, y_max=None, y_label="", x_is_time=True, title=""):
    """``series``: [(label, [(x, y), ...])]; None y values break the line. Returns an <svg> string."""
    left, right, top, bottom = 48, 12, 40, 30
    points = [(x, y) for _, pts in series for x, y in pts if y is not None]
    if not points:
        return _empty(width, height, title)
    x_min = min(p[0] for p in points)
    x_max = max(p[0] for p in points)
    top_value = y_max if y_max is not None else max(p[1] for p in points) or 1.0
    span_x = (x_max - x_min) or 1.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x):
        return left + (x - x_min) / span_x * plot_w

    def sy(y):
        return top + plot_h - min(y, top_value) / top_value * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>')
    for fraction in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h - fraction * plot_h
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#444">'
                   f'{fraction * top_value:.0f}</text>')
    out.append(f'<text x="12" y="{top + plot_h / 2:.0f}" transform="rotate(-90 12 {top + plot_h / 2:.0f})" '
               f'text-anchor="middle" fill="#444">{escape(y_label)}</text>')
    span_label = _duration(x_max - x_min) if x_is_time else f"{x_max - x_min:g}"
    out.append(f'<text x="{left}" y="{height - 8}" fill="#444">0</text>')
    out.append(f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end" fill="#444">+{span_label}</text>')
    for number, (label, pts) in enumerate(series):
        color = PALETTE[number % len(PALETTE)]
        path, pen_down = [], False
        for x, y in pts:
            if y is None:
                pen_down = False
                continue
            path.append(f'{"L" if pen_down else "M"}{sx(x):.1f},{sy(y):.1f}')
            pen_down = True
        if path:
            out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        known = [(x, y) for x, y in pts if y is not None]
        if len(known) <= 40:  # few points: mark them (a single point has no line at all)
            out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in known)
        legend_x = left + number * 120  # legend row between the title and the plot
        out.append(f'<rect x="{legend_x}" y="20" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{legend_x + 14}" y="29">{escape(str(label))}</text>')
    out.append("</svg>")
    return "".join(out)


def _empty(width, height, title):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'font-family="sans-serif" font-size="11"><text x="48" y="14" font-weight="bold">{escape(title)}</text>'
            f'<text x="{width // 2}" y="{height // 2}" text-anchor="middle" fill="#666">no data</text></svg>')


def bar_chart(items, width=640, height=220, title="", y_label=""):
    """``items``: [(label, value)] -> vertical bars."""
    if not items:
        return _empty(width, height, title)
    left, top, bottom = 48, 36, 40
    values = [v for _, v in items if v is not None]
    top_value = max(values) if values else 1.0
    top_value = top_value or 1.0
    plot_w, plot_h = width - left - 12, height - top - bottom
    slot = plot_w / max(1, len(items))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>')
    out.append(f'<text x="12" y="{top + plot_h / 2:.0f}" transform="rotate(-90 12 {top + plot_h / 2:.0f})" '
               f'text-anchor="middle" fill="#444">{escape(y_label)}</text>')
    for number, (label, value) in enumerate(items):
        value = value or 0.0
        h = value / top_value * plot_h
        x = left + number * slot + slot * 0.15
        out.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                   f'fill="{PALETTE[0]}"><title>{escape(str(label))}: {value:.3g}</title></rect>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{height - bottom + 14}" text-anchor="middle">'
                   f'{escape(str(label))[:12]}</text>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{top + plot_h - h - 3:.1f}" text-anchor="middle" '
                   f'fill="#444">{value:.3g}</text>')
    out.append("</svg>")
    return "".join(out)


def timeline_chart(rows, width=640, title=""):
    """``rows``: [(label, start, end)] -> one horizontal bar per row on a shared time axis (Gantt)."""
    rows = [r for r in rows if r[1] is not None and r[2] is not None]
    if not rows:
        return _empty(width, 80, title)
    left, right, top, row_h = 110, 12, 24, 22
    height = top + row_h * len(rows) + 24
    t0 = min(r[1] for r in rows)
    span = (max(r[2] for r in rows) - t0) or 1
    plot_w = width - left - right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>')
    for number, (label, start, end) in enumerate(rows):
        y = top + number * row_h
        x = left + (start - t0) / span * plot_w
        w = max(1.0, (end - start) / span * plot_w)
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(str(label))}</text>')
        out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                   f'fill="{PALETTE[number % len(PALETTE)]}"><title>{escape(str(label))}: '
                   f'{_duration(end - start)}</title></rect>')
    out.append(f'<text x="{left}" y="{height - 6}" fill="#444">0</text>')
    out.append(f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end" fill="#444">+{_duration(span)}</text>')
    out.append("</svg>")
    return "".join(out)


def _duration(seconds):
    seconds = int(seconds)
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds} s"
