"""Charts as inline SVG strings: axes with round ticks, lines, CDF steps, dots and bars. Pure, no JavaScript.

Every chart is `<svg class="chart" data-chart=NAME>` and every series a `<g class="series" data-series=NAME
data-n=POINTS>` holding its marks, so a reader (or a test in a browser) can tell what was drawn from what.
Series with more points than a chart has pixels are thinned evenly (the data-n attribute keeps the true
count; `data-drawn` says how many marks were drawn).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

W, H = 560, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 42, 44
MAX_MARKS = 1500
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    mode: str = "line"  # line | step (a CDF: it rises from 0) | dots | rings | bars
    color: str | None = None
    dashed: bool = False


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values from at or below `lo` to at or above `hi` (steps of 1, 2 or 5 times a power of 10)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _thin(points: Sequence[tuple[float, float]]) -> Sequence[tuple[float, float]]:
    if len(points) <= MAX_MARKS:
        return points
    step = len(points) / MAX_MARKS
    return [points[int(i * step)] for i in range(MAX_MARKS)] + [points[-1]]


def _spacing(points: Sequence[tuple[float, float]]) -> float:
    """The smallest gap between distinct x values (1 for a single point)."""
    xs = sorted({x for x, _ in points})
    return min((b - a for a, b in itertools.pairwise(xs)), default=1.0)


class _Frame:
    def __init__(self, xs: Sequence[float], ys: Sequence[float], y_from_zero: bool) -> None:
        self.xt = nice_ticks(min(xs), max(xs))
        lo = 0.0 if y_from_zero else min(ys)
        self.yt = nice_ticks(min(lo, min(ys)), max(ys))
        self.x0, self.x1 = self.xt[0], self.xt[-1]
        self.y0, self.y1 = self.yt[0], self.yt[-1]

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / ((self.x1 - self.x0) or 1) * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return H - BOTTOM - (y - self.y0) / ((self.y1 - self.y0) or 1) * (H - TOP - BOTTOM)

    def axes(self, xlabel: str, ylabel: str) -> list[str]:
        out = ['<g class="axes" stroke="#999" font-size="11" fill="#333">']
        for x in self.xt:
            X = self.px(x)
            out.append(f'<line x1="{X:.1f}" y1="{TOP}" x2="{X:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>')
            out.append(
                f'<text x="{X:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle" stroke="none">{_fmt(x)}</text>'
            )
        for y in self.yt:
            Y = self.py(y)
            out.append(f'<line x1="{LEFT}" y1="{Y:.1f}" x2="{W - RIGHT}" y2="{Y:.1f}" stroke="#eee"/>')
            out.append(
                f'<text x="{LEFT - 6}" y="{Y + 4:.1f}" text-anchor="end" stroke="none">{_fmt(y)}</text>'
            )
        out.append(
            f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none"/>'
        )
        out.append(
            f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle" stroke="none">{escape(xlabel)}</text>'
        )
        out.append(f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" stroke="none" '
                   f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{escape(ylabel)}</text>')  # fmt: skip
        out.append("</g>")
        return out

    def marks(self, s: Series, color: str) -> str:
        pts = _thin(s.points)
        if s.mode == "bars":
            pts = [(x, y) for x, y in pts if y]  # a bar of height 0 is not drawn
        head = (f'<g class="series" data-series="{escape(s.name)}" data-n="{len(s.points)}" '
                f'data-drawn="{len(pts)}" fill="{color}" stroke="{color}">')  # fmt: skip
        if s.mode in ("dots", "rings"):
            look = ' r="2.5"' if s.mode == "dots" else ' r="4.5" fill="none" stroke-width="1.2"'
            body = "".join(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}"{look}/>' for x, y in pts)
        elif s.mode == "bars":
            width = max((self.px(self.x0 + _spacing(s.points)) - LEFT) * 0.8, 1.0)
            base = self.py(max(self.y0, 0.0))
            body = "".join(
                f'<rect x="{self.px(x) - width / 2:.1f}" y="{min(self.py(y), base):.1f}" width="{width:.1f}" '
                f'height="{abs(base - self.py(y)):.1f}"><title>{_fmt(x)}: {_fmt(y)}</title></rect>'
                for x, y in pts
            )
        else:
            coords = [f"{self.px(pts[0][0]):.1f},{self.py(0.0):.1f}"] if s.mode == "step" else []
            for i, (x, y) in enumerate(pts):
                if s.mode == "step" and i:
                    coords.append(f"{self.px(x):.1f},{self.py(pts[i - 1][1]):.1f}")
                coords.append(f"{self.px(x):.1f},{self.py(y):.1f}")
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            body = f'<polyline fill="none" stroke-width="1.8"{dash} points="{" ".join(coords)}"/>'
        return head + body + "</g>"


def chart(
    name: str, title: str, xlabel: str, ylabel: str, series: Sequence[Series], y_from_zero: bool = True
) -> str:
    """One chart; a chart without any point says so instead of drawing empty axes."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return f'<p class="empty" data-chart="{escape(name)}">{escape(title)}: no data</p>'
    xs = [x for s in drawn for x, _ in s.points]
    for s in drawn:  # room for half a bar beyond the first and the last
        if s.mode == "bars":
            half = _spacing(s.points) / 2
            xs += [min(x for x, _ in s.points) - half, max(x for x, _ in s.points) + half]
    ys = [y for s in drawn for _, y in s.points]
    f = _Frame(xs, ys, y_from_zero)
    parts = [
        f'<svg class="chart" data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
        *f.axes(xlabel, ylabel),
    ]
    legend_x = float(W - RIGHT)  # legend entries right to left on the line above the plot
    for i, s in enumerate(drawn):
        color = s.color or PALETTE[i % len(PALETTE)]
        parts.append(f.marks(s, color))
    for i, s in reversed(list(enumerate(drawn))):
        color = s.color or PALETTE[i % len(PALETTE)]
        parts.append(f'<text x="{legend_x:.0f}" y="{TOP - 8}" font-size="11" text-anchor="end" '
                     f'fill="{color}">{escape(s.name)}</text>')  # fmt: skip
        legend_x -= 6.5 * len(s.name) + 14
    parts.append("</svg>")
    return "".join(parts)


def cdf_points(values: Sequence[float]) -> list[tuple[float, float]]:
    """(value, share of values <= it) for each sorted value: the empirical CDF's steps."""
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    n = len(vals)
    return [(v, (i + 1) / n) for i, v in enumerate(vals)]


def bar_chart(name: str, title: str, items: Sequence[tuple[str, float | None]], unit: str, top: float) -> str:
    """Horizontal bars, one per labelled value on a 0..top scale (a missing value is drawn as "-")."""
    row, label_w, value_w = 26, 130, 70
    height = TOP + row * len(items) + 12
    span = W - label_w - value_w - RIGHT
    parts = [
        f'<svg class="chart" data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
        f'<g class="series" data-series="{escape(name)}" data-n="{len(items)}" data-drawn="{len(items)}">',
    ]
    for i, (label, value) in enumerate(items):
        y = TOP + row * i
        width = 0.0 if value is None else max(value, 0.0) / (top or 1) * span
        text = "-" if value is None else f"{value:.2f}{unit}"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" font-size="12" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 4}" width="{width:.1f}" height="16" fill="{PALETTE[i % len(PALETTE)]}">'
            f"<title>{escape(label)}: {escape(text)}</title></rect>"
            f'<text x="{label_w + width + 6:.1f}" y="{y + 16}" font-size="12">{escape(text)}</text>'
        )
    parts.append("</g></svg>")
    return "".join(parts)
