"""Turning an exception (possibly wrapped in trio's exception groups) into one line."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of the innermost first exception: what a log line or a CLI error
    shows, without the exception-group wrapping nurseries add."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
