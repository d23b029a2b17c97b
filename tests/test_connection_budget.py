"""Every listener goes through its share of one connection budget (llmgw.http.budget),
through a real llmgw-server under a low open-file limit in front of a real llmgw-sim
(issue #32).

A flood of TCP connections that never send a byte, on the TLS client port or on the
admin listener, must not take the descriptors an established client, another
listener or the connection to an engine needs: past a listener's share, connections
are closed at once. Then the limits hypercorn's listeners keep like llmgw's own
server: Connection: close, a slow body (408), too many header fields (431); and the
plain port's refusal of a chunk announced larger than router.max_body_bytes (413).
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import ssl
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest
import trio

from llmgw.http import hyper
from llmgw.http.asgi import answer_non_http
from llmgw.http.hyper import HyperConfig, serve_hypercorn
from llmgw.http.request import MAX_HEADERS, RequestReader
from llmgw.testing.procs import Proc
from llmgw.transport.certs import CertPair
from tests.procs import BIN, scratch_dir, server, sim
from tests.test_tls_listeners import make_certs
from tests.waiting import wait_for

#: The server's open-file limit: far fewer than a flood's connections.
NOFILE = 400
#: Connections in a flood: more than the server's descriptors.
FLOOD = 600
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _config(sim_url: str, certs: Path | None, extra: str = "", store: str = "") -> str:
    tls = ""
    if certs is not None:
        tls = f"""
[listen_tls]
cert = "{certs / "server.pem"}"
key = "{certs / "server.key"}"
"""
    return f"""
[store]
url = "{store}"
{tls}
[router]
max_body_bytes = "1MiB"

[router.timeouts]
# Generous: an established connection must outlast the flood's setup on a loaded
# machine, and the flood's handshakes must hold their slots meanwhile.
client_header = "60s"
tls_handshake = "60s"
{extra}

[[endpoints]]
id = "sim"
url = "{sim_url}"
models = ["sim-model"]
"""


@contextlib.contextmanager
def limited_server(config: str) -> Iterator[Proc]:
    """llmgw-server with an open-file limit (soft and hard) of NOFILE."""
    logdir = scratch_dir("llmgw-server-")
    path = logdir / "llmgw.toml"
    path.write_text(config)
    argv = [
        "prlimit",
        f"--nofile={NOFILE}:{NOFILE}",
        str(BIN / "llmgw-server"),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--config",
        str(path),
        "--ready-file",
        str(logdir / "ready.json"),
    ]
    proc = Proc(argv, logdir / "output.log")
    try:
        proc.wait_ready_file(logdir / "ready.json", 30)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def certs() -> tuple[Path, CertPair]:
    directory = scratch_dir("llmgw-tls-")
    return directory, make_certs(directory)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with sim() as (_, url):
        yield url


class Flood:
    """FLOOD connections to `address` that never send a byte, and which of them the
    server has closed (after a 503 on a plain listener, or with nothing)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.open: dict[int, socket.socket] = {}
        self.closed = 0
        self.busy = 0  # answered 503
        for _ in range(FLOOD):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))  # in progress: the server's backlog holds it
            self.open[sock.fileno()] = sock

    def count_closed(self) -> int:
        """Read what the server sent or closed so far; how many it closed."""
        poller = select.poll()
        for fd in self.open:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            sock = self.open[fd]
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 503"):
                self.busy += 1
            elif data:
                continue  # more to come
            del self.open[fd]
            sock.close()
            self.closed += 1
        return self.closed

    def settled(self, proc: Proc) -> None:
        """Wait until the server has taken the flood in: it closed all but a listener's
        share (at most half of its descriptors) at once, or, without a budget, it ran
        out of descriptors."""

        def done() -> bool:
            return (
                self.count_closed() >= FLOOD - NOFILE // 2 or _descriptors(proc.pid) >= NOFILE - 8
            )

        wait_for(
            done,
            "the server taking the flood in",
            30,
            context=lambda: f"closed: {self.closed}\n{proc.output(2000)}",
        )

    def turned_away(self) -> None:
        """The server closed the connections past the listener's share."""
        assert self.count_closed() >= FLOOD - NOFILE // 2, self.closed

    def close(self) -> None:
        for sock in self.open.values():
            sock.close()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _ready(proc: Proc, listener: str) -> str:
    return str(proc.ready[listener][0])


def test_a_flood_on_the_tls_port_leaves_established_clients_and_the_admin_listener_working(
    engine: str, certs: tuple[Path, CertPair]
) -> None:
    directory, ca = certs
    with limited_server(_config(engine, directory)) as proc:
        base = f"https://{_ready(proc, 'listen')}"
        admin = f"http://{_ready(proc, 'admin_listen')}"
        verify = ssl.create_default_context(cafile=str(ca.cert))
        limits = httpx.Limits(keepalive_expiry=120)
        with httpx.Client(verify=verify, timeout=20, limits=limits) as client:
            # Established before the flood: its TLS connection is kept alive.
            assert client.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200
            flood = Flood(_ready(proc, "listen"))
            try:
                flood.settled(proc)
                answer = client.post(f"{base}/v1/chat/completions", json=CHAT)
                assert answer.status_code == 200, answer.text
                # A new connection to the admin listener: its share is its own.
                health = httpx.get(f"{admin}/healthz", timeout=20)
                assert health.json() == {"status": "ok"}
                flood.turned_away()
            finally:
                flood.close()


def test_a_flood_on_the_admin_listener_leaves_the_client_port_and_established_admins_working(
    engine: str, certs: tuple[Path, CertPair]
) -> None:
    directory, ca = certs
    with limited_server(_config(engine, directory)) as proc:
        base = f"https://{_ready(proc, 'listen')}"
        admin = f"http://{_ready(proc, 'admin_listen')}"
        verify = ssl.create_default_context(cafile=str(ca.cert))
        limits = httpx.Limits(keepalive_expiry=120)
        with httpx.Client(timeout=20, limits=limits) as operator:
            assert operator.get(f"{admin}/healthz").status_code == 200
            flood = Flood(_ready(proc, "admin_listen"))
            try:
                flood.settled(proc)
                assert operator.get(f"{admin}/healthz").json() == {"status": "ok"}
                # A new connection to the client port, and its request to the engine.
                with httpx.Client(verify=verify, timeout=20) as client:
                    answer = client.post(f"{base}/v1/chat/completions", json=CHAT)
                    assert answer.status_code == 200, answer.text
                flood.turned_away()
                assert flood.busy > 0  # a plain listener says why
            finally:
                flood.close()


# -- the limits of each request ------------------------------------------------------

BODY_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def plain(engine: str) -> Iterator[object]:
    extra = f'client_body = "{BODY_TIMEOUT:g}s"'
    # A store, for an admin request that reads its body (a new API key).
    store = f"sqlite:///{scratch_dir('llmgw-store-') / 'llmgw.db'}"
    with server(config=_config(engine, None, extra, store)) as srv:
        yield srv


def _exchange(address: str, request: bytes, timeout: float = 20.0) -> tuple[bytes, float]:
    """Send `request` on a new connection, read until the server closes it; what came
    and how long the close took after the request was sent."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        start = time.monotonic()
        sock.sendall(request)
        received = b""
        while True:  # bounded: each read waits at most `timeout`, and EOF ends it
            data = sock.recv(65536)
            if not data:
                return received, time.monotonic() - start
            received += data


def _address(srv: object, listener: str) -> str:
    return str(srv.proc.ready[listener][0])  # type: ignore[attr-defined]


def test_the_admin_listener_closes_at_once_after_connection_close(plain: object) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    answer, took = _exchange(_address(plain, "admin_listen"), request)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    # Not the keep-alive time (60 s here): the close follows the answer.
    assert took < 10, took


def test_a_slow_admin_body_gets_a_408(plain: object) -> None:
    request = (
        b"POST /api/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    answer, took = _exchange(_address(plain, "admin_listen"), request)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert took >= BODY_TIMEOUT * 0.9


#: A path each listener answers 200 on.
_PATHS = {"listen": b"/v1/models", "admin_listen": b"/healthz"}


def _get(listener: str, fields: int) -> bytes:
    """A GET with `fields` header fields in all (Host and Connection among them)."""
    extra = b"".join(b"x-f%d: 1\r\n" % i for i in range(fields - 2))
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n" % (
        _PATHS[listener],
        extra,
    )


@pytest.mark.parametrize("listener", ["listen", "admin_listen"])
def test_too_many_header_fields_get_a_431(plain: object, listener: str) -> None:
    answer, _ = _exchange(_address(plain, listener), _get(listener, MAX_HEADERS + 1))
    assert answer.startswith(b"HTTP/1.1 431"), answer


@pytest.mark.parametrize("listener", ["listen", "admin_listen"])
def test_a_hundred_header_fields_are_served(plain: object, listener: str) -> None:
    answer, _ = _exchange(_address(plain, listener), _get(listener, MAX_HEADERS))
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_chunk_larger_than_the_body_limit_gets_a_413_at_once(plain: object) -> None:
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        b"%x\r\n{" % (2 * 1024 * 1024)
    )
    answer, took = _exchange(_address(plain, "listen"), request)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    # Not after the body deadline: the chunk's size says enough.
    assert took < BODY_TIMEOUT, took


# -- the parser's look at chunk sizes, and HTTP/2 resets, in-process --------------------

_CHUNKED_HEAD = b"POST /x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n"


def _read(reader: RequestReader, *reads: bytes) -> RequestReader:
    for data in reads:
        reader.feed(data)
    return reader


@pytest.mark.parametrize(
    "reads",
    [
        [_CHUNKED_HEAD + b"401\r\n{"],  # the head and the size line in one read
        [_CHUNKED_HEAD, b"401\r\n"],
        [_CHUNKED_HEAD, b"4", b"01;ext=1\r", b"\n"],  # the size line across reads
        [_CHUNKED_HEAD, b"10\r\n" + b"x" * 16 + b"\r\n401\r\n"],  # after a chunk within it
        [_CHUNKED_HEAD + b"4", b"01\r\n"],  # the size line begun with the head
        [_CHUNKED_HEAD + b"2\r\n{}\r\n401\r\n"],  # after a chunk, with the head
    ],
)
def test_a_chunk_announced_over_the_limit_is_refused_at_once(reads: list[bytes]) -> None:
    reader = _read(RequestReader(max_body=1024), *reads)
    assert reader.error is not None and reader.error.status == 413, reader.error
    assert reader.requests[-1].head_done  # served: the app is told, then the 413 goes


def test_chunks_within_the_limit_and_lines_in_the_data_pass() -> None:
    data = b"a\nb\r\n401\r\n"  # a size line's look-alike inside a chunk's data
    reader = _read(
        RequestReader(max_body=1024),
        _CHUNKED_HEAD + b"%x\r\n" % len(data),
        data + b"\r\n400\r\n" + b"y" * 1024 + b"\r\n0\r\n\r\n",
    )
    assert reader.error is None
    request = reader.requests[-1]
    assert request.complete and bytes(request.body) == data + b"y" * 1024


def test_without_a_limit_the_parser_does_not_look_at_chunk_sizes() -> None:
    reader = _read(RequestReader(), _CHUNKED_HEAD + b"ffffff\r\n{")
    assert reader.error is None


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        await answer_non_http(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


async def test_an_http2_client_resetting_streams_fast_gets_a_goaway() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(serve_hypercorn, _hello, listeners, HyperConfig(), shutdown_trigger=stop.wait)
        )
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()  # prior knowledge: no TLS needed
        headers = [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "a")]
        ended: h2.events.ConnectionTerminated | None = None
        with trio.fail_after(30):
            # Bounded: far more than the burst allowed, sent as fast as the socket takes.
            for _ in range(hyper.RESET_BURST * 5):
                stream_id = client.get_next_available_stream_id()
                client.send_headers(stream_id, headers, end_stream=True)
                client.reset_stream(stream_id)
                try:
                    await stream.send_all(client.data_to_send())
                except trio.BrokenResourceError:
                    break  # the server closed: its GOAWAY is read below
            while ended is None:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    break
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        ended = event
        await stream.aclose()
        stop.set()
    assert ended is not None, "no GOAWAY"
    assert ended.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def test_a_chunked_body_within_the_limit_passes_however_it_is_split() -> None:
    # Chunk data with size-line look-alikes (hex over the limit between line ends).
    chunks = [b"\r\nfffffff\r\n", b"x" * 700, b"\n401\n\r\n", b"a;b\r\n"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    wire = _CHUNKED_HEAD + body + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    rng = random.Random(32)
    for _ in range(300):  # bounded: 300 ways to cut it into reads
        cuts = sorted(rng.sample(range(1, len(wire)), rng.randint(1, 8)))
        reads = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
        reader = _read(RequestReader(max_body=1024), *reads)
        assert reader.error is None, (cuts, reader.error)
        first, second = reader.requests
        assert first.complete and bytes(first.body) == b"".join(chunks), cuts
        assert second.head_done
