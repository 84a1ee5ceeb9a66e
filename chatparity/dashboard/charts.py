"""Server-rendered SVG bar charts: pure functions from numbers to escaped markup."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import cycle

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

# Okabe-Ito, led by the admin's blue: distinguishable with common colour blindness.
PALETTE = (
    "#417690", "#e69f00", "#009e73", "#cc79a7", "#56b4e9",
    "#d55e00", "#0072b2", "#f0e442", "#999999", "#000000",
)  # fmt: skip

WIDTH = 640
PLOT_LEFT = 52
PLOT_RIGHT = 12
PLOT_TOP = 22
PLOT_HEIGHT = 180
X_LABEL_BAND = 24
LEGEND_ROW = 18
CHAR_WIDTH = 6.5  # average width of an 11px glyph, to lay out text without a browser
NAME_LIMIT = 28
MAX_BAND = 120
PLOT_WIDTH = WIDTH - PLOT_LEFT - PLOT_RIGHT
PLOT_BOTTOM = PLOT_TOP + PLOT_HEIGHT


def stacked_bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    chart: str,
    title: str,
    unit: str = "",
) -> SafeString:
    """One bar per category, the series stacked on each other (e.g. requests per day by alias)."""
    return _bar_chart(categories, series, chart=chart, title=title, unit=unit, stacked=True)


def grouped_bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    chart: str,
    title: str,
    unit: str = "",
) -> SafeString:
    """The series side by side within each category (e.g. p50 and p95 per alias)."""
    return _bar_chart(categories, series, chart=chart, title=title, unit=unit, stacked=False)


def ticks(top: float, *, integers: bool = False, count: int = 4) -> list[float]:
    """Evenly spaced axis values from 0 to at least ``top`` on a 1-2-2.5-5 step."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integers:
        step = max(1.0, math.ceil(step))
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def compact(value: float) -> str:
    """A short axis label: 3 significant digits with k/M/G."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def exact(value: float, unit: str = "") -> str:
    """A tooltip value: grouped thousands, one decimal unless whole."""
    text = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    return f"{text} {unit}".rstrip()


def _bar_chart(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    chart: str,
    title: str,
    unit: str,
    stacked: bool,
) -> SafeString:
    names = list(series)
    for name in names:
        if len(series[name]) != len(categories):
            raise ValueError(
                f"series {name!r} has {len(series[name])} values, not {len(categories)}"
            )
    values = {name: [max(0.0, float(v)) for v in series[name]] for name in names}
    columns = list(zip(*values.values(), strict=True)) if names else []
    top = max((sum(column) if stacked else max(column) for column in columns), default=0.0)
    if top <= 0:
        return _svg(chart, title, PLOT_TOP + 40, [_note("No data")], empty=True)
    axis = ticks(top, integers=all(v.is_integer() for name in names for v in values[name]))
    scale = PLOT_HEIGHT / axis[-1]
    legend, legend_height = _legend(names, PLOT_BOTTOM + X_LABEL_BAND)
    parts = [
        _y_axis(axis, scale, unit),
        _x_axis(categories),
        *_bars(categories, values, scale, unit, stacked=stacked),
        *legend,
    ]
    return _svg(chart, title, PLOT_BOTTOM + X_LABEL_BAND + legend_height, parts)


def _svg(
    chart: str, title: str, height: float, parts: Iterable[str], empty: bool = False
) -> SafeString:
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="chatparity-chart" data-chart="{}"'
        ' data-empty="{}" viewBox="0 0 {} {}" role="img" aria-label="{}"'
        ' font-size="11" fill="currentColor"><title>{}</title>{}</svg>',
        chart,
        "true" if empty else "false",
        WIDTH,
        _num(height),
        title,
        title,
        _join(parts),
    )


def _note(text: str) -> SafeString:
    return format_html(
        '<text class="note" x="{}" y="{}" text-anchor="middle">{}</text>',
        WIDTH // 2,
        PLOT_TOP + 20,
        text,
    )


def _y_axis(axis: Sequence[float], scale: float, unit: str) -> SafeString:
    lines = []
    for value in axis:
        y = _num(PLOT_BOTTOM - value * scale)
        lines.append(
            format_html(
                '<g class="tick"><line x1="{}" x2="{}" y1="{}" y2="{}" stroke="currentColor"'
                ' stroke-opacity="{}"/><text x="{}" y="{}" text-anchor="end"'
                ' dominant-baseline="middle">{}</text></g>',
                PLOT_LEFT,
                WIDTH - PLOT_RIGHT,
                y,
                y,
                "0.6" if value == 0 else "0.15",
                PLOT_LEFT - 6,
                y,
                compact(value),
            )
        )
    if unit:
        lines.append(
            format_html('<text class="unit" x="{}" y="{}">{}</text>', 2, PLOT_TOP - 10, unit)
        )
    return format_html('<g class="axis y-axis">{}</g>', _join(lines))


def _x_axis(categories: Sequence[str]) -> SafeString:
    left, band = _bands(len(categories))
    widest = max(len(category) for category in categories) * CHAR_WIDTH + 8
    every = max(1, math.ceil(widest / band))  # label every n-th bar so labels never overlap
    labels = [
        format_html(
            '<text x="{}" y="{}" text-anchor="middle">{}</text>',
            _num(left + (i + 0.5) * band),
            PLOT_BOTTOM + 16,
            category,
        )
        for i, category in enumerate(categories)
        if i % every == 0
    ]
    return format_html('<g class="axis x-axis">{}</g>', _join(labels))


def _bands(count: int) -> tuple[float, float]:
    """Where the first of ``count`` category bands starts, and their width: centred, and
    never so wide that a lone category becomes a wall."""
    band = min(PLOT_WIDTH / count, MAX_BAND)
    return PLOT_LEFT + (PLOT_WIDTH - band * count) / 2, band


def _bars(
    categories: Sequence[str],
    values: Mapping[str, Sequence[float]],
    scale: float,
    unit: str,
    *,
    stacked: bool,
) -> list[SafeString]:
    left, band = _bands(len(categories))
    width = band * 0.7 if stacked else band * 0.8 / len(values)
    bars = []
    for i, category in enumerate(categories):
        base = 0.0
        for s, (name, color) in enumerate(zip(values, cycle(PALETTE), strict=False)):
            value = values[name][i]
            if value <= 0:
                continue
            x = left + i * band + (band * 0.15 if stacked else band * 0.1 + s * width)
            height = value * scale
            bars.append(
                format_html(
                    '<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="{}"'
                    ' data-series="{}" data-category="{}" data-value="{}">'
                    "<title>{} · {}: {}</title></rect>",
                    _num(x),
                    _num(PLOT_BOTTOM - base * scale - height),
                    _num(width),
                    _num(height),
                    color,
                    name,
                    category,
                    _num(value),
                    name,
                    category,
                    exact(value, unit),
                )
            )
            if stacked:
                base += value
    return bars


def _legend(names: Sequence[str], top: float) -> tuple[list[SafeString], float]:
    """Legend entries flowed left to right in rows; returns them and their height."""
    entries = []
    x, y = float(PLOT_LEFT), top
    for name, color in zip(names, cycle(PALETTE), strict=False):
        label = name if len(name) <= NAME_LIMIT else name[: NAME_LIMIT - 1] + "…"
        width = 16 + len(label) * CHAR_WIDTH + 14
        if x + width > WIDTH and x > PLOT_LEFT:
            x, y = float(PLOT_LEFT), y + LEGEND_ROW
        entries.append(
            format_html(
                '<g class="legend-item"><title>{}</title><rect x="{}" y="{}" width="10"'
                ' height="10" fill="{}"/><text x="{}" y="{}">{}</text></g>',
                name,
                _num(x),
                _num(y),
                color,
                _num(x + 14),
                _num(y + 9),
                label,
            )
        )
        x += width
    return entries, (y - top + LEGEND_ROW if entries else 0)


def _join(parts: Iterable[str]) -> SafeString:
    # Safe because every part was built by format_html, which escaped its arguments.
    return mark_safe("".join(parts))


def _num(value: float) -> str:
    """A coordinate with at most two decimals, without trailing zeros."""
    return f"{value:.2f}".rstrip("0").rstrip(".")
