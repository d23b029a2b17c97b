"""Inline SVG charts rendered on the server: no JavaScript, no chart library, no CDN.

The dashboard's pages embed these ``<svg>`` strings directly. Every text is escaped;
the look lives in the dashboard's stylesheet, through these CSS classes (presentation
attributes such as ``fill="none"`` are only fallbacks a stylesheet overrides):

``chart``
    the ``<svg>`` of :func:`line_chart`.
``chart-grid`` / ``chart-axis``
    horizontal gridlines / the baseline and the plot frame.
``chart-tick`` / ``chart-tick-y`` / ``chart-tick-x``
    tick labels (every one has ``chart-tick``, plus its axis).
``chart-line`` with ``line-N``
    one ``<polyline>`` per unbroken run of values of line ``N`` (a ``None`` breaks it).
``chart-dot`` with ``line-N``
    a ``<circle>`` for a run of a single value (a polyline of one point is invisible).
``chart-legend`` / ``chart-legend-item`` / ``chart-swatch`` with ``line-N`` /
``chart-legend-text``
    the legend below the plot: a swatch, the name and the latest value per line.
``chart-nodata``
    the "no data" text of a chart without a single value.
``chart-mark`` / ``chart-mark-label``
    a reference line (``marks``) and its label.
``bar``
    the ``<svg>`` of :func:`bar`.
``bar-label`` / ``bar-value``
    its label (left) and numbers (right), above the bar.
``bar-track``
    the whole bar's background.
``bar-fill`` with ``level-ok`` (< 80%), ``level-warn`` (< 95%) or ``level-crit``
    the used part.
``bar-unknown`` / ``bar-hatch``
    a bar whose numbers are unknown: its background and its diagonal hatching, so it
    never looks like an empty (0) bar.

Line ``N`` defaults to the line's position in the chart; give :class:`Line` an
``index`` to keep a colour per meaning (p50 always ``line-0``...).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import attrs

__all__ = ["Line", "bar", "fmt", "line_chart", "time_labels"]


def _values(values: Sequence[float | None]) -> tuple[float | None, ...]:
    """The values as a tuple, NaN and infinities as gaps (they cannot be plotted)."""
    return tuple(v if v is not None and math.isfinite(v) else None for v in values)


@attrs.frozen
class Line:
    """One line of a chart: ``None`` values are gaps, not zeros."""

    name: str
    values: tuple[float | None, ...] = attrs.field(converter=_values)
    index: int | None = None  # the ``line-N`` class; None: the position in the chart


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((1024.0**4, "TiB"), (1024.0**3, "GiB"), (1024.0**2, "MiB"), (1024.0, "KiB"))


def _num(value: float) -> str:
    """Three significant digits, without an exponent or trailing zeros where possible."""
    return f"{value:.3g}"


# Largest first: (unit, its seconds, the next smaller unit, its seconds).
_DURATION_UNITS = (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1))


def duration(seconds: float) -> str:
    """A span of a second or more as people say it: ``46s``, ``1m 46s``, ``2h 5m``,
    ``3d 4h`` (the two largest units, truncated: 1m 46.9s has not yet been 1m 47s; a
    zero second unit is left out: ``2h``)."""
    whole = int(seconds)
    for unit, size, sub, sub_size in _DURATION_UNITS:
        if whole >= size:
            big, rest = divmod(whole, size)
            small = rest // sub_size
            return f"{big}{unit} {small}{sub}" if small else f"{big}{unit}"
    return f"{whole}s"


def fmt(value: float | None, unit: str = "") -> str:
    """A number for people, with its unit.

    ``"s"``: seconds as ``µs``/``ms``/``s`` (0.25 -> ``250ms``), from a minute on as a
    :func:`duration` (106.2 -> ``1m 46s``); ``"%"``: a
    fraction as a percentage (0.42 -> ``42%``); ``"B"``: bytes in binary units
    (``80GiB``); anything else: SI prefixes and the unit after a space (``1.5k tok/s``).
    None (unknown) is an en dash.
    """
    if value is None or not math.isfinite(value):
        return "\u2013"
    if value < 0:
        return "-" + fmt(-value, unit)
    if unit == "s" and value >= 60:
        return duration(value)  # "1m 46s", not "1.77m"
    # Round first, so 999.7 is "1k" rather than "1e+03".
    value = float(f"{value:.3g}")
    if value == 0:
        return f"0{unit}" if unit in ("", "s", "%", "B") else f"0 {unit}"
    if unit == "s":
        if value < 1e-3:
            return f"{_num(value * 1e6)}µs"
        if value < 1:
            return f"{_num(value * 1e3)}ms"
        if value < 60:
            return f"{_num(value)}s"
        if value < 3600:
            return f"{_num(value / 60)}m"
        return f"{_num(value / 3600)}h"
    if unit == "%":
        return f"{_num(value * 100)}%"
    if unit == "B":
        for size, suffix in _BINARY:
            if value >= size:
                return f"{_num(value / size)}{suffix}"
        return f"{_num(value)}B"
    text = _num(value)
    for size, prefix in _SI:
        if value >= size:
            text = f"{_num(value / size)}{prefix}"
            break
    return f"{text} {unit}" if unit else text


def time_labels(window: float = 900.0, ticks: int = 3) -> tuple[str, ...]:
    """Evenly spaced x labels for a chart of the last ``window`` seconds:
    ``("-15m", "-10m", "-5m", "now")`` for the defaults."""
    if ticks < 1:
        raise ValueError(f"ticks must be at least 1, got {ticks}")
    return (*(f"-{fmt(window * (ticks - k) / ticks, 's')}" for k in range(ticks)), "now")


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _c(v: float) -> str:
    """A coordinate: one decimal is plenty at screen resolution, and keeps pages small."""
    return f"{v:.1f}".removesuffix(".0")


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at least ``raw``."""
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * mag >= raw * (1 - 1e-9):
            return m * mag
    return 10.0 * mag  # pragma: no cover - the loop always returns


def _scale(top: float | None, data_max: float, ticks: int) -> tuple[float, list[float]]:
    """The y axis top and its tick values (from 0), nicely rounded unless ``top`` is
    given."""
    if top is None or not top > 0:
        if data_max <= 0:
            data_max = 1.0
        step = _nice_step(data_max / ticks)
        top = math.ceil(data_max / step * (1 - 1e-9)) * step
    else:
        step = _nice_step(top / ticks)
    n = max(1, math.floor(top / step * (1 + 1e-9)))
    return top, [round(k * step, 12) for k in range(n + 1)]


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The unbroken runs of values, with their positions."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if current:
                runs.append(current)
                current = []
        else:
            current.append((i, v))
    if current:
        runs.append(current)
    return runs


def line_chart(
    series: Sequence[Line],
    *,
    unit: str,
    width: int = 600,
    height: int = 180,
    y_max: float | None = None,
    x_labels: Sequence[str] = ("-15m", "-10m", "-5m", "now"),
    title: str | None = None,
    ticks: int = 4,
    marks: Sequence[tuple[str, float]] = (),
) -> str:
    """An ``<svg>`` line chart of ``series`` over shared, evenly spaced x positions (the
    longest line sets how many; put the latest value last). ``y_max`` fixes the top of
    the y axis (1.0 for a ratio); otherwise it is the data's maximum rounded up to a
    nice tick. The y axis starts at 0 (values below are drawn at 0). ``x_labels`` are
    spread evenly from the left edge to the right one. ``title`` (default: the line
    names and the unit) is the accessible name. ``marks`` are labelled horizontal
    reference lines (a band's saturation ceiling, say), drawn when inside the axis."""
    lines = list(series)
    names = ", ".join(line.name for line in lines)
    label = title if title is not None else f"{names} ({unit})" if unit else names
    legend_h = 18 if lines else 0
    x0, x1 = 52.0, float(width) - 8.0
    y0, y1 = 8.0, float(height) - 20.0 - legend_h
    n = max((len(line.values) for line in lines), default=0)
    present = [v for line in lines for v in line.values if v is not None]

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img"'
        f' aria-label="{_esc(label)}" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" font-size="11">',
        f"<title>{_esc(label)}</title>",
    ]
    if present:
        top, tick_values = _scale(y_max, max(present), ticks)
        for t in tick_values:
            y = y1 - (t / top) * (y1 - y0)
            out.append(
                f'<line class="chart-grid" x1="{_c(x0)}" x2="{_c(x1)}" y1="{_c(y)}"'
                f' y2="{_c(y)}" stroke="currentColor" stroke-opacity="0.15"/>'
            )
            out.append(
                f'<text class="chart-tick chart-tick-y" x="{_c(x0 - 4)}" y="{_c(y + 4)}"'
                f' text-anchor="end">{_esc(fmt(t, unit))}</text>'
            )
    out.append(
        f'<rect class="chart-axis" x="{_c(x0)}" y="{_c(y0)}" width="{_c(x1 - x0)}"'
        f' height="{_c(y1 - y0)}" fill="none" stroke="currentColor" stroke-opacity="0.3"/>'
    )
    for k, text in enumerate(x_labels):
        count = len(x_labels)
        x = x0 + (x1 - x0) * (k / (count - 1) if count > 1 else 1.0)
        anchor = "start" if k == 0 and count > 1 else "end" if k == count - 1 else "middle"
        out.append(
            f'<text class="chart-tick chart-tick-x" x="{_c(x)}" y="{_c(y1 + 14)}"'
            f' text-anchor="{anchor}">{_esc(text)}</text>'
        )
    top_mark = (
        y_max if y_max is not None else (_scale(None, max(present), ticks)[0] if present else None)
    )
    for name, value in marks:
        if top_mark is None or not 0 <= value <= top_mark:
            continue
        y = y1 - (value / top_mark) * (y1 - y0)
        out.append(
            f'<line class="chart-mark" x1="{_c(x0)}" x2="{_c(x1)}" y1="{_c(y)}" y2="{_c(y)}"'
            f' stroke="currentColor" stroke-opacity="0.5" stroke-dasharray="4 3"/>'
            f'<text class="chart-mark-label" x="{_c(x0 + 3)}" y="{_c(y - 3)}">'
            f"{_esc(name)}</text>"
        )
    if not present:
        out.append(
            f'<text class="chart-nodata" x="{_c((x0 + x1) / 2)}" y="{_c((y0 + y1) / 2 + 4)}"'
            f' text-anchor="middle">no data</text>'
        )
    else:

        def xy(i: int, v: float) -> tuple[float, float]:
            x = x1 if n == 1 else x0 + (x1 - x0) * i / (n - 1)
            # Right-align a line shorter than the longest: its values are the latest.
            return x, y1 - (min(max(v, 0.0), top) / top) * (y1 - y0)

        for pos, line in enumerate(lines):
            cls = f"line-{line.index if line.index is not None else pos}"
            shift = n - len(line.values)
            for run in _runs(line.values):
                if len(run) == 1:
                    x, y = xy(run[0][0] + shift, run[0][1])
                    out.append(f'<circle class="chart-dot {cls}" cx="{_c(x)}" cy="{_c(y)}" r="2"/>')
                    continue
                points = " ".join(f"{_c(x)},{_c(y)}" for x, y in (xy(i + shift, v) for i, v in run))
                out.append(
                    f'<polyline class="chart-line {cls}" points="{points}" fill="none"'
                    f' stroke="currentColor" stroke-width="1.5"/>'
                )
    if lines:
        out.append('<g class="chart-legend">')
        x, y = x0, float(height) - 4.0
        for pos, line in enumerate(lines):
            cls = f"line-{line.index if line.index is not None else pos}"
            latest = next((v for v in reversed(line.values) if v is not None), None)
            text = f"{line.name} {fmt(latest, unit)}"
            out.append(
                f'<g class="chart-legend-item"><rect class="chart-swatch {cls}"'
                f' x="{_c(x)}" y="{_c(y - 9)}" width="10" height="10" fill="currentColor"/>'
                f'<text class="chart-legend-text" x="{_c(x + 14)}" y="{_c(y)}">'
                f"{_esc(text)}</text></g>"
            )
            x += 14 + 6.5 * len(text) + 12
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def bar(
    used: float | None,
    total: float | None,
    *,
    label: str,
    unit: str = "",
    width: int = 240,
    height: int = 32,
) -> str:
    """A horizontal usage bar with its numbers as text (readable without colour):
    ``12GiB / 80GiB (15%)`` for ``unit="B"``, just ``42%`` for a fraction of
    ``total=1`` with ``unit="%"``. When either number is unknown (None, or a total
    that is not positive) the bar is hatched and says "unknown": it must never pass
    for an idle 0."""
    frac = (
        used / total
        if used is not None and total is not None and total > 0 and math.isfinite(used)
        else None
    )
    if frac is not None:
        if unit == "%":
            text = fmt(frac, "%")
        else:
            text = f"{fmt(used, unit)} / {fmt(total, unit)} ({fmt(frac, '%')})"
    elif (used is None and total is None) or (used is None and unit == "%"):
        text = "unknown"
    else:
        text = (
            f"{'unknown' if used is None else fmt(used, unit)} / "
            f"{'unknown' if total is None or not total > 0 else fmt(total, unit)}"
        )
    track_y, track_h = 18.0, float(height) - 18.0
    w = float(width)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bar" role="img"'
        f' aria-label="{_esc(f"{label}: {text}")}" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" font-size="11">',
        f"<title>{_esc(f'{label}: {text}')}</title>",
        f'<text class="bar-label" x="0" y="12">{_esc(label)}</text>',
        f'<text class="bar-value" x="{_c(w)}" y="12" text-anchor="end">{_esc(text)}</text>',
    ]
    if frac is not None:
        clamped = min(max(frac, 0.0), 1.0)
        level = "ok" if frac < 0.8 else "warn" if frac < 0.95 else "crit"
        out.append(
            f'<rect class="bar-track" x="0" y="{_c(track_y)}" width="{_c(w)}"'
            f' height="{_c(track_h)}" fill="currentColor" fill-opacity="0.1"/>'
        )
        out.append(
            f'<rect class="bar-fill level-{level}" x="0" y="{_c(track_y)}"'
            f' width="{_c(w * clamped)}" height="{_c(track_h)}" fill="currentColor"/>'
        )
    else:
        out.append(
            f'<rect class="bar-track bar-unknown" x="0" y="{_c(track_y)}" width="{_c(w)}"'
            f' height="{_c(track_h)}" fill="currentColor" fill-opacity="0.05"'
            f' stroke="currentColor" stroke-opacity="0.3" stroke-dasharray="3 2"/>'
        )
        # Diagonals across the track, each cut at the track's ends by hand (no clipPath,
        # so no element ids to collide between the many bars on one page).
        hatch = []
        x = -track_h
        while x < w:
            ax, ay = x, track_y + track_h
            bx, by = x + track_h, track_y
            if ax < 0:
                ay, ax = ay + ax, 0.0
            if bx > w:
                by, bx = by + (bx - w), w
            if ax < bx:
                hatch.append(f"M{_c(ax)} {_c(ay)}L{_c(bx)} {_c(by)}")
            x += 6.0
        out.append(
            f'<path class="bar-hatch" d="{"".join(hatch)}" stroke="currentColor"'
            f' stroke-opacity="0.35" fill="none"/>'
        )
    out.append("</svg>")
    return "".join(out)
