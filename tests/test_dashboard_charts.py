from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from llmgw.dashboard.charts import Line, bar, fmt, line_chart, time_labels

NS = {"svg": "http://www.w3.org/2000/svg"}


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed, or this raises
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def classes(el: ET.Element) -> set[str]:
    return set(el.get("class", "").split())


def find(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [el for el in root.iter(f"{{{NS['svg']}}}{tag}") if cls in classes(el)]


def texts(root: ET.Element, cls: str) -> list[str]:
    return [el.text or "" for el in find(root, "text", cls)]


def test_a_chart_is_an_accessible_svg() -> None:
    root = parse(line_chart([Line("req/s", [1.0, 2.0, 3.0])], unit="req/s"))
    assert root.get("role") == "img"
    assert root.get("aria-label") == "req/s (req/s)"
    assert root.findtext("svg:title", namespaces=NS) == "req/s (req/s)"
    assert "chart" in classes(root)
    titled = parse(line_chart([Line("a", [1.0])], unit="s", title="Latency"))
    assert titled.get("aria-label") == "Latency"


def test_a_none_in_the_middle_breaks_the_line_in_two() -> None:
    root = parse(line_chart([Line("p50", [1.0, 2.0, None, 3.0, 4.0])], unit="s"))
    segments = find(root, "polyline", "chart-line")
    assert len(segments) == 2
    assert all(classes(s) == {"chart-line", "line-0"} for s in segments)
    assert [len(s.get("points", "").split()) for s in segments] == [2, 2]
    # The gap is where the None was: the second run starts at the 4th of 5 positions.
    xs = [float(s.get("points", "").split()[0].split(",")[0]) for s in segments]
    width = float(segments[1].get("points", "").split()[-1].split(",")[0]) - xs[0]
    assert xs[1] - xs[0] == pytest.approx(width * 3 / 4)
    assert not texts(root, "chart-nodata")


def test_a_lone_value_is_a_dot_and_nan_is_a_gap() -> None:
    root = parse(line_chart([Line("x", [None, 1.0, math.nan, 2.0, 3.0])], unit=""))
    assert len(find(root, "circle", "chart-dot")) == 1
    assert len(find(root, "polyline", "chart-line")) == 1


def test_zeros_are_drawn_not_gaps() -> None:
    root = parse(line_chart([Line("x", [0.0, 0.0, 0.0])], unit="req/s"))
    (seg,) = find(root, "polyline", "chart-line")
    assert len(seg.get("points", "").split()) == 3
    assert not texts(root, "chart-nodata")


@pytest.mark.parametrize("lines", [[], [Line("a", [None, None]), Line("b", [])]])
def test_no_values_say_no_data(lines: list[Line]) -> None:
    root = parse(line_chart(lines, unit="s"))
    assert texts(root, "chart-nodata") == ["no data"]
    assert not find(root, "polyline", "chart-line")
    assert not find(root, "circle", "chart-dot")
    assert not texts(root, "chart-tick-y")  # no scale to speak of
    assert texts(root, "chart-tick-x") == ["-15m", "-10m", "-5m", "now"]


def test_names_are_escaped() -> None:
    evil = '<script>alert("x")</script>&amp;'
    svg = line_chart([Line(evil, [1.0, 2.0])], unit="<u>", title=evil)
    assert "<script>" not in svg and "<u>" not in svg
    root = parse(svg)
    assert root.get("aria-label") == evil
    assert root.findtext("svg:title", namespaces=NS) == evil
    (legend,) = texts(root, "chart-legend-text")
    assert legend.startswith(evil)


def test_y_ticks_are_round_and_carry_the_unit() -> None:
    root = parse(line_chart([Line("rps", [1.0, 7.3, 2.0])], unit="req/s"))
    assert texts(root, "chart-tick-y") == ["0 req/s", "2 req/s", "4 req/s", "6 req/s", "8 req/s"]
    assert len(find(root, "line", "chart-grid")) == 5
    lat = parse(line_chart([Line("p99", [0.12, 0.35])], unit="s"))
    assert texts(lat, "chart-tick-y") == ["0s", "100ms", "200ms", "300ms", "400ms"]
    sat = parse(line_chart([Line("sat", [0.2, 0.4])], unit="%", y_max=1.0))
    assert texts(sat, "chart-tick-y") == ["0%", "25%", "50%", "75%", "100%"]


def test_values_above_y_max_stay_inside_the_plot() -> None:
    root = parse(line_chart([Line("sat", [0.5, 3.0])], unit="%", y_max=1.0, height=180))
    (frame,) = find(root, "rect", "chart-axis")
    top = float(frame.get("y", "0"))
    (seg,) = find(root, "polyline", "chart-line")
    ys = [float(p.split(",")[1]) for p in seg.get("points", "").split()]
    assert min(ys) == pytest.approx(top)


def test_legend_names_lines_with_their_latest_value_and_index() -> None:
    root = parse(
        line_chart(
            [Line("p50", [0.1, 0.2, None]), Line("p99", [0.5, 1.5], index=7)],
            unit="s",
        )
    )
    assert texts(root, "chart-legend-text") == ["p50 200ms", "p99 1.5s"]
    swatches = find(root, "rect", "chart-swatch")
    assert [classes(s) - {"chart-swatch"} for s in swatches] == [{"line-0"}, {"line-7"}]
    assert {tuple(sorted(classes(s))) for s in find(root, "polyline", "chart-line")} == {
        ("chart-line", "line-0"),
        ("chart-line", "line-7"),
    }


def test_a_shorter_line_is_aligned_on_the_right() -> None:
    root = parse(line_chart([Line("long", [1.0] * 5), Line("short", [2.0, 2.0])], unit=""))
    long_, short = find(root, "polyline", "chart-line")
    long_x = [p.split(",")[0] for p in long_.get("points", "").split()]
    short_x = [p.split(",")[0] for p in short.get("points", "").split()]
    assert short_x == long_x[-2:]


def test_custom_x_labels() -> None:
    root = parse(line_chart([Line("a", [1.0])], unit="", x_labels=time_labels(3600, 2)))
    assert texts(root, "chart-tick-x") == ["-1h", "-30m", "now"]


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (None, "s", "\u2013"),
        (math.nan, "", "\u2013"),
        (0.0, "s", "0s"),
        (0.0, "req/s", "0 req/s"),
        (0.0000123, "s", "12.3µs"),
        (0.25, "s", "250ms"),
        (0.9996, "s", "1s"),
        (12.345, "s", "12.3s"),
        (90.0, "s", "1m 30s"),
        (106.2, "s", "1m 46s"),
        (7200.0, "s", "2h"),
        (0.42, "%", "42%"),
        (1.0, "%", "100%"),
        (80 * 1024**3, "B", "80GiB"),
        (512.0, "B", "512B"),
        (999.7, "tok/s", "1k tok/s"),
        (1234.0, "req/s", "1.23k req/s"),
        (2.5e6, "", "2.5M"),
        (3.0, "", "3"),
        (-0.5, "s", "-500ms"),
    ],
)
def test_fmt(value: float | None, unit: str, text: str) -> None:
    assert fmt(value, unit) == text


def test_time_labels() -> None:
    assert time_labels() == ("-15m", "-10m", "-5m", "now")
    assert time_labels(60, 2) == ("-1m", "-30s", "now")
    with pytest.raises(ValueError):
        time_labels(60, 0)


def test_bar_unknown_is_not_zero() -> None:
    unknown = parse(bar(None, None, label="GPU 0 memory", unit="B"))
    zero = parse(bar(0, 80 * 1024**3, label="GPU 0 memory", unit="B"))
    assert texts(unknown, "bar-value") == ["unknown"]
    assert unknown.get("aria-label") == "GPU 0 memory: unknown"
    assert find(unknown, "rect", "bar-unknown") and find(unknown, "path", "bar-hatch")
    assert not find(unknown, "rect", "bar-fill")
    assert texts(zero, "bar-value") == ["0B / 80GiB (0%)"]
    assert not find(zero, "rect", "bar-unknown") and not find(zero, "path", "bar-hatch")
    (fill,) = find(zero, "rect", "bar-fill")
    assert fill.get("width") == "0"
    assert texts(zero, "bar-label") == ["GPU 0 memory"]


def test_bar_with_one_number_unknown() -> None:
    root = parse(bar(12 * 1024**3, None, label="mem", unit="B"))
    assert texts(root, "bar-value") == ["12GiB / unknown"]
    assert find(root, "rect", "bar-unknown")
    root = parse(bar(None, 80 * 1024**3, label="mem", unit="B"))
    assert texts(root, "bar-value") == ["unknown / 80GiB"]
    root = parse(bar(3.0, 0.0, label="mem", unit="B"))  # no total to measure against
    assert texts(root, "bar-value") == ["3B / unknown"]


def test_bar_fill_and_levels() -> None:
    root = parse(bar(0.42, 1.0, label="utilisation", unit="%", width=200))
    assert texts(root, "bar-value") == ["42%"]
    (fill,) = find(root, "rect", "bar-fill")
    assert float(fill.get("width", "")) == pytest.approx(84.0)
    assert "level-ok" in classes(fill)
    over = parse(bar(120.0, 100.0, label="x", width=200))
    (fill,) = find(over, "rect", "bar-fill")
    assert fill.get("width") == "200" and "level-crit" in classes(fill)
    assert texts(over, "bar-value") == ["120 / 100 (120%)"]
    warn = parse(bar(85.0, 100.0, label="x"))
    assert "level-warn" in classes(find(warn, "rect", "bar-fill")[0])


def test_bar_label_is_escaped() -> None:
    svg = bar(1.0, 2.0, label='<img src=x onerror="alert(1)">')
    assert "<img" not in svg
    root = parse(svg)
    assert texts(root, "bar-label") == ['<img src=x onerror="alert(1)">']


def test_marks_are_labelled_reference_lines_inside_the_axis() -> None:
    svg = line_chart(
        [Line("m", [0.2, 0.5])],
        unit="",
        y_max=1.0,
        marks=[("gold ceiling", 0.85), ("bronze ceiling", 0.3), ("off the chart", 1.5)],
    )
    root = ET.fromstring(svg)
    marks = [e for e in root.iter() if e.get("class") == "chart-mark"]
    labels = [e.text for e in root.iter() if e.get("class") == "chart-mark-label"]
    assert labels == ["gold ceiling", "bronze ceiling"] and len(marks) == 2
    # Higher values are drawn higher (smaller y).
    assert float(marks[0].get("y1", "0")) < float(marks[1].get("y1", "0"))
