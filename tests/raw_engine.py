"""A plain-HTTP server playing an engine with canned raw answers, in the test's process:
what it was sent is kept byte for byte (heads, bodies, on which connection)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import trio


def ok(body: bytes, *headers: bytes) -> bytes:
    """A raw 200 answer with `body` (Content-Length framed) and `headers` lines."""
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\n%scontent-length: %d\r\n\r\n%s" % (extra, len(body), body)


class RawEngine:
    """Answers each request with the bytes `answers` holds for its target (path and
    query), keeping the connection open; closes it after answering a target in `cut`."""

    def __init__(self, answers: Mapping[bytes, bytes], cut: Collection[bytes] = ()) -> None:
        self.answers = answers
        self.cut = cut
        # (the connection's number, from 1; the request's head; its body)
        self.requests: list[tuple[int, bytes, bytes]] = []
        self.connections = 0

    @property
    def heads(self) -> list[bytes]:
        return [head for _, head, _ in self.requests]

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        """Listen on a port of 127.0.0.1 (given to `task_status`) until cancelled."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append((number, head, body))
                target = head.split(b" ")[1]
                await stream.send_all(self.answers[target])
                if target in self.cut:
                    return
