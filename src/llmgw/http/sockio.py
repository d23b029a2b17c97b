"""Socket reads and writes that reach trio's scheduler only when they must wait.

Each of trio's socket operations yields to the scheduler once even when the kernel
had the data at hand (a "cancel-shielded checkpoint" after the call). On the proxy's
path, with four socket operations per request, those trips were a tenth of the
router's CPU. These helpers try the operation on a non-blocking stdlib socket first
and wait (cancellably) only on ``EAGAIN``.

The price: a call that does not wait is not a checkpoint, so it neither notices
cancellation nor lets other tasks run. Callers are loops that wait for their peer
most of the time, and yield there; so that a peer that always has data ready (a
large body arriving faster than it is read) cannot hold the thread, every
`FAIR_EVERY`-th call that did not wait yields anyway.
"""

from __future__ import annotations

import socket

import trio

__all__ = ["FAIR_EVERY", "close", "recv", "send_all"]

#: Calls that did not wait between two forced yields, across all tasks.
FAIR_EVERY = 32
_unyielded = 0


async def _fair() -> None:
    global _unyielded
    _unyielded += 1
    if _unyielded >= FAIR_EVERY:
        _unyielded = 0
        # Shielded: the call has already happened; a Cancelled raised here would lose
        # the bytes just read (or report bytes just sent as unsent).
        await trio.lowlevel.cancel_shielded_checkpoint()


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to `size` bytes; b"" at the end of the stream. Raises OSError on a reset."""
    while True:
        try:
            data = sock.recv(size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        await _fair()
        return data


async def send_all(
    sock: socket.socket, data: bytes | bytearray | memoryview, *, stall: float | None = None
) -> None:
    """Write all of `data`. Raises OSError (BrokenPipeError, ConnectionResetError)
    when the peer has gone, and TimeoutError (an OSError) when it has taken no byte
    for `stall` seconds: a peer that stops reading must not hold the writer."""
    view: memoryview | None = None
    while True:
        try:
            sent = sock.send(data if view is None else view)
        except BlockingIOError:
            if stall is None:
                await trio.lowlevel.wait_writable(sock)
            else:
                with trio.move_on_after(stall) as waited:
                    await trio.lowlevel.wait_writable(sock)
                if waited.cancelled_caught:
                    raise TimeoutError(f"the peer took no bytes for {stall:g}s") from None
            continue
        remaining = (len(data) if view is None else len(view)) - sent
        if remaining <= 0:
            await _fair()
            return
        view = (memoryview(data) if view is None else view)[sent:]


def close(sock: socket.socket) -> None:
    """Close `sock` at once (no checkpoint, so also while cancelled); a task waiting
    on it wakes with an error."""
    if sock.fileno() != -1:
        trio.lowlevel.notify_closing(sock)
        sock.close()
