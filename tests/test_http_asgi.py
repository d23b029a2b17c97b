"""llmgw.http.asgi: what llmgw's apps do with scopes that are not HTTP requests."""

from __future__ import annotations

from typing import Any

from llmgw.http.asgi import answer_non_http


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
