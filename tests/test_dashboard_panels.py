"""The dashboard's pure formatting and summaries (llmgw.dashboard.panels, charts)."""

from __future__ import annotations

import math

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
