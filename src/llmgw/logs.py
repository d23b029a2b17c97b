"""How llmgw's log lines look: plain text or one JSON object per line.

A log call may carry structured fields as ``extra={"fields": {...}}`` (see
:func:`fields`). The text format writes them after the message as ``key=value``
(quoted when needed, a list as indented lines below); the JSON format writes them as
keys of the line's object, next to ``ts``, ``level``, ``logger`` and ``message``.
Every command sets this up once, through :func:`setup`.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import msgspec

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

#: The loggers --log-level debug opens (the programs' and the library's).
OWN_LOGGERS = ("llmgw", "llmgw-server", "llmgw-agent", "llmgw-sim", "llmgw-ctl")

#: The LogRecord attribute structured fields are kept in.
FIELDS = "fields"

# What a text value may hold unquoted: nothing a reader (or a logfmt parser) could
# mistake for the end of the value.
_BARE = re.compile(r"[^\s\"'=\\]+")
# The JSON line's own keys; a field of the same name is written with a leading _.
_OWN = frozenset({"ts", "level", "logger", "message", "exc"})


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call carrying `values` as structured fields."""
    return {FIELDS: values}


def _stamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def text_value(value: Any) -> str:
    """One field's value as text: ``-`` for None, floats to the microsecond, strings
    quoted (JSON-style) when they hold spaces, quotes, ``=`` or control characters."""
    if value is None:
        return "-"
    kind = type(value)
    if kind is int:  # the common case first (an access line is mostly counts)
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value == value else "nan"
    text = str(value)
    if _BARE.fullmatch(text):
        return text
    return msgspec.json.encode(text).decode()


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message key=value ...``; a list field as indented lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second: int | None = None
        self._stamp = ""

    def _asctime(self, record: logging.LogRecord) -> str:
        # logging's default asctime (local time, then milliseconds), its strftime done
        # once a second: the access log writes a line per request.
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
        return f"{self._stamp},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            line = super().format(record)
        else:
            message = record.getMessage()
            line = f"{self._asctime(record)} {record.levelname} {record.name}: {message}"
        values: Mapping[str, Any] | None = getattr(record, FIELDS, None)
        if not values:
            return line
        pairs: list[str] = []
        blocks: list[str] = []
        for key, value in values.items():
            if isinstance(value, (list, tuple)):
                if value:
                    blocks.append(f"\n  {key}:" + "".join(f"\n    {v}" for v in value))
            else:
                pairs.append(f"{key}={text_value(value)}")
        head, sep, rest = line.partition("\n")  # a traceback stays below the fields
        return " ".join([head, *pairs]) + "".join(blocks) + sep + rest


_encoder = msgspec.json.Encoder(enc_hook=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, logger, message, the record's
    fields as keys, and exc (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _stamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in (getattr(record, FIELDS, None) or {}).items():
            line[f"_{key}" if key in _OWN else key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _encoder.encode(line).decode()


def setup(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Log records at `level` and above to `stream` (stderr) in `fmt` (:data:`FORMATS`),
    once per process: where logging is set up already (a test calling a command's
    `main` in its own process), it is left as it is."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if logging.root.handlers:
        return
    # Neither format writes where a call was made from: logging's documented way not to
    # look it up (a stack walk per record; the access log writes one per request).
    logging._srcfile = None
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # DEBUG is llmgw's own: the libraries' (httpcore, hpack, ...) is every byte sent.
    threshold = max(logging.INFO, logging.getLevelName(level.upper()))
    logging.basicConfig(level=threshold, handlers=[handler])
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
