"""The SVG charts: well-formed, proportional, escaped, and sane when empty."""

import itertools
import xml.etree.ElementTree as ET

import pytest

from chatparity.dashboard.charts import grouped_bars, stacked_bars, ticks

SVG = "{http://www.w3.org/2000/svg}"
EVIL = '<script>alert("x")</script>'


def parse(markup):
    return ET.fromstring(str(markup))  # also proves the markup is well-formed XML


def bars(markup):
    """(series, category) -> the bar's attributes, for every drawn bar."""
    return {
        (rect.get("data-series"), rect.get("data-category")): {
            "x": float(rect.get("x")),
            "y": float(rect.get("y")),
            "width": float(rect.get("width")),
            "height": float(rect.get("height")),
            "tooltip": rect.find(f"{SVG}title").text,
        }
        for rect in parse(markup).iter(f"{SVG}rect")
        if rect.get("class") == "bar"
    }


def texts(markup):
    return [element.text for element in parse(markup).iter(f"{SVG}text")]


def test_stacked_bar_heights_are_proportional_and_stack_on_each_other():
    chart = stacked_bars(
        ["d1", "d2", "d3"], {"a": [10, 20, 0], "b": [5, 0, 40]}, chart="c", title="t"
    )
    drawn = bars(chart)
    assert set(drawn) == {("a", "d1"), ("a", "d2"), ("b", "d1"), ("b", "d3")}  # no 0-height bars
    unit = drawn["a", "d1"]["height"]
    assert unit > 0
    assert drawn["a", "d2"]["height"] == pytest.approx(2 * unit, abs=0.02)
    assert drawn["b", "d1"]["height"] == pytest.approx(unit / 2, abs=0.02)
    assert drawn["b", "d3"]["height"] == pytest.approx(4 * unit, abs=0.02)
    # b sits on a in the same column
    a, b = drawn["a", "d1"], drawn["b", "d1"]
    assert b["y"] + b["height"] == pytest.approx(a["y"], abs=0.02)
    assert b["x"] == a["x"]
    assert drawn["a", "d1"]["x"] < drawn["a", "d2"]["x"] < drawn["b", "d3"]["x"]


def test_grouped_bars_stand_side_by_side_on_one_baseline():
    chart = grouped_bars(
        ["fast", "slow"], {"p50": [100, 300], "p95": [200, 600]}, chart="c", title="t", unit="ms"
    )
    drawn = bars(chart)
    unit = drawn["p50", "fast"]["height"]
    assert drawn["p95", "fast"]["height"] == pytest.approx(2 * unit, abs=0.02)
    assert drawn["p50", "slow"]["height"] == pytest.approx(3 * unit, abs=0.02)
    assert drawn["p95", "slow"]["height"] == pytest.approx(6 * unit, abs=0.02)
    baselines = {round(bar["y"] + bar["height"], 1) for bar in drawn.values()}
    assert len(baselines) == 1
    assert drawn["p50", "fast"]["x"] < drawn["p95", "fast"]["x"] < drawn["p50", "slow"]["x"]
    assert drawn["p95", "slow"]["tooltip"] == "p95 · slow: 600 ms"


def test_the_tallest_bar_reaches_no_higher_than_the_top_tick():
    chart = stacked_bars(["d1", "d2"], {"a": [30, 7], "b": [15, 0]}, chart="c", title="t")
    labels = texts(chart)
    assert "0" in labels
    assert "60" in labels  # ticks 0, 20, 40, 60 for a top of 45
    top = min(bar["y"] for bar in bars(chart).values())
    assert top > 0


@pytest.mark.parametrize(
    ("top", "integers"),
    [(1, True), (3, True), (45, True), (0.3, False), (12345, False), (7e6, False)],
)
def test_ticks_start_at_zero_are_even_and_cover_the_top(top, integers):
    axis = ticks(top, integers=integers)
    assert axis[0] == 0
    assert axis[-1] >= top
    assert 2 <= len(axis) <= 6
    steps = {round(b - a, 9) for a, b in itertools.pairwise(axis)}
    assert len(steps) == 1
    if integers:
        assert all(float(value).is_integer() for value in axis)


def test_labels_series_names_and_titles_are_escaped():
    chart = stacked_bars([EVIL], {EVIL: [1.0]}, chart="c", title=EVIL)
    assert "<script" not in chart
    assert "&lt;script&gt;" in chart
    root = parse(chart)
    # escaped, not dropped: the parsed text is the original string
    assert root.find(f"{SVG}title").text == EVIL
    assert EVIL in texts(chart)  # the axis label and the legend
    assert bars(chart)[EVIL, EVIL]["tooltip"] == f"{EVIL} · {EVIL}: 1"


@pytest.mark.parametrize(
    ("categories", "series"),
    [([], {}), (["d1", "d2"], {}), (["d1", "d2"], {"a": [0, 0]}), ([], {"a": []})],
)
@pytest.mark.parametrize("draw", [stacked_bars, grouped_bars])
def test_empty_input_draws_a_note_and_no_bars(draw, categories, series):
    chart = draw(categories, series, chart="empty", title="Nothing")
    root = parse(chart)
    assert root.get("data-empty") == "true"
    assert root.get("data-chart") == "empty"
    assert bars(chart) == {}
    assert "No data" in texts(chart)


def test_chart_is_identifiable_scales_and_has_a_legend():
    chart = stacked_bars(["d1"], {"a": [1], "b": [2]}, chart="requests-per-day", title="Requests")
    root = parse(chart)
    assert root.get("data-chart") == "requests-per-day"
    assert root.get("data-empty") == "false"
    assert root.get("viewBox").startswith("0 0 ")
    assert root.get("width") is None  # sized by CSS through the viewBox
    assert root.find(f"{SVG}title").text == "Requests"
    legend = [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend-item"]
    assert [g.find(f"{SVG}title").text for g in legend] == ["a", "b"]


def test_many_categories_are_labelled_sparsely():
    days = [f"2025-01-{day:02d}" for day in range(1, 32)]
    chart = stacked_bars(days, {"a": [1.0] * 31}, chart="c", title="t")
    labels = [text for text in texts(chart) if text.startswith("2025-")]
    assert 3 <= len(labels) < 31
    assert len(bars(chart)) == 31


def test_series_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="series 'a'"):
        stacked_bars(["d1", "d2"], {"a": [1]}, chart="c", title="t")
