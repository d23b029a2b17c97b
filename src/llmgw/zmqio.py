"""ZeroMQ sockets under trio: pyzmq in non-blocking mode, woken by the socket's file
descriptor.

ZMQ's ``zmq.FD`` is edge-triggered and signals that the socket's *events* changed,
not that a message waits: a reader drains while ``zmq.EVENTS`` has ``POLLIN`` and only
then waits on the descriptor again (and checks once more after every wake-up).
"""

from __future__ import annotations

from typing import Any, cast

import trio
import zmq

__all__ = ["recv_multipart"]


async def recv_multipart(sock: zmq.Socket[Any]) -> list[bytes]:
    """The next message on `sock`, waiting for it without blocking the trio loop."""
    fd = cast(int, sock.getsockopt(zmq.FD))
    while True:
        if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                return sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
        await trio.lowlevel.wait_readable(fd)
