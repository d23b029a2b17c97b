"""llmgw.http.asgi: what llmgw's apps do with scopes that are not HTTP requests."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.http.asgi import BodyTooLarge, ClientLeft, answer_non_http, read_body


async def test_lifespan_events_are_acknowledged_and_other_scopes_ignored() -> None:
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await answer_non_http({"type": "lifespan"}, receive, send)
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    await answer_non_http({"type": "websocket"}, receive, send)
    assert len(sent) == 2 and not incoming  # nothing read, nothing answered


@pytest.mark.parametrize(
    "chunks",
    [
        [b""],
        [b"whole"],
        [b"", b"late"],
        [b"ab", b"", b"cd", b"e"],
        [b"x" * 70_000, b"y" * 70_000, b""],
    ],
)
async def test_a_body_in_pieces_is_read_whole(chunks: list[bytes]) -> None:
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    assert await read_body({"headers": []}, receive, 1 << 20) == b"".join(chunks)


async def test_a_body_past_the_limit_or_cut_by_a_disconnect_is_refused() -> None:
    incoming: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.request", "body": b"def", "more_body": True},
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    with pytest.raises(BodyTooLarge):
        await read_body({"headers": []}, receive, 5)
    with pytest.raises(BodyTooLarge):  # refused unread by its declared length
        await read_body({"headers": [(b"content-length", b"6")]}, receive, 5)
    incoming[:] = [
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.disconnect"},
    ]
    with pytest.raises(ClientLeft):
        await read_body({"headers": []}, receive, 100)
