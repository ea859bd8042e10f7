"""Tiny SVG line charts (no plotting library): axes, ticks, one polyline per series, a legend."""

from html import escape
from typing import Dict, List, Sequence, Tuple

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def _ticks(lo: float, hi: float, n: int = 5) -> List[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    magnitude = 10 ** len(str(int(step))) / 10 if step >= 1 else 10 ** -len(f"{step:.10f}".split(".")[1].lstrip("0"))
    for mult in (1, 2, 2.5, 5, 10):
        if magnitude * mult >= step:
            step = magnitude * mult
            break
    first = (lo // step) * step
    ticks = []
    t = first
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            ticks.append(t)
        t += step
    return ticks


def _label(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def line_chart(series: Dict[str, Sequence[Tuple[float, float]]], title: str, x_label: str, y_label: str,
               width: int = 640, height: int = 320, step: bool = False) -> str:
    """An inline ``<svg>`` with one line per named series of (x, y) points."""
    left, right, top, bottom = 60, 150, 30, 45
    points = [p for pts in series.values() for p in pts]
    if not points:
        return f"<svg width='{width}' height='{height}'><text x='10' y='20'>{escape(title)}: no data</text></svg>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    pw, ph = width - left - right, height - top - bottom

    def sx(x):
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' "
           f"font-size='11'>", f"<text x='{left}' y='18' font-size='13' font-weight='bold'>{escape(title)}</text>",
           f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#999'/>"]
    for t in _ticks(x0, x1):
        out.append(f"<line x1='{sx(t):.1f}' y1='{top + ph}' x2='{sx(t):.1f}' y2='{top + ph + 4}' stroke='#666'/>"
                   f"<text x='{sx(t):.1f}' y='{top + ph + 16}' text-anchor='middle'>{_label(t)}</text>")
    for t in _ticks(y0, y1):
        out.append(f"<line x1='{left}' y1='{sy(t):.1f}' x2='{left + pw}' y2='{sy(t):.1f}' stroke='#eee'/>"
                   f"<text x='{left - 5}' y='{sy(t) + 4:.1f}' text-anchor='end'>{_label(t)}</text>")
    out.append(f"<text x='{left + pw / 2}' y='{height - 8}' text-anchor='middle'>{escape(x_label)}</text>")
    out.append(f"<text x='14' y='{top + ph / 2}' text-anchor='middle' transform='rotate(-90 14 {top + ph / 2})'>"
               f"{escape(y_label)}</text>")
    for k, (name, pts) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        coords = []
        prev_y = None
        for x, y in pts:
            if step and prev_y is not None:
                coords.append(f"{sx(x):.1f},{sy(prev_y):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
            prev_y = y
        out.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{' '.join(coords)}'/>")
        ly = top + 14 * k + 8
        out.append(f"<line x1='{left + pw + 10}' y1='{ly}' x2='{left + pw + 28}' y2='{ly}' stroke='{color}' "
                   f"stroke-width='2'/><text x='{left + pw + 32}' y='{ly + 4}'>{escape(name)}</text>")
    out.append("</svg>")
    return "".join(out)
