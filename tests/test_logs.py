"""llmgw.logs's two formats, through a real logger: a structured field stays on its
line (text) or becomes a key (JSON), whatever a client put in it."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from llmgw.logs import JsonFormatter, TextFormatter, fields, text_value


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("llmgw.test-logs")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield log, out, handler
    finally:
        log.removeHandler(handler)


def test_text_values_stay_on_one_line_and_unambiguous() -> None:
    assert text_value(None) == "-"
    assert text_value(True) == "true"
    assert text_value(0.1234567) == "0.123457"
    assert text_value(2.0) == "2"
    assert text_value("sim-model") == "sim-model"
    assert text_value("two words") == '"two words"'
    assert text_value('a"b') == '"a\\"b"'
    assert text_value("k=v") == '"k=v"'
    assert text_value("line\nINFO forged: x") == '"line\\nINFO forged: x"'


def test_text_lines_carry_fields_after_the_message_and_lists_below(
    logger: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    log, out, handler = logger
    handler.setFormatter(TextFormatter())
    log.warning(
        "replica %s failed", "r1", extra=fields(exit_code=-9, model=None, tail=["one", "two"])
    )
    line = out.getvalue()
    head = " WARNING llmgw.test-logs: replica r1 failed exit_code=-9 model=-"
    assert line.endswith(head + "\n  tail:\n    one\n    two\n")


def test_json_lines_are_one_object_with_the_fields_as_keys(
    logger: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    log, out, handler = logger
    handler.setFormatter(JsonFormatter())
    log.info("hello %s", "there", extra=fields(request_id="x\ny", status=200, message="mine"))
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    first, second = out.getvalue().splitlines()
    one = json.loads(first)
    assert one["message"] == "hello there" and one["_message"] == "mine"
    assert (one["level"], one["logger"], one["request_id"], one["status"]) == (
        "INFO",
        "llmgw.test-logs",
        "x\ny",
        200,
    )
    assert one["ts"].endswith("Z") and "T" in one["ts"]
    two = json.loads(second)
    assert two["level"] == "ERROR" and "ValueError: boom" in two["exc"]


def test_the_text_formats_time_is_loggings_own_across_seconds() -> None:
    """TextFormatter formats the time itself (strftime once a second): the same text as
    logging's default asctime, for records within one second and across seconds."""
    ours = TextFormatter()
    stock = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for created in (1_796_250_000.001, 1_796_250_000.999, 1_796_250_001.0, 1_796_253_601.5):
        record = logging.LogRecord(
            "llmgw.access", logging.INFO, "x", 1, "%s %s", ("/v1", 200), None
        )
        record.created, record.msecs = created, (created % 1) * 1000
        assert ours.format(record) == stock.format(record)
