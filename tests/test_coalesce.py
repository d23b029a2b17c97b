"""HeadCoalescer against the bytes h11 really produces, and on a real server: a
non-streaming answer leaves in one write (so one read on loopback gets all of it)."""

from __future__ import annotations

import socket

import h11

from llmgw.coalesce import HeadCoalescer

from .procs import server


def served(*events: h11.Event, request: h11.Request | None = None) -> list[bytes | None]:
    """What a coalescer writes for each event a server-side h11 connection sends."""
    conn = h11.Connection(h11.SERVER)
    client = h11.Connection(h11.CLIENT)
    req = request or h11.Request(method="GET", target="/", headers=[("host", "x")])
    conn.receive_data(client.send(req) + client.send(h11.EndOfMessage()))
    assert isinstance(conn.next_event(), h11.Request)
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    coalescer = HeadCoalescer()
    out = []
    for event in events:
        data = conn.send(event)
        assert data is not None
        out.append(coalescer.feed(data, conn.our_state is h11.SEND_BODY))
    assert not coalescer.holding
    return out


def test_a_sized_answer_is_one_write() -> None:
    head = h11.Response(status_code=200, headers=[("content-length", "2")])
    writes = served(head, h11.Data(data=b"ok"), h11.EndOfMessage())
    assert writes[0] is None and writes[2] is None  # held head; the empty end dropped
    assert writes[1] is not None
    assert writes[1].startswith(b"HTTP/1.1 200 ") and writes[1].endswith(b"\r\n\r\nok")


def test_a_stream_sends_its_head_with_the_first_event_then_each_event() -> None:
    head = h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])
    writes = served(head, h11.Data(data=b"a"), h11.Data(data=b"b"), h11.EndOfMessage())
    assert writes[0] is None
    assert writes[1] is not None and writes[1].startswith(b"HTTP/1.1 200 ")
    assert writes[1].endswith(b"1\r\na\r\n")
    assert writes[2] == b"1\r\nb\r\n" and writes[3] == b"0\r\n\r\n"


def test_an_answer_without_a_body_goes_at_its_end() -> None:
    head = h11.Response(status_code=204, headers=[])
    writes = served(head, h11.EndOfMessage())
    assert writes[0] is None
    assert writes[1] is not None and writes[1].startswith(b"HTTP/1.1 204 ")


def test_an_interim_response_is_not_held() -> None:
    req = h11.Request(
        method="POST",
        target="/",
        headers=[("host", "x"), ("content-length", "0"), ("expect", "100-continue")],
    )
    writes = served(
        h11.InformationalResponse(status_code=100, headers=[]),
        h11.Response(status_code=200, headers=[("content-length", "0")]),
        h11.EndOfMessage(),
        request=req,
    )
    assert writes[0] is not None and writes[0].startswith(b"HTTP/1.1 100 ")
    assert writes[1] is None and writes[2] is not None


def test_each_response_on_a_kept_alive_connection_is_coalesced() -> None:
    coalescer = HeadCoalescer()
    for _ in range(3):
        assert coalescer.feed(b"HEAD", True) is None
        assert coalescer.feed(b"BODY", True) == b"HEADBODY"
        assert coalescer.feed(b"", False) is None


def test_a_real_answer_arrives_in_one_read() -> None:
    with server("--endpoint", "e1=http://127.0.0.1:9=m") as srv:
        for base, path in ((srv.base, "/v1/models"), (srv.admin, "/healthz")):
            host, port = base.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                for _ in range(3):  # and again on the same connection
                    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                    data = sock.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200 "), data
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    assert len(body) == length, data


def test_hypercorns_own_error_answer_still_goes_out() -> None:
    """hypercorn answers a malformed request itself (a head, then an empty end): the
    held head must leave with that end, not vanish when the connection closes."""
    with server("--endpoint", "e1=http://127.0.0.1:9=m") as srv:
        host, port = srv.base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"NOT A REQUEST\r\n\r\n")
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 "), reply
