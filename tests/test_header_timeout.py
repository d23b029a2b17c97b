"""The request-head deadline (`router.timeouts.client_header`, served by llmgw.http.server).

End to end: a real llmgw-server (head deadline 1s) and llmgw-sim on loopback, driven by
raw sockets so that each test controls exactly which bytes arrive when. Every read has
a socket timeout and every loop a deadline. Timing bounds are loose on purpose: a
disconnect must come no earlier than the deadline (less slack) and well before 5x.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import h11
import pytest

from llmgw import config as cfg

from .procs import Server, server, sim

TIMEOUT = 1.0
BODY_TIMEOUT = 3.0  # above the 2s the slow-body test takes
SLACK = 0.2
CONFIG = f"""
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[router.timeouts]
client_header = "{TIMEOUT:g}s"
client_body = "{BODY_TIMEOUT:g}s"
"""
READ_TIMEOUT = 10.0  # any single socket read; far above every expected wait


@pytest.fixture(scope="module")
def gw() -> Iterator[Server]:
    # 100 ms per engine step: a 20-token stream lasts about 2s, twice the head deadline.
    with (
        sim("--decode-step-ms", "100", model="m") as (_, base),
        server("--endpoint", f"s0={base}=m", config=CONFIG) as srv,
    ):
        srv.wait_scraped()
        yield srv


class Conn:
    """One raw client connection; requests are framed by an h11 client so that their
    bytes can be sent in any pieces, responses parsed by it."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT)
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.sock.close()

    def head(self, method: str, target: str, body: bytes | None = None) -> bytes:
        headers = [("host", "llmgw"), ("content-type", "application/json")]
        if body is not None:
            headers.append(("content-length", str(len(body))))
        return self.h11.send(h11.Request(method=method, target=target, headers=headers))

    def request(self, method: str, target: str, body: bytes | None = None) -> bytes:
        data = self.head(method, target, body)
        if body is not None:
            data += self.h11.send(h11.Data(data=body))
        return data + self.h11.send(h11.EndOfMessage())

    def response(self) -> tuple[int, bytes]:
        """Read one whole response (status, body); ready for the next request after,
        unless either side ends the connection with it."""
        status, body = 0, b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                    self.h11.start_next_cycle()
                return status, body
            else:
                raise AssertionError(f"unexpected {event!r}")
        raise TimeoutError("response not complete within 60s")

    def until_closed(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        got = bytearray(self.h11.trailing_data[0])
        deadline = time.monotonic() + 5 * TIMEOUT + READ_TIMEOUT
        while time.monotonic() < deadline:
            chunk = self.sock.recv(65536)
            if not chunk:
                return bytes(got)
            got += chunk
        raise TimeoutError("connection still open")


@contextlib.contextmanager
def connect(url: str) -> Iterator[Conn]:
    conn = Conn(url)
    try:
        yield conn
    finally:
        conn.close()


def chat_body(max_tokens: int, *, stream: bool = False) -> bytes:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return json.dumps(body).encode()


def assert_cut_after_deadline(elapsed: float) -> None:
    assert TIMEOUT - SLACK <= elapsed < 5 * TIMEOUT, elapsed


def expiries(srv: Server, listener: str) -> float:
    return srv.metric("llmgw_client_timeouts_total", listener=listener, phase="header")


def test_a_stalled_partial_head_gets_408_and_is_disconnected(gw: Server) -> None:
    before = expiries(gw, "client")
    with connect(gw.base) as conn:
        head = conn.head("POST", "/v1/chat/completions", chat_body(2))
        started = time.monotonic()
        conn.sock.sendall(head[: len(head) // 2])  # request line and some headers, no end
        reply = conn.until_closed()
        assert_cut_after_deadline(time.monotonic() - started)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert expiries(gw, "client") == before + 1


def test_the_admin_listener_closes_a_stalled_head_at_the_deadline(gw: Server) -> None:
    # Served by hypercorn, which closes a connection with no complete request once it
    # has been idle for its keep-alive timeout (the server sets client_header), without
    # a 408 of its own.
    with connect(gw.admin) as conn:
        head = conn.head("POST", "/api/v1/keys", b"{}")
        started = time.monotonic()
        conn.sock.sendall(head[: len(head) // 2])
        reply = conn.until_closed()
        assert_cut_after_deadline(time.monotonic() - started)
    assert reply == b"", reply


def test_a_connection_that_sends_nothing_is_closed_silently(gw: Server) -> None:
    with connect(gw.base) as conn:
        started = time.monotonic()
        reply = conn.until_closed()
        assert_cut_after_deadline(time.monotonic() - started)
    assert reply == b""


def test_a_head_dribbled_within_the_deadline_and_a_slower_body_are_served(gw: Server) -> None:
    body = chat_body(2)
    with connect(gw.base) as conn:
        head = conn.head("POST", "/v1/chat/completions", body)
        # The head in 5 pieces over about half the deadline...
        step = len(head) // 5 + 1
        for i in range(0, len(head), step):
            conn.sock.sendall(head[i : i + step])
            time.sleep(TIMEOUT / 10)  # a slow client: the pace is what is tested
        # ...then the body over twice the deadline: the body is not the head's business.
        pieces = 8
        size = len(body) // pieces + 1
        for i in range(0, len(body), size):
            time.sleep(2 * TIMEOUT / pieces)  # a slow body, as slow as the test says
            conn.sock.sendall(conn.h11.send(h11.Data(data=body[i : i + size])))
        conn.sock.sendall(conn.h11.send(h11.EndOfMessage()))
        status, reply = conn.response()
    assert status == 200, reply
    assert json.loads(reply)["usage"]["completion_tokens"] == 2


def test_a_body_that_stops_coming_gets_408_after_client_body(gw: Server) -> None:
    before = gw.metric("llmgw_client_timeouts_total", listener="client", phase="body")
    body = chat_body(2)
    with connect(gw.base) as conn:
        conn.sock.sendall(conn.head("POST", "/v1/chat/completions", body))
        started = time.monotonic()
        conn.sock.sendall(conn.h11.send(h11.Data(data=body[:10])))  # then nothing
        status, reply = conn.response()
        elapsed = time.monotonic() - started
        assert BODY_TIMEOUT - SLACK <= elapsed < 5 * BODY_TIMEOUT, elapsed
        assert conn.until_closed() == b""  # and the connection is closed
    assert status == 408
    error = json.loads(reply)["error"]
    assert error["code"] == "request_timeout"
    assert "within 3s (router.timeouts.client_body); 10 bytes came" in error["message"]
    after = gw.metric("llmgw_client_timeouts_total", listener="client", phase="body")
    assert after == before + 1


def test_a_stream_outlasting_the_deadline_is_not_cut_and_the_connection_stays(
    gw: Server,
) -> None:
    with connect(gw.base) as conn:
        started = time.monotonic()
        conn.sock.sendall(conn.request("POST", "/v1/chat/completions", chat_body(20, stream=True)))
        status, reply = conn.response()
        took = time.monotonic() - started
        assert status == 200, reply
        events = [line for line in reply.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert took > 1.5 * TIMEOUT, f"the stream was too quick ({took:.2f}s) to show anything"

        # Kept alive and idle for twice the head deadline: keep-alive (75s) applies. The
        # idle time is the input under test; the request after it shows the outcome.
        time.sleep(2 * TIMEOUT)
        conn.sock.sendall(conn.request("GET", "/v1/models"))
        status, reply = conn.response()
        assert status == 200, reply
        assert [m["id"] for m in json.loads(reply)["data"]] == ["m"]


def test_on_a_kept_alive_connection_the_next_head_is_bounded_from_its_first_byte(
    gw: Server,
) -> None:
    before = expiries(gw, "client")
    with connect(gw.base) as conn:
        conn.sock.sendall(conn.request("GET", "/v1/models"))
        assert conn.response()[0] == 200
        time.sleep(1.5 * TIMEOUT)  # idle past the head deadline (the input under test)
        head = conn.head("GET", "/v1/models")
        started = time.monotonic()
        conn.sock.sendall(head[:-4])  # everything but the blank line ending the head
        reply = conn.until_closed()
        assert_cut_after_deadline(time.monotonic() - started)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert expiries(gw, "client") == before + 1


def test_a_pipelined_partial_head_is_bounded_from_the_end_of_the_response(gw: Server) -> None:
    with connect(gw.base) as conn:
        first = conn.request("POST", "/v1/chat/completions", chat_body(5))
        # Write the second head with h11 out of turn: it is never completed anyway.
        second = b"GET /v1/models HTTP/1.1\r\nhost: llmgw\r\n"
        conn.sock.sendall(first + second)
        status, _ = conn.response()
        ended = time.monotonic()
        assert status == 200
        reply = conn.until_closed()
        assert_cut_after_deadline(time.monotonic() - ended)
    assert reply.startswith(b"HTTP/1.1 408 "), reply


def test_client_header_defaults_to_10s_and_must_be_positive() -> None:
    assert cfg.load(data={}, environ={}).router.timeouts.client_header == 10
    assert cfg.load(data={}, environ={}).router.timeouts.client_body == 30
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(data={"router": {"timeouts": {"client_header": "0s"}}}, environ={})
    assert "router.timeouts.client_header: must be greater than 0, got 0" in str(error.value)
