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
import select
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing_procs import Proc
from llmgw.transport.certs import CertPair
from tests.procs import BIN, scratch_dir, server, sim
from tests.test_tls_listeners import make_certs
from tests.waiting import wait_for

#: The server's open-file limit: far fewer than a flood's connections.
NOFILE = 400
#: Connections in a flood: more than the server's descriptors.
FLOOD = 600
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _config(sim_url: str, certs: Path | None, extra: str = "") -> str:
    tls = ""
    if certs is not None:
        tls = f"""
[listen_tls]
cert = "{certs / "server.pem"}"
key = "{certs / "server.key"}"
"""
    return f"""
[store]
url = ""
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

    def turned_away(self, proc: Proc) -> None:
        """Wait until the server has closed most of the flood: all but a listener's share
        (at most half of its descriptors), at once."""
        wait_for(
            lambda: self.count_closed() >= FLOOD - NOFILE // 2,
            "the server closing the connections past its listener's share",
            30,
            context=lambda: f"closed: {self.closed}\n{proc.output(2000)}",
        )

    def close(self) -> None:
        for sock in self.open.values():
            sock.close()


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
                flood.turned_away(proc)
                answer = client.post(f"{base}/v1/chat/completions", json=CHAT)
                assert answer.status_code == 200, answer.text
                # A new connection to the admin listener: its share is its own.
                health = httpx.get(f"{admin}/healthz", timeout=20)
                assert health.json() == {"status": "ok"}
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
                flood.turned_away(proc)
                assert flood.busy > 0  # a plain listener says why
                assert operator.get(f"{admin}/healthz").json() == {"status": "ok"}
                # A new connection to the client port, and its request to the engine.
                with httpx.Client(verify=verify, timeout=20) as client:
                    answer = client.post(f"{base}/v1/chat/completions", json=CHAT)
                    assert answer.status_code == 200, answer.text
            finally:
                flood.close()


# -- the limits of each request ------------------------------------------------------

BODY_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def plain(engine: str) -> Iterator[object]:
    extra = f'client_body = "{BODY_TIMEOUT:g}s"'
    with server(config=_config(engine, None, extra)) as srv:
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


@pytest.mark.parametrize("listener", ["listen", "admin_listen"])
def test_too_many_header_fields_get_a_431(plain: object, listener: str) -> None:
    fields = b"".join(b"x-f%d: 1\r\n" % i for i in range(101))
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + fields + b"\r\n"
    answer, _ = _exchange(_address(plain, listener), request)
    assert answer.startswith(b"HTTP/1.1 431"), answer


@pytest.mark.parametrize("listener", ["listen", "admin_listen"])
def test_a_hundred_header_fields_are_served(plain: object, listener: str) -> None:
    fields = b"".join(b"x-f%d: 1\r\n" % i for i in range(98))  # with host and connection
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + fields
    answer, _ = _exchange(_address(plain, listener), request + b"\r\n")
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
