"""A deliberately misbehaving engine: raw HTTP/1.1 on a socket, one thread per connection.

Each POST is answered by the case its JSON body names (``{"case": NAME, ...}``, see
CASES): a malformed status line, header or chunk, a body cut short, a stream that never
ends, a body or SSE event too large to hold, one that dribbles. `GET /metrics` answers a
vLLM-looking page (so the router scrapes it like an engine) and `GET /log` what came in:
``{"requests": [[connection, case], ...], "closed_by_peer": [connection, ...]}``, which
tells whether the router reused a connection after an answer it should have refused.

Run as a program (``python tests/hostile_engine.py``) it binds a port on 127.0.0.1,
prints it, and serves until killed: a separate process, so that a router that freezes
on what it is sent cannot freeze the test that watches it (and the engine's threads
take nothing from the test's own). :func:`engine` does that for a test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

MiB = 1024 * 1024
# Any "forever" case gives up after this, should nothing ever stop it.
SAFETY = 60.0

OK_JSON = (
    b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
EVENT = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'
)
DONE = b"data: [DONE]\n\n"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
JSON_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer(status: bytes = b"200 OK", *headers: bytes, body: bytes = OK_JSON) -> bytes:
    """A response with a Content-Length, the given extra header lines, and `body`."""
    lines = [b"HTTP/1.1 " + status, b"content-type: application/json", *headers]
    lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def head(first: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([first, *headers]) + b"\r\n\r\n"


class Close(Exception):
    """The case ends the connection."""


Case = Callable[[socket.socket], None]


def once(data: bytes, close: bool = False) -> Case:
    def case(sock: socket.socket) -> None:
        sock.sendall(data)
        if close:
            raise Close

    return case


def pieces(*parts: bytes, pause: float = 0.02, close: bool = False) -> Case:
    """Each part in its own write, with a pause between (the reader sees them apart)."""

    def case(sock: socket.socket) -> None:
        for part in parts:
            sock.sendall(part)
            time.sleep(pause)  # the engine's pace: each part arrives on its own
        if close:
            raise Close

    return case


def forever(first: bytes, repeat: bytes) -> Case:
    """`first`, then `repeat` as fast as the reader takes it, until the reader leaves."""

    def case(sock: socket.socket) -> None:
        sock.sendall(first)
        block = repeat * max(1, 65536 // len(repeat))
        end = time.monotonic() + SAFETY
        while time.monotonic() < end:
            sock.sendall(block)
        raise Close

    return case


def flood(first: bytes, total: int, framed: bool) -> Case:
    """`first`, then `total` bytes of body as fast as taken (chunked when `framed`)."""

    def case(sock: socket.socket) -> None:
        sock.sendall(first)
        piece = b"x" * MiB
        sent = 0
        while sent < total:
            sock.sendall(chunk(piece) if framed else piece)
            sent += len(piece)
        if framed:
            sock.sendall(b"0\r\n\r\n")
        raise Close

    return case


def dribble(first: bytes, every: float = 0.2) -> Case:
    """`first`, then one byte every `every` seconds, until the reader leaves."""

    def case(sock: socket.socket) -> None:
        sock.sendall(first)
        end = time.monotonic() + SAFETY
        while time.monotonic() < end:
            time.sleep(every)  # a dribbling engine: one byte per `every` is the case
            sock.sendall(b"x")
        raise Close

    return case


def big_json(size: int) -> bytes:
    """A well-formed chat completion of about `size` bytes (its usage at the end, as
    vLLM orders it)."""
    start = b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
    start += b'"message":{"role":"assistant","content":"'
    end = b'"},"finish_reason":"stop"}],'
    end += b'"usage":{"prompt_tokens":1,"completion_tokens":7,"total_tokens":8}}'
    return start + b"x" * (size - len(start) - len(end)) + end


def big(size: int, framed: bool) -> Case:
    """A well-formed answer of `size` bytes, sent as fast as taken (chunked when
    `framed`, else with its Content-Length); made once per engine process."""
    made: list[bytes] = []

    def case(sock: socket.socket) -> None:
        if not made:
            made.append(big_json(size))
        body = made[0]
        if framed:
            sock.sendall(JSON_CHUNKED)
            for i in range(0, len(body), MiB):
                sock.sendall(chunk(body[i : i + MiB]))
            sock.sendall(b"0\r\n\r\n")
        else:
            sock.sendall(answer(body=body))

    return case


GOOD_STREAM = CHUNKED + chunk(EVENT) + chunk(EVENT) + chunk(DONE) + b"0\r\n\r\n"

CASES: dict[str, Case] = {
    # -- well-formed, for contrast ---------------------------------------------------
    "good": once(answer()),
    "good_chunked": pieces(JSON_CHUNKED + chunk(OK_JSON[:20]), chunk(OK_JSON[20:]) + b"0\r\n\r\n"),
    "informational_then_good": once(b"HTTP/1.1 100 Continue\r\n\r\n" + answer()),
    "sse_good": once(GOOD_STREAM),
    "sse_crlf_split": pieces(
        CHUNKED + chunk(EVENT.replace(b"\n", b"\r\n")[:-3]),
        chunk(EVENT.replace(b"\n", b"\r\n")[-3:]),
        chunk(DONE.replace(b"\n", b"\r\n")[:-1]),
        chunk(DONE.replace(b"\n", b"\r\n")[-1:]) + b"0\r\n\r\n",
    ),
    # -- chunk sizes ---------------------------------------------------------------
    # After a chunk's CRLF, -6 took the old parser back onto that CRLF and the same
    # size line, forever, without yielding: the gateway froze.
    "chunk_negative": once(JSON_CHUNKED + b"5\r\nhello\r\n-6\r\nhello!\r\n0\r\n\r\n"),
    "chunk_0x": once(JSON_CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n"),
    "chunk_underscore": once(JSON_CHUNKED + b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n"),
    "chunk_plus": once(JSON_CHUNKED + b"+5\r\nhello\r\n0\r\n\r\n"),
    "chunk_space": once(JSON_CHUNKED + b"5 \r\nhello\r\n0\r\n\r\n"),
    "chunk_huge": once(JSON_CHUNKED + b"1" + b"0" * 20 + b"\r\nhello\r\n0\r\n\r\n"),
    "chunk_size_endless": forever(JSON_CHUNKED, b"0"),
    # -- chunk extensions, chunk ends, trailers --------------------------------------------
    "chunk_ext_nul": once(JSON_CHUNKED + b"5;a=\x00\r\nhello\r\n0\r\n\r\n"),
    "chunk_ext_bare_lf": once(JSON_CHUNKED + b"5;a\nhello\r\n0\r\n\r\n"),
    "chunk_ext_endless": forever(JSON_CHUNKED + b"5;", b"a"),
    "chunk_data_overrun": once(JSON_CHUNKED + b"5\r\nhelloXX\r\n0\r\n\r\n"),
    "chunk_cut": pieces(JSON_CHUNKED + b"10\r\nhello", close=True),
    "trailer_malformed": once(JSON_CHUNKED + chunk(OK_JSON) + b"0\r\nnot a field\r\n\r\n"),
    "trailer_bare_lf": once(JSON_CHUNKED + chunk(OK_JSON) + b"0\r\n\n"),
    "trailer_endless": forever(JSON_CHUNKED + chunk(OK_JSON) + b"0\r\nx-t: ", b"a"),
    # -- status lines and versions -----------------------------------------------------
    "status_42": once(answer(b"42 Odd")),
    "status_600": once(answer(b"600 Odd")),
    "status_999": once(answer(b"999 Odd")),
    "status_line_garbage": once(b"garbage\r\n\r\n"),
    "status_reason_nul": once(answer(b"200 O\x00K")),
    "version_2": once(answer().replace(b"HTTP/1.1", b"HTTP/2.0", 1)),
    "version_1_3": once(answer().replace(b"HTTP/1.1", b"HTTP/1.3", 1)),
    "switch_protocols": once(head(b"HTTP/1.1 101 Switching Protocols", b"upgrade: x") + b"zz"),
    "informational_flood": forever(b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
    # -- header lines -----------------------------------------------------------------
    "header_bare_lf": once(answer(b"200 OK", b"x-request-id: a\nset-cookie: b")),
    "header_bare_cr": once(answer(b"200 OK", b"x-request-id: a\rset-cookie: b")),
    "header_nul": once(answer(b"200 OK", b"x-request-id: a\x00b")),
    "header_folded": once(answer(b"200 OK", b"x-request-id: a\r\n b")),
    "header_space_before_colon": once(answer(b"200 OK", b"x-request-id : a")),
    "head_too_large": once(
        answer(b"200 OK", *[b"x-pad-%d: %s" % (i, b"p" * 1000) for i in range(100)])
    ),
    "head_endless": forever(b"HTTP/1.1 200 OK\r\nx-pad: ", b"p"),
    "head_cut": pieces(b"HTTP/1.1 200 OK\r\ncontent-le", close=True),
    "no_answer": pieces(close=True),
    # -- framing ----------------------------------------------------------------------
    "length_short": pieces(head(b"HTTP/1.1 200 OK", b"content-length: 500") + OK_JSON, close=True),
    "length_long": once(head(b"HTTP/1.1 200 OK", b"content-length: 5") + OK_JSON),
    "length_twice_same": once(
        head(b"HTTP/1.1 200 OK", b"content-length: 5", b"content-length: 5") + b"hello"
    ),
    "length_twice_different": once(
        head(b"HTTP/1.1 200 OK", b"content-length: 5", b"content-length: 6") + b"hello!"
    ),
    "length_list": once(head(b"HTTP/1.1 200 OK", b"content-length: 5, 5") + b"hello"),
    "length_negative": once(head(b"HTTP/1.1 200 OK", b"content-length: -5") + b"hello"),
    "length_and_chunked": once(
        head(b"HTTP/1.1 200 OK", b"content-length: 5", b"transfer-encoding: chunked")
        + b"5\r\nhello\r\n0\r\n\r\n"
    ),
    "coding_gzip": once(head(b"HTTP/1.1 200 OK", b"transfer-encoding: gzip") + b"hello"),
    "coding_chunked_twice": once(
        head(b"HTTP/1.1 200 OK", b"transfer-encoding: chunked, chunked") + b"0\r\n\r\n"
    ),
    "coding_two_fields": once(
        head(b"HTTP/1.1 200 OK", b"transfer-encoding: chunked", b"transfer-encoding: chunked")
        + b"0\r\n\r\n"
    ),
    "second_response": once(answer() + answer()),
    # -- sizes and time ------------------------------------------------------------------
    "huge_declared": flood(
        head(b"HTTP/1.1 200 OK", b"content-length: %d" % (256 * MiB)), 256 * MiB, False
    ),
    "huge_chunked": flood(JSON_CHUNKED, 256 * MiB, True),
    "huge_until_close": flood(head(b"HTTP/1.1 200 OK"), 256 * MiB, False),
    "tiny_chunks_forever": forever(JSON_CHUNKED, b"1\r\nx\r\n"),
    # Within max_response_bytes, but more than a few at once fit no buffer budget.
    "big_60": big(60 * MiB, False),
    "big_60_chunked": big(60 * MiB, True),
    "slow_body": dribble(head(b"HTTP/1.1 200 OK", b"content-length: 1000")),
    "slow_error_body": dribble(head(b"HTTP/1.1 400 Bad Request", b"content-length: 1000")),
    "cut_error_body": pieces(
        head(b"HTTP/1.1 400 Bad Request", b"content-length: 1000") + b'{"error":', close=True
    ),
    # -- streams -----------------------------------------------------------------------
    "sse_forever": forever(CHUNKED, chunk(EVENT)),
    "sse_huge_event": forever(CHUNKED + chunk(b"data: "), chunk(b"a" * 65536)),
    "sse_huge_event_later": forever(CHUNKED + chunk(EVENT) + chunk(b"data: "), chunk(b"a" * 65536)),
    "sse_chunk_negative_later": pieces(CHUNKED + chunk(EVENT), b"-6\r\nhello!\r\n"),
    "sse_cut_later": pieces(CHUNKED + chunk(EVENT), chunk(EVENT)[:10], close=True),
}


class Engine:
    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.requests: list[tuple[int, str]] = []
        self.closed_by_peer: list[int] = []
        self.connections = 0

    def serve(self) -> None:
        while True:
            sock, _ = self.listener.accept()
            with self.lock:
                self.connections += 1
                ident = self.connections
            threading.Thread(target=self.connection, args=(sock, ident), daemon=True).start()

    def connection(self, sock: socket.socket, ident: int) -> None:
        with sock:
            try:
                self.requests_on(sock, ident)
            except Close:
                pass  # the case ended it
            except OSError:  # the router closed it, or reset it, in the middle of a case
                self.gone(ident)

    def gone(self, ident: int) -> None:
        with self.lock:
            self.closed_by_peer.append(ident)

    def requests_on(self, sock: socket.socket, ident: int) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    self.gone(ident)
                    return
                buf += data
            head_bytes, _, buf = buf.partition(b"\r\n\r\n")
            lines = head_bytes.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                buf += sock.recv(65536)
            body, buf = buf[:length], buf[length:]
            if method == b"GET":
                self.get(sock, path)
                continue
            case = str(json.loads(body).get("case", "good"))
            with self.lock:
                self.requests.append((ident, case))
            CASES[case](sock)

    def get(self, sock: socket.socket, path: bytes) -> None:
        if path == b"/log":
            with self.lock:
                data = {"requests": self.requests, "closed_by_peer": self.closed_by_peer}
            body = json.dumps(data).encode()
        else:  # /metrics, /health
            body = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


@contextlib.contextmanager
def engine() -> Iterator[str]:
    """The hostile engine in its own process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    e = Engine()
    print(e.port, flush=True)
    e.serve()
