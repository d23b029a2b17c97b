"""Socket reads and writes that reach trio's scheduler only when they must wait.

Each of trio's socket operations yields to the scheduler once even when the kernel
had the data at hand (a "cancel-shielded checkpoint" after the call). On the proxy's
path, with four socket operations per request, those trips were a tenth of the
router's CPU. These helpers try the operation on a non-blocking stdlib socket first
and wait (cancellably) only on ``EAGAIN``.

The price: a call that does not wait is not a checkpoint, so it neither notices
cancellation nor lets other tasks run. Callers are loops that do wait for their peer
between requests (and check for cancellation there); that is where they yield.
"""

from __future__ import annotations

import socket

import trio

__all__ = ["close", "recv", "send_all"]


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to `size` bytes; b"" at the end of the stream. Raises OSError on a reset."""
    while True:
        try:
            return sock.recv(size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def send_all(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Write all of `data`. Raises OSError (BrokenPipeError, ConnectionResetError)
    when the peer has gone."""
    view: memoryview | None = None
    while True:
        try:
            sent = sock.send(data if view is None else view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        remaining = (len(data) if view is None else len(view)) - sent
        if remaining <= 0:
            return
        view = (memoryview(data) if view is None else view)[sent:]


def close(sock: socket.socket) -> None:
    """Close `sock` at once (no checkpoint, so also while cancelled); a task waiting
    on it wakes with an error."""
    if sock.fileno() != -1:
        trio.lowlevel.notify_closing(sock)
        sock.close()
