"""The agent transport's interface: what the controller and the agent program against.

One connection is one agent's bidirectional stream (DESIGN §7). The server side
listens and hands each accepted connection to a handler; the agent side connects.
Both see ordered, typed messages (:mod:`llmgw.transport.messages`), never bytes:
the gRPC transport converts at its edge and the in-memory stub passes values as
they are, so code written against these Protocols runs on either.

Errors: a connection whose peer is gone (closed, cut, reset) raises
:class:`ConnectionClosed` from ``receive`` and ``send``; a connect attempt that
cannot get through raises :class:`ConnectFailed`. Both are
:class:`TransportError`, which is what a reconnect loop catches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from llmgw.transport.messages import AgentMessage, ServerMessage

__all__ = [
    "AgentConnection",
    "AgentConnector",
    "AgentHandler",
    "AgentListener",
    "ConnectFailed",
    "ConnectionClosed",
    "ServerConnection",
    "TransportError",
]


class TransportError(Exception):
    """Something between agent and server failed; reconnecting may help."""


class ConnectionClosed(TransportError):
    """The stream is over: the peer closed it, the network cut it, or we closed it."""


class ConnectFailed(TransportError):
    """A connect attempt did not get a stream (refused, unreachable, handshake failed)."""


class AgentConnection(Protocol):
    """The server's end of one agent's stream."""

    @property
    def peer_identity(self) -> str | None:
        """The identity in the agent's verified client certificate; None without TLS.

        With TLS the controller refuses a registration whose node id differs (DESIGN §7).
        """
        ...

    @property
    def peer_address(self) -> str | None:
        """The IP address the agent connects from; None without one (the in-memory stub).

        The controller checks the address a node declares against it (docs/transport.md,
        "Trusting agents")."""
        ...

    async def receive(self) -> AgentMessage:
        """The agent's next message, in order. Raises ConnectionClosed once it is gone.

        Cancelling a receive loses no message: it is delivered by the next receive."""
        ...

    async def send(self, message: ServerMessage) -> None:
        """Queue a message for the agent. Raises ConnectionClosed if it is gone; may wait
        while the stream is backed up (flow control)."""
        ...

    async def aclose(self) -> None:
        """End the stream; idempotent. The agent's receive then raises ConnectionClosed."""
        ...


class ServerConnection(Protocol):
    """The agent's end of its stream to the server: the mirror image of AgentConnection."""

    async def receive(self) -> ServerMessage:
        """The server's next message, in order. Raises ConnectionClosed once it is gone.

        Cancelling a receive loses no message: it is delivered by the next receive."""
        ...

    async def send(self, message: AgentMessage) -> None:
        """Queue a message for the server. Raises ConnectionClosed if it is gone."""
        ...

    async def aclose(self) -> None:
        """End the stream; idempotent."""
        ...


AgentHandler = Callable[[AgentConnection], Awaitable[None]]
"""Serves one agent connection; the connection is closed when it returns or raises."""


class AgentListener(Protocol):
    """The server side: accepts agent connections."""

    async def serve(
        self,
        handler: AgentHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections until cancelled, running ``handler(connection)`` in a task
        of its own per connection.

        For ``await nursery.start(listener.serve, handler)``: reports started once
        connections are accepted. The handler tasks belong to this call: when it is
        cancelled they are cancelled and every connection is closed before it returns.
        A handler ending in ConnectionClosed (bare or in an exception group) just ends
        that connection; any other exception is a bug and propagates out of ``serve``,
        as with ``trio.serve_tcp``: handlers own the errors they expect.
        """
        ...


class AgentConnector(Protocol):
    """The agent side: opens its stream to the server."""

    def connect(self) -> AbstractAsyncContextManager[ServerConnection]:
        """``async with connector.connect() as conn:``; raises ConnectFailed on entry if
        the server cannot be reached, and closes the stream on exit."""
        ...
