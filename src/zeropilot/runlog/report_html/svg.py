"""A small SVG line chart: axes, polylines, horizontal reference lines, spans and markers.

Drawn by hand rather than with an inlined plotting library: the page must open with no network and
no script (its Content-Security-Policy forbids scripts, so nothing from a run directory can run),
and static SVG of a few thousand points per series is smaller than any library that would draw it.
Every text that goes into the markup passes through :func:`esc`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

Point = Tuple[float, float]
PAD_L, PAD_R, PAD_T, PAD_B = 64.0, 12.0, 10.0, 26.0
LABEL_GAP = 12.0  # font-size 10px labels: one line apart


def esc(value: object) -> str:
    """Text or attribute value, escaped for HTML (quotes included)."""
    return html.escape(str(value), quote=True)


def nice_ticks(lo: float, hi: float, n: int = 5) -> List[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


@dataclass
class Chart:
    """One chart: data ranges mapped onto a ``width`` x ``height`` viewBox."""

    chart_id: str
    width: float
    height: float
    x_range: Tuple[float, float]
    y_range: Tuple[float, float]
    x_label: Callable[[float], str] = str
    y_label: Callable[[float], str] = str
    title: str = ""
    parts: List[str] = field(default_factory=list)
    labels: List[Tuple[float, str, str]] = field(default_factory=list)  # (wanted y, text, class), placed at the end

    def px(self, x: float) -> float:
        x0, x1 = self.x_range
        span = (x1 - x0) or 1.0
        return PAD_L + (x - x0) / span * (self.width - PAD_L - PAD_R)

    def py(self, y: float) -> float:
        y0, y1 = self.y_range
        span = (y1 - y0) or 1.0
        return self.height - PAD_B - (y - y0) / span * (self.height - PAD_T - PAD_B)

    def axes(self, y_ticks: Optional[Sequence[float]] = None, x_ticks: Optional[Sequence[float]] = None) -> None:
        """Grid lines with labels on both axes."""
        for y in y_ticks if y_ticks is not None else nice_ticks(*self.y_range):
            yy = self.py(y)
            self.parts.append(f'<line class="grid" x1="{PAD_L}" x2="{self.width - PAD_R}" y1="{yy:.1f}" '
                              f'y2="{yy:.1f}"/><text class="tick" x="{PAD_L - 4}" y="{yy + 3:.1f}" '
                              f'text-anchor="end">{esc(self.y_label(y))}</text>')
        for x in x_ticks if x_ticks is not None else nice_ticks(*self.x_range, n=8):
            xx = self.px(x)
            self.parts.append(f'<line class="grid" x1="{xx:.1f}" x2="{xx:.1f}" y1="{PAD_T}" '
                              f'y2="{self.height - PAD_B}"/><text class="tick" x="{xx:.1f}" '
                              f'y="{self.height - PAD_B + 14}" text-anchor="middle">{esc(self.x_label(x))}</text>')

    def line(self, points: Iterable[Point], cls: str, attrs: str = "", title: str = "") -> None:
        """A polyline (one series); ``attrs`` is markup this module's callers built, never raw input."""
        points = list(points)
        pts = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in points)
        if not pts:
            return
        tip = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(f'<polyline class="{cls}" {attrs} points="{pts}">{tip}</polyline>')
        if len(points) < 3:  # too short to see as a line: dots too
            self.parts.extend(f'<circle class="pt {cls}" cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="2.5"/>'
                              for x, y in points)

    def hline(self, y: float, cls: str, label: str) -> None:
        """A horizontal reference line (capacity, plan) with its label at the right (placed by :meth:`svg`)."""
        yy = self.py(y)
        self.parts.append(f'<line class="{cls}" x1="{PAD_L}" x2="{self.width - PAD_R}" y1="{yy:.1f}" y2="{yy:.1f}">'
                          f'<title>{esc(label)}</title></line>')
        self.labels.append((yy - 3, label, cls))

    def note(self, text: str) -> None:
        """A line of text at the top right of the plot."""
        self.labels.append((PAD_T + 10, text, "cap"))

    def _placed_labels(self) -> List[str]:
        """The right-hand labels, moved apart so that no two overlap: they share their right edge, so at least
        :data:`LABEL_GAP` pixels apart vertically, inside the plot."""
        top, bottom = PAD_T + 9, self.height - PAD_B - 2
        order = sorted(self.labels, key=lambda x: x[0])
        ys: List[float] = []
        for want, _, _ in order:
            ys.append(max(min(max(want, top), bottom), ys[-1] + LABEL_GAP if ys else top))
        for i in range(len(ys) - 1, -1, -1):  # pushed past the bottom: shift up again
            limit = bottom if i == len(ys) - 1 else ys[i + 1] - LABEL_GAP
            ys[i] = min(ys[i], limit)
        return [f'<text class="ref {cls}" x="{self.width - PAD_R - 4}" y="{y:.1f}" text-anchor="end">{esc(text)}</text>'
                for y, (_, text, cls) in zip(ys, order)]

    def span(self, x0: float, x1: float, cls: str, title: str, attrs: str = "") -> None:
        """A shaded vertical band from ``x0`` to ``x1`` (a save, a load, one of their phases)."""
        a, b = self.px(x0), self.px(x1)
        w = max(b - a, 1.5)
        self.parts.append(f'<rect class="{cls}" {attrs} x="{a:.1f}" y="{PAD_T}" width="{w:.1f}" '
                          f'height="{self.height - PAD_T - PAD_B:.1f}"><title>{esc(title)}</title></rect>')

    def vline(self, x: float, cls: str, title: str) -> None:
        xx = self.px(x)
        self.parts.append(f'<line class="{cls}" x1="{xx:.1f}" x2="{xx:.1f}" y1="{PAD_T}" '
                          f'y2="{self.height - PAD_B}"><title>{esc(title)}</title></line>')

    def marker(self, x: float, y: float, cls: str, title: str) -> None:
        self.parts.append(f'<circle class="{cls}" cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="3.5">'
                          f'<title>{esc(title)}</title></circle>')

    def svg(self) -> str:
        """The chart as an inline ``<svg>`` element."""
        return (f'<svg id="{esc(self.chart_id)}" class="chart" viewBox="0 0 {self.width:.0f} {self.height:.0f}" '
                f'role="img" aria-label="{esc(self.title)}">{"".join(self.parts + self._placed_labels())}</svg>')
