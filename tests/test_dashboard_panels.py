"""The dashboard's pure formatting and summaries (llmgw.dashboard.panels, charts)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from llmgw.dashboard import charts, panels


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "never"),
        (0, "0s"),
        (0.05, "0s"),
        (0.25, "0.2s"),
        (0.99, "0.9s"),
        (1, "1s"),
        (46.9, "46s"),  # truncated: it has not been 47s yet
        (60, "1m"),
        (106.2, "1m 46s"),  # what read "1.77m"
        (3599, "59m 59s"),
        (3600, "1h"),
        (2 * 3600 + 5 * 60 + 59, "2h 5m"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600 + 59 * 60, "3d 4h"),
        (400 * 86400, "400d"),
        (-5, "0s"),  # a clock a little behind another is "just now"
        (math.inf, panels.MISSING),
    ],
)
def test_ages_read_as_people_say_them(seconds: float | None, text: str) -> None:
    assert panels.fmt_ago(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "1s"), (59.9, "59s"), (61, "1m 1s"), (7200, "2h"), (7260, "2h 1m"), (90061, "1d 1h")],
)
def test_duration(seconds: float, text: str) -> None:
    assert charts.duration(seconds) == text


def node(state: str, cordoned: bool) -> dict[str, Any]:
    return {"state": state, "cordoned": cordoned, "gpus": [], "gpus_allocated": 0, "gpus_free": 0}


def test_cordoned_nodes_are_counted_within_their_state() -> None:
    """A cordoned node is in a state too: its count is part of that state's, so the
    states add up to the nodes (they read "2 ready, 1 cordoned" for two nodes)."""
    nodes = [node("ready", True), node("ready", False), node("lost", True), node("lost", False)]
    summary = panels.fleet_summary(nodes)
    assert summary["states"] == {"ready": 2, "lost": 2}
    assert sum(summary["states"].values()) == summary["nodes"] == 4
    assert summary["cordoned"] == 2
    assert summary["cordoned_by_state"] == {"ready": 1, "lost": 1}
    assert panels.fleet_summary([node("ready", False)])["cordoned_by_state"] == {}


def test_the_traffic_page_charts_errors_and_retries_per_model() -> None:
    from llmgw.dashboard.traffic import TrafficRing
    from llmgw.domain.usage import Usage, UsageRecord

    now = [0.0]
    ring = TrafficRing(clock=lambda: now[0])
    now[0] = 1.0
    ring.record(UsageRecord("m", None, 429, Usage(), 0.001))  # a refusal
    now[0] = 6.0
    made = {c["title"]: c for c in panels.traffic_charts(ring.series())}
    errors = made["Errors per second per model"]
    assert "chart-dot line-0" in errors["svg"] and "m 0.2 /s" in errors["svg"]
    # Nobody counted retries: the chart says so instead of drawing zeros.
    retries = made["Retries per second per model"]
    assert "no data" in retries["svg"] and retries["note"] == panels.NO_RETRY_COUNTS
    ring.record(UsageRecord("m", "e", 200, Usage(), 0.1, retries=1))
    now[0] = 11.0
    made = {c["title"]: c for c in panels.traffic_charts(ring.series())}
    retries = made["Retries per second per model"]
    assert "note" not in retries and "m 0.2 /s" in retries["svg"]


def test_the_traffic_page_charts_prefix_predictions_and_spills() -> None:
    """The router's model of the engines, weighed: the share of prefix predictions the
    engines confirmed, and the spills per reason. Each says why it is empty: no engine
    reported cached tokens, none was predicted, or nothing spilled (a zero)."""
    from llmgw.dashboard.traffic import TrafficRing
    from llmgw.domain.usage import Usage, UsageRecord

    predictions = "Prefix-cache predictions against the engines"
    spills = "Affinity spills per second by reason"
    now = [0.0]
    ring = TrafficRing(clock=lambda: now[0])
    now[0] = 1.0
    ring.record(UsageRecord("m", "e", 200, Usage(10, 1), 0.1))  # no cached tokens said
    now[0] = 6.0
    made = {c["title"]: c for c in panels.traffic_charts(ring.series())}
    assert "no data" in made[predictions]["svg"]
    assert made[predictions]["note"] == panels.NO_CACHE_REPORTS
    assert "no data" in made[spills]["svg"] and "note" not in made[spills]  # not counted

    ring.record(UsageRecord("m", "e", 200, Usage(10, 1, cached_tokens=0), 0.1, spills=()))
    now[0] = 11.0
    made = {c["title"]: c for c in panels.traffic_charts(ring.series())}
    assert made[predictions]["note"] == panels.NO_PREDICTIONS
    assert made[spills]["note"] == panels.NO_SPILLS

    for outcome in ("hit", "hit", "hit", "over"):
        ring.record(
            UsageRecord(
                "m",
                "e",
                200,
                Usage(10, 1, cached_tokens=0),
                0.1,
                prediction=outcome,
                spills=(("prefix", "throttled"),) if outcome == "over" else (),
            )
        )
    now[0] = 16.0
    made = {c["title"]: c for c in panels.traffic_charts(ring.series())}
    chart = made[predictions]
    assert "note" not in chart and "no data" not in chart["svg"]
    # The latest slot's shares, in the legend: 3 of 4 confirmed, 1 of 4 over, none under.
    assert "confirmed 75%" in chart["svg"] and "over 25%" in chart["svg"]
    assert "under 0%" in chart["svg"]
    chart = made[spills]
    assert "note" not in chart and "prefix:throttled 0.2 /s" in chart["svg"]
