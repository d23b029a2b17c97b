"""A deadline on reading each HTTP/1.1 request head, for hypercorn's trio worker.

hypercorn bounds a connection's reads only by `keep_alive_timeout` (idle time between
requests, which also runs until a new connection's first request head is parsed)
and `read_timeout` (every single read, which would cut a minutes-long stream whose
client sends nothing). Neither bounds the request head on its own, so a client that
dribbles its headers (slowloris) holds a connection for the whole keep-alive time.
This module adds that bound, `header_timeout`:

* a new connection must deliver a complete request head (request line and headers)
  within `header_timeout` of being accepted;
* on a kept-alive connection, waiting for the next request is hypercorn's keep-alive
  idle time; once the first byte of the next request arrives (or had already arrived,
  pipelined, when the response ended), the rest of its head must follow within
  `header_timeout` of it;
* once h11 has parsed the head the deadline is off: the body is the application's to
  bound, and the response may stream for as long as it likes.

On expiry a client that had sent part of a head gets ``408 Request Timeout`` (best
effort) and is disconnected; one that sent nothing is just disconnected, as after the
keep-alive timeout (browsers open connections ahead of use).

HTTP/2 is not covered: the deadline bounds a cleartext HTTP/2 connection only until
its preface (which h11 parses as a request head); after that the connection is left
to hypercorn (keep-alive), and HTTP/2 header frames are not bounded.

How: hypercorn's trio worker builds one `TCPServer` per connection, looked up by name
in `hypercorn.trio.run` when it starts serving. :func:`install` replaces that name with
:class:`HeaderTimeoutTCPServer`, which behaves exactly as hypercorn's class unless its
config is a :class:`HeaderTimeoutConfig` with a `header_timeout`. It relies on these
hypercorn internals (tests/test_header_timeout.py checks each; pyproject pins
hypercorn to the minor version they were verified against):

1. `worker_serve` builds connections with the module-level name `TCPServer`;
2. `TCPServer` reads the client only through `self.stream.receive_some` and ends its
   read loop on `trio.TooSlowError`; it then still holds the connection until its
   keep-alive task (`idle_task`) ends, so an expired connection is closed here;
3. the protocol calls `TCPServer.protocol_send` with ``Updated(idle=False)`` when h11
   has parsed a request head, and ``Updated(idle=True)`` when a kept-alive connection
   starts waiting for its next request;
4. on HTTP/1.1, `TCPServer.protocol.protocol.connection` is the `h11.Connection`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import h11
import hypercorn.trio
import hypercorn.trio.run
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Event, RawData, Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, LifespanState

from llmgw.coalesce import HeadCoalescer

__all__ = ["HeaderTimeoutConfig", "HeaderTimeoutTCPServer", "install", "serve"]

log = logging.getLogger("llmgw.header_timeout")

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
#: How long the 408 may take to send: a client that does not read must not hold us.
SEND_408_TIMEOUT = 1.0


class HeaderTimeoutConfig(HypercornConfig):
    """A hypercorn config whose connections must send each request head in time."""

    #: Seconds for a request head; None: hypercorn's behaviour, unbounded.
    header_timeout: float | None = None
    #: Called on every expiry (e.g. to count it); must not block.
    on_header_timeout: Callable[[], None] | None = None
    #: Write a response's head with its first body bytes (llmgw.coalesce).
    coalesce_writes: bool = False


class _HeadDeadline:
    """The connection's stream as hypercorn's TCPServer sees it: every receive is
    bounded by the deadline of the request head being read, if any; everything else
    passes through."""

    def __init__(
        self, stream: Any, timeout: float, expired: Callable[[bool], Awaitable[None]]
    ) -> None:
        self.inner = stream
        self._timeout = timeout
        self._expired = expired  # called with whether part of a head had arrived
        # A new connection: its first request head is due `timeout` from now.
        self._deadline = trio.current_time() + timeout
        self._waiting = True  # no head parsed since the connection opened / last response
        self._partial = False  # some bytes of the awaited head have arrived
        self._scope: trio.CancelScope | None = None  # the receive in progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        if self._scope is not None:
            self._scope.deadline = deadline

    def head_parsed(self) -> None:
        self._waiting = self._partial = False
        self._set_deadline(math.inf)

    def next_request(self, *, buffered: bool) -> None:
        """A response ended on a kept-alive connection; `buffered`: bytes of the next
        request arrived already (pipelined) and start its deadline now."""
        self._waiting, self._partial = True, buffered
        self._set_deadline(trio.current_time() + self._timeout if buffered else math.inf)

    def disable(self) -> None:
        """The connection is no longer HTTP/1.1 (HTTP/2, WebSocket): not ours to bound."""
        self._waiting = self._partial = False
        self._set_deadline(math.inf)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data: bytes | bytearray = b""
        with trio.CancelScope(deadline=self._deadline) as scope:
            self._scope = scope
            try:
                data = await self.inner.receive_some(max_bytes)
            finally:
                self._scope = None
        if scope.cancelled_caught:  # our deadline (any other cancellation propagates)
            log.debug("request head not complete within %gs: disconnecting", self._timeout)
            await self._expired(self._partial)
            raise trio.TooSlowError  # ends hypercorn's read loop
        if data and self._waiting:
            self._partial = True
            if self._deadline == math.inf:  # first byte of a kept-alive connection's request
                self._set_deadline(trio.current_time() + self._timeout)
        return data


class HeaderTimeoutTCPServer(TCPServer):
    """hypercorn's per-connection server, plus the request-head deadline of a
    :class:`HeaderTimeoutConfig` and, when it asks, one write for a response's head
    and first body bytes (:mod:`llmgw.coalesce`); any other config: hypercorn's
    behaviour."""

    def __init__(
        self,
        app: AppWrapper,
        config: HypercornConfig,
        context: WorkerContext,
        state: LifespanState,
        stream: trio.SSLStream[trio.SocketStream],
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._coalescer: HeadCoalescer | None = None
        if isinstance(config, HeaderTimeoutConfig) and config.coalesce_writes:
            self._coalescer = HeadCoalescer()
        self._head: _HeadDeadline | None = None
        if isinstance(config, HeaderTimeoutConfig) and config.header_timeout is not None:
            self._head = _HeadDeadline(stream, config.header_timeout, self._head_expired)
            # Duck-typed: TCPServer uses the stream's methods and attributes only.
            self.stream = cast("trio.SSLStream[trio.SocketStream]", self._head)

    async def protocol_send(self, event: Event) -> None:
        coalescer = self._coalescer
        if coalescer is not None and isinstance(event, RawData):
            connection = self._h11_connection()
            if connection is not None:  # HTTP/2 and WebSocket bytes pass as they are
                out = coalescer.feed(event.data, connection.our_state is h11.SEND_BODY)
                if out is None:
                    return
                event = RawData(data=out)
        head = self._head
        if head is not None and isinstance(event, Updated):
            if not event.idle:
                head.head_parsed()
            else:
                connection = self._h11_connection()
                if connection is None:
                    head.disable()
                else:
                    head.next_request(buffered=bool(connection.trailing_data[0]))
        await super().protocol_send(event)

    def _h11_connection(self) -> h11.Connection | None:
        """The connection's h11 state machine; None once it speaks HTTP/2 or WebSocket."""
        wrapper = getattr(self, "protocol", None)
        connection = getattr(getattr(wrapper, "protocol", None), "connection", None)
        return connection if isinstance(connection, h11.Connection) else None

    async def _head_expired(self, partial: bool) -> None:
        assert isinstance(self.config, HeaderTimeoutConfig)
        if self.config.on_header_timeout is not None:
            self.config.on_header_timeout()
        stream = self._head.inner if self._head is not None else self.stream
        if partial and self._h11_connection() is not None:
            # No response is being written: the previous one (if any) has ended.
            gone = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError)
            with trio.move_on_after(SEND_408_TIMEOUT), contextlib.suppress(*gone):
                async with self.send_lock:
                    await stream.send_all(REQUEST_TIMEOUT)
        # hypercorn would hold the connection until its keep-alive timer ends; close now.
        await self.idle_task.stop()
        await stream.aclose()


def install() -> None:
    """Make hypercorn's trio worker build its connections with HeaderTimeoutTCPServer
    (idempotent; configs other than HeaderTimeoutConfig see no difference)."""
    current = vars(hypercorn.trio.run)["TCPServer"]
    if current is HeaderTimeoutTCPServer:
        return
    if current is not TCPServer:
        raise RuntimeError(f"hypercorn.trio.run.TCPServer is already replaced by {current!r}")
    # setattr: the name is not part of the module's typed exports.
    setattr(hypercorn.trio.run, "TCPServer", HeaderTimeoutTCPServer)  # noqa: B010


async def serve(
    app: Any,
    config: HypercornConfig,
    *,
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[Sequence[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`hypercorn.trio.serve`, honouring a HeaderTimeoutConfig's `header_timeout`."""
    install()
    await hypercorn.trio.serve(
        app, config, shutdown_trigger=shutdown_trigger, task_status=task_status
    )
