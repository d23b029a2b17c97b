"""llmgw.http.sockio: socket calls that skip trio's scheduler when they need not wait."""

from __future__ import annotations

import socket

import trio

from llmgw.http import sockio


async def test_reads_that_never_wait_still_let_other_tasks_run() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    with a, b:
        b.sendall(b"x" * 64 * 1024)  # all buffered: every read below succeeds at once
        ticks = 0
        reads = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await trio.lowlevel.checkpoint()
            start = ticks
            while reads < 20 * sockio.FAIR_EVERY:
                assert await sockio.recv(a, 64)
                reads += 1
            nursery.cancel_scope.cancel()
        # Without the forced yields the ticker would not run once during the loop.
        assert ticks - start >= reads // sockio.FAIR_EVERY - 1


async def test_send_all_writes_everything_and_recv_sees_the_end() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers hold
    got = bytearray()
    with a, b:

        async def reader() -> None:
            while data := await sockio.recv(b, 65536):
                got.extend(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await sockio.send_all(a, payload)
            a.shutdown(socket.SHUT_WR)
    assert bytes(got) == payload


async def test_a_forced_yield_after_a_read_never_loses_the_bytes_to_a_cancellation() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, b:
        b.sendall(b"next request")
        sockio._unyielded = sockio.FAIR_EVERY - 1  # this read ends with a forced yield
        with trio.CancelScope() as scope:
            scope.cancel()  # e.g. a disconnect watcher cancelled as its response ends
            data = await sockio.recv(a, 64)
        assert data == b"next request"
