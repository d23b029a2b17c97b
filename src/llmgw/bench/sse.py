"""An incremental server-sent-events decoder that accepts arbitrary byte chunks.

Network reads split wherever they like: inside a line, inside a UTF-8 sequence,
between the CR and LF of a CRLF. Lines are therefore split on bytes first (CR and
LF never occur inside a UTF-8 multi-byte sequence) and decoded afterwards.
"""

from __future__ import annotations

import re

import attrs

_EOL = re.compile(rb"\r\n|\r|\n")


@attrs.frozen
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Feed bytes in, get complete events out (per the WHATWG event-stream rules)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        # A chunk ended in CR: an LF at the start of the next one belongs to it.
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[Event]:
        if self._skip_lf and chunk:
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
            self._skip_lf = False
        self._buf += chunk
        events: list[Event] = []
        pos = 0
        while (m := _EOL.search(self._buf, pos)) is not None:
            if m.group() == b"\r" and m.end() == len(self._buf):
                self._skip_lf = True
            self._line(bytes(self._buf[pos : m.start()]), events)
            pos = m.end()
        del self._buf[:pos]
        return events

    def close(self) -> list[Event]:
        """Events left at end of stream.

        The spec drops an event without its closing blank line; we keep it, because
        servers that end on ``data: [DONE]\\n`` alone are common and the data is whole.
        """
        events: list[Event] = []
        if self._buf:
            self._line(bytes(self._buf), events)
            self._buf.clear()
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, out: list[Event]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if self._data:
                out.append(Event("\n".join(self._data), self._event or "message", self._id))
            self._data, self._event = [], ""
            return
        if line.startswith(":"):  # comment / keep-alive
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        # `retry` and unknown fields are ignored: a load generator never reconnects.
