"""Reading the current request strictly: its query string and its JSON body.

Quart parses leniently where the admin API must not: a query parameter given
twice, a query string that is not UTF-8, ``NaN`` in a body, or JSON sent under
another content type (a cross-site form can post ``text/plain`` without asking the
browser first). Each is a 4xx naming the fault.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import parse_qsl

from quart import g, request

from llmgw.admin.contract import ApiError

__all__ = ["check_query", "json_object", "query"]


def query() -> Mapping[str, str]:
    """The query parameters; 400 when one is given twice or cannot be decoded."""
    cached: dict[str, str] | None = g.get("llmgw_query")
    if cached is not None:
        return cached
    try:
        pairs = parse_qsl(
            request.query_string.decode("ascii"),
            keep_blank_values=True,
            errors="strict",
            encoding="utf-8",
        )
    except (UnicodeDecodeError, ValueError):
        raise ApiError(400, "the query string is not valid UTF-8", "invalid_query") from None
    parsed: dict[str, str] = {}
    for name, value in pairs:
        if name in parsed:
            raise ApiError(
                400, f"query parameter {name!r} is given twice", "invalid_query", param=name
            )
        parsed[name] = value
    g.llmgw_query = parsed
    return parsed


def check_query(known: Collection[str]) -> None:
    """400 naming the first query parameter the route does not take."""
    for name in query():
        if name not in known:
            takes = f"; it takes {', '.join(sorted(known))}" if known else ""
            raise ApiError(
                400, f"unknown query parameter {name!r}{takes}", "unknown_parameter", param=name
            )


def _no_constants(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON.
    raise ValueError(f"{name} is not valid JSON")


async def json_object() -> dict[str, Any]:
    """The body as a JSON object: 415 unless sent as ``application/json``, 400 when it
    is empty, malformed or not an object. Its size and deadline are the app's
    (``MAX_CONTENT_LENGTH``: 413, ``BODY_TIMEOUT``: 408)."""
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    if request.mimetype != "application/json":
        raise ApiError(
            415,
            f"the request body must be sent as application/json, not {request.mimetype or 'none'}",
            "unsupported_media_type",
        )
    if not raw.strip():
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(
            400,
            f"the request body must be a JSON object, got {type(data).__name__}",
            "invalid_json",
        )
    return data
