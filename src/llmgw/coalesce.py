"""One write for a response's head and the first bytes of its body.

hypercorn writes an HTTP/1.1 response as it is produced: the head, each body chunk,
then the end (empty for a response with a Content-Length). Each write is a lock, a
cancel scope, a socket send and a trip through trio's scheduler; on the client port,
where a non-streaming answer is one head and one body, those trips were about a
seventh of the router's CPU per request (benchmarks/README.md). :class:`HeadCoalescer`
holds the head back until the body's first bytes (or the response's end) and drops
empty writes, so such an answer leaves in one write, and a stream's head leaves with
its first event.

It holds the head only until the application's next send: llmgw's apps send the start
of a response together with its first body bytes (the router starts a stream only once
the engine's first event is in hand), so nothing waits on it. An application that
sent a head and then waited before its body would have its head wait too.
"""

from __future__ import annotations

__all__ = ["HeadCoalescer"]


class HeadCoalescer:
    """Decides what to write for each chunk of bytes h11 produced for one connection."""

    __slots__ = ("_head_seen", "_held")

    def __init__(self) -> None:
        self._held = b""
        self._head_seen = False  # the current response's head has been produced

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, data: bytes, in_body: bool) -> bytes | None:
        """The bytes to write now, or None for nothing. `data` is what h11 produced
        for one event; `in_body` whether h11 is sending a response body after it
        (its ``our_state`` is ``SEND_BODY``): true after a head and after body bytes,
        false after the end of a response and after an interim (1xx) response."""
        if in_body and not self._head_seen:
            self._head_seen = True
            self._held = data
            return None
        out = self._held + data if self._held else data
        self._held = b""
        if not in_body:
            self._head_seen = False  # this response is over; the next one starts afresh
        return out or None
