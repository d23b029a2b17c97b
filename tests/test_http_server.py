"""llmgw.http.server, the listeners' HTTP/1.1 server, driven over loopback with raw bytes.

Each test serves a small ASGI app in-process on 127.0.0.1 (port 0) and talks to it
through a trio socket, so that it controls exactly which bytes go out and when;
responses are parsed with h11 (an independent parser). Every wait is bounded.
"""

from __future__ import annotations

import http
import json
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from email.utils import parsedate_to_datetime
from typing import Any

import h11
import pytest
import trio

from llmgw.http import request as request_module
from llmgw.http import server as server_module
from llmgw.http.asgi import WATCH_DISCONNECT
from llmgw.http.server import MAX_HEAD_BYTES, WATCH_AFTER, HttpServerConfig, serve
from llmgw.units import Address

WAIT = 5.0  # any single wait in these tests; far above what each should take


class App:
    """Routes for the tests; records what it saw."""

    def __init__(self) -> None:
        self.calls = 0
        self.watching = trio.Event()  # /watch has its request and waits for the client
        self.disconnected = trio.Event()
        self.holding = trio.Event()  # /slow has its request and waits for `release`
        self.release = trio.Event()
        self.gone = 0  # on_gone calls of the WATCH_DISCONNECT extension
        self.left = trio.Event()  # set by each of them
        self.extension_watching = trio.Event()  # /extwatch holds its request, watched

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        path = scope["path"]
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"one", b"", b"two", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/boom":
            raise RuntimeError("boom")
        if path == "/nothing":
            return
        if path == "/early":  # answers without reading the body
            await self._json(send, 413, {"early": True})
            return
        body = await self._body(receive)
        if body is None:
            return
        if path == "/watch":
            self.watching.set()
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
            return
        if path in ("/extwatch", "/extslow", "/extquick"):
            # The server's own watch, as llmgw's router uses it: cancel on a disconnect.
            watch = scope["extensions"][WATCH_DISCONNECT]
            with trio.CancelScope() as cancel:

                def on_gone() -> None:
                    self.gone += 1
                    self.left.set()
                    cancel.cancel()

                watching = watch(on_gone)
                assert watching is not None  # the body is read
                with watching:
                    if path == "/extwatch":
                        self.extension_watching.set()
                        await trio.sleep_forever()  # until the client leaves
                    if path == "/extslow":  # answered while watched
                        await trio.sleep(WATCH_AFTER * 1.5)
                    await self._json(send, 200, {"path": path, "body": body.decode()})
            return
        if path == "/slow":
            self.holding.set()
            await self.release.wait()
        await self._json(
            send,
            200,
            {
                "method": scope["method"],
                "path": scope["path"],
                "raw_path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "version": scope["http_version"],
                "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
                "body": body.decode(),
            },
        )

    @staticmethod
    async def _body(receive: Any) -> bytes | None:
        parts = []
        while True:
            message: MutableMapping[str, Any] = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message["body"])
            if not message["more_body"]:
                return b"".join(parts)

    @staticmethod
    async def _json(send: Any, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Server:
    def __init__(self, app: App, port: int, expiries: list[int], stop: trio.Event) -> None:
        self.app = app
        self.port = port
        self.expiries = expiries
        self.stop = stop
        self.done = trio.Event()


@asynccontextmanager
async def running(asgi: Any = None, **config: Any) -> AsyncIterator[Server]:
    """A server on a loopback port; its app is a fresh `App` unless `asgi` is given."""
    app = App()
    stop = trio.Event()
    expiries: list[int] = []
    settings = HttpServerConfig(on_header_timeout=lambda: expiries.append(1), **config)
    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[Any]) -> None:
            await serve(
                asgi or app,
                Address("127.0.0.1", 0),
                settings,
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
            server.done.set()

        urls = await nursery.start(run)
        server = Server(app, int(urls[0].rsplit(":", 1)[1]), expiries, stop)
        yield server
        stop.set()


class Client:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def request(
        self, method: str, path: str, body: bytes | None = None, extra: list[Any] | None = None
    ) -> None:
        """Send a request framed by this client's h11, which then parses its answer."""
        headers = [("host", "t"), *(extra or [])]
        if body is not None:
            headers.append(("content-length", str(len(body))))
        data = self.h11.send(h11.Request(method=method, target=path, headers=headers))
        if body:
            data += self.h11.send(h11.Data(data=body))
        await self.send(data + self.h11.send(h11.EndOfMessage()))

    async def response(self) -> tuple[h11.Response, bytes]:
        """One whole response; ready for the next one after."""
        head: h11.Response | None = None
        body = b""
        with trio.fail_after(WAIT):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    head = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                        self.h11.start_next_cycle()
                    return head, body
                elif isinstance(event, h11.InformationalResponse):
                    continue
                else:
                    raise AssertionError(f"unexpected {event!r}")

    async def raw_until(self, marker: bytes) -> bytes:
        got = b""
        with trio.fail_after(WAIT):
            while marker not in got:
                chunk = await self.stream.receive_some(65536)
                assert chunk, f"closed before {marker!r}; got {got!r}"
                got += chunk
        return got

    async def raw_until_closed(self) -> bytes:
        got = b""
        with trio.fail_after(WAIT):
            while chunk := await self.stream.receive_some(65536):
                got += chunk
        return got

    async def closed(self) -> bool:
        with trio.fail_after(WAIT):
            return await self.stream.receive_some(65536) == b""


@asynccontextmanager
async def connect(server: Server) -> AsyncIterator[Client]:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        yield Client(stream)


def request(method: str, path: str, body: bytes = b"") -> bytes:
    """Raw bytes of a request with a sized body, for tests that bypass h11."""
    return b"%s %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s" % (
        method.encode(),
        path.encode(),
        len(body),
        body,
    )


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


async def test_keep_alive_serves_requests_one_after_another_on_one_connection() -> None:
    async with running() as server, connect(server) as client:
        for i in range(3):
            await client.request("POST", f"/echo?i={i}", b"body%d" % i)
            head, body = await client.response()
            seen = json.loads(body)
            assert head.status_code == 200
            assert (seen["path"], seen["query"], seen["body"]) == ("/echo", f"i={i}", f"body{i}")
            assert header(head, b"connection") is None
            date = header(head, b"date") or b""
            assert parsedate_to_datetime(date.decode()).tzinfo is not None  # RFC 9110 form
        assert server.app.calls == 3


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running() as server, connect(server) as client:
        await client.send(b"".join(request("POST", f"/p{i}", b"x" * i) for i in range(1, 4)))
        raw = await client.raw_until(b'"body": "xxx"}')
        answers = [json.loads(r.partition(b"\r\n\r\n")[2]) for r in raw.split(b"HTTP/1.1 ")[1:]]
        assert [(a["path"], a["body"]) for a in answers] == [
            ("/p1", "x"),
            ("/p2", "xx"),
            ("/p3", "xxx"),
        ]


async def test_scope_carries_decoded_path_lowercased_headers_and_version() -> None:
    async with running() as server, connect(server) as client:
        await client.send(b"GET /a%20b?q=%20 HTTP/1.1\r\nHost: t\r\nX-Thing:  v1 \r\n\r\n")
        raw = await client.raw_until(b"]]")
        seen = json.loads(raw.partition(b"\r\n\r\n")[2])
        assert seen["path"] == "/a b"
        assert seen["raw_path"] == "/a%20b"
        assert seen["query"] == "q=%20"
        assert seen["version"] == "1.1"
        assert ["x-thing", "v1"] in seen["headers"]


async def test_a_chunked_request_body_with_extensions_and_trailers_is_reassembled() -> None:
    body = b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: y\r\n\r\n"
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with running() as server, connect(server) as client:
        # In pieces, so the parser meets every boundary mid-read.
        await client.send(head)
        for i in range(0, len(body), 7):
            await client.send(body[i : i + 7])
            await trio.sleep(0.005)  # a slow client: each piece a read of its own
        raw = await client.raw_until(b'"}')
        assert json.loads(raw.partition(b"\r\n\r\n")[2])["body"] == "Wikipedia in\r\n\r\nchunks."
        await client.request("GET", "/after")  # the connection is still in step
        assert json.loads((await client.response())[1])["path"] == "/after"


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    async with running() as server, connect(server) as client:
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
        )
        with trio.fail_after(WAIT):
            interim = await client.stream.receive_some(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"hello")
        answer = await client.raw_until(b'"body": "hello"}')
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_response_without_length_is_chunked_and_a_sized_one_is_one_write() -> None:
    async with running() as server, connect(server) as client:
        await client.request("GET", "/stream")
        head, body = await client.response()
        assert header(head, b"transfer-encoding") == b"chunked"
        assert body == b"onetwothree"
        await client.request("POST", "/echo", b"abc")
        with trio.fail_after(WAIT):
            first = await client.stream.receive_some(65536)
        # Head and body in the first read: the head was held for the body.
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert first.endswith(b'"body": "abc"}')


async def test_http_1_0_gets_one_response_framed_by_closing() -> None:
    async with running() as server, connect(server) as client:
        await client.send(b"GET /stream HTTP/1.0\r\n\r\n")
        raw = await client.raw_until_closed()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"connection: close" in head
        assert b"transfer-encoding" not in head
        assert body == b"onetwothree"


async def test_head_gets_the_headers_and_no_body() -> None:
    async with running() as server, connect(server) as client:
        await client.request("HEAD", "/echo")
        head, body = await client.response()
        assert int(header(head, b"content-length") or 0) > 0
        assert body == b""
        await client.request("GET", "/next")  # nothing stray was left on the connection
        assert json.loads((await client.response())[1])["path"] == "/next"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (
            b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\nX: y\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : t\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: y\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"GET nowhere HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nHost: t\r\nExpect: magic\r\n\r\n", 417),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n", 431),
    ],
    ids=[
        "length-and-chunked",
        "other-coding",
        "two-lengths",
        "signed-length",
        "bare-lf",
        "bare-cr",
        "folded-line",
        "space-before-colon",
        "no-host",
        "two-hosts",
        "bad-method",
        "bad-target",
        "http2",
        "expect",
        "huge-head",
    ],
)
async def test_a_request_the_server_cannot_frame_safely_is_refused_and_closed(
    raw: bytes, status: int
) -> None:
    async with running() as server, connect(server) as client:
        await client.send(raw)
        answer = await client.raw_until_closed()  # refused, then the connection closes
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status)
        error = json.loads(body)["error"]  # the OpenAI shape, like every llmgw error
        assert error["message"] and error["type"] == "invalid_request_error"
        assert error["code"] == http.HTTPStatus(status).phrase.lower().replace(" ", "_")
        assert "param" in error
        assert server.app.calls == 0


async def test_a_request_line_with_runs_of_spaces_is_read_on_word_boundaries() -> None:
    # RFC 9112 3 lets a recipient parse the request line on whitespace runs (llhttp
    # does); the target is still the one word, so nothing is smuggled.
    async with running() as server, connect(server) as client:
        await client.send(b"GET /a  HTTP/1.1\r\nHost: t\r\n\r\n")
        answer = await client.raw_until(b"}")
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["path"] == "/a"


async def test_a_malformed_chunked_body_is_a_400_and_the_app_sees_a_disconnect() -> None:
    async with running() as server, connect(server) as client:
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        answer = await client.raw_until_closed()
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"chunk size" in answer
        assert server.app.calls == 1


async def test_an_app_error_is_a_500_and_an_app_without_answer_too() -> None:
    async with running() as server:
        for path in ("/boom", "/nothing"):
            async with connect(server) as client:
                await client.send(request("GET", path))
                answer = await client.raw_until_closed()
                assert answer.startswith(b"HTTP/1.1 500 ")
                assert b"connection: close" in answer


async def test_the_app_learns_of_a_client_that_leaves_after_its_request() -> None:
    async with running() as server:
        async with connect(server) as client:
            await client.send(request("POST", "/watch", b"{}"))
            with trio.fail_after(WAIT):
                await server.app.watching.wait()  # the request is the app's: now leave
        with trio.fail_after(WAIT):
            await server.app.disconnected.wait()


async def test_the_watch_extension_tells_of_a_client_that_leaves_and_only_then() -> None:
    async with running() as server:
        async with connect(server) as client:
            await client.send(request("POST", "/extwatch", b"{}"))
            with trio.fail_after(WAIT):
                await server.app.extension_watching.wait()  # watched: now leave
        with trio.fail_after(WAIT):
            await server.app.left.wait()
        assert server.app.gone == 1
        # Kept alive, watched each time, answered each time: the watcher hands the
        # socket back after every request, and reads a request pipelined meanwhile.
        async with connect(server) as client:
            for i in range(3):
                await client.request("POST", "/extslow", b"%d" % i)
                head, body = await client.response()
                assert head.status_code == 200 and json.loads(body)["body"] == str(i)
        # A request pipelined behind a watched one is read by the watcher, which still
        # sees the client leave after it (a half-close counts as leaving).
        async with connect(server) as client:
            server.app.extension_watching = trio.Event()
            server.app.left = trio.Event()
            await client.send(request("POST", "/extwatch", b"{}"))
            with trio.fail_after(WAIT):
                await server.app.extension_watching.wait()
            await client.send(request("GET", "/next"))
            await client.stream.send_eof()
            with trio.fail_after(WAIT):
                await server.app.left.wait()
        assert server.app.gone == 2
        async with connect(server) as client:
            await client.send(request("POST", "/extslow", b"a") + request("GET", "/after"))
            got = await client.raw_until(b'"/after"')
            assert got.count(b"HTTP/1.1 200 ") == 2
            assert got.index(b'{"path": "/extslow", "body": "a"}') < got.index(b'"/after"')
        assert server.app.gone == 2


async def test_a_request_answered_within_watch_after_is_never_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []
    real = server_module._Watcher.run

    async def counted(self: object) -> None:
        started.append(self)
        await real(self)  # type: ignore[arg-type]

    monkeypatch.setattr(server_module._Watcher, "run", counted)
    # Answered before the mark (set far off: no stall of this machine can pass it),
    # so no watcher is started.
    with monkeypatch.context() as patched:
        patched.setattr(server_module, "WATCH_AFTER", 60.0)
        async with running() as server, connect(server) as client:
            for i in range(5):
                await client.request("POST", "/extquick", b"%d" % i)
                head, body = await client.response()
                assert head.status_code == 200 and json.loads(body)["body"] == str(i)
        assert started == []
    # Held past WATCH_AFTER, a request is watched: one watcher, kept for the next ones.
    async with running() as server, connect(server) as client:
        for i in range(2):
            await client.request("POST", "/extslow", b"%d" % i)
            head, _ = await client.response()
            assert head.status_code == 200
        assert len(started) == 1
    assert server.app.gone == 0


async def test_a_failing_watcher_ends_its_connection_and_not_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running() as server:
        async with connect(server) as client:
            await client.send(request("POST", "/extwatch", b"{}"))
            with trio.fail_after(WAIT):
                await server.app.extension_watching.wait()

            def broken(self: object, data: bytes) -> None:
                raise RuntimeError("a bug in the parser")

            with monkeypatch.context() as patched:
                patched.setattr(request_module.RequestReader, "feed", broken)
                await client.send(b"GET /next HTTP/1.1\r\n")  # read by the watcher
                assert await client.closed()  # this connection ends...
        async with connect(server) as other:  # ...the server goes on
            await other.request("GET", "/after")
            head, body = await other.response()
            assert head.status_code == 200 and json.loads(body)["path"] == "/after"


async def test_an_early_answer_keeps_the_connection_only_if_the_body_came_with_it() -> None:
    async with running() as server, connect(server) as client:
        await client.request("POST", "/early", b"x" * 100)
        head, _ = await client.response()
        assert head.status_code == 413
        assert header(head, b"connection") is None  # the body was skipped: still in step
        await client.request("GET", "/next")
        assert json.loads((await client.response())[1])["path"] == "/next"
    async with running() as server, connect(server) as client:
        await client.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        answer = await client.raw_until_closed()  # the body never came: no way to skip it
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert b"connection: close" in answer


async def test_a_head_must_arrive_in_time_and_an_idle_kept_connection_is_closed() -> None:
    async with running(header_timeout=0.3, keep_alive_timeout=0.6) as server:
        async with connect(server) as client:
            await client.send(b"GET / HTTP/1.1\r\nHo")
            started = trio.current_time()
            answer = await client.raw_until_closed()
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert 0.25 <= trio.current_time() - started < 2
        async with connect(server) as client:  # silent: closed without an answer
            assert await client.raw_until_closed() == b""
        assert len(server.expiries) == 2
        async with connect(server) as client:
            await client.request("GET", "/one")
            await client.response()
            started = trio.current_time()
            assert await client.closed()  # idle after a response: the keep-alive time
            assert 0.5 <= trio.current_time() - started < 2
        assert len(server.expiries) == 2  # keep-alive expiry is not a head timeout


async def test_shutdown_closes_idle_connections_and_lets_requests_in_flight_finish() -> None:
    async with running(graceful_timeout=WAIT) as server:
        async with connect(server) as idle, connect(server) as busy:
            await idle.request("GET", "/warm")
            await idle.response()
            await busy.request("POST", "/slow", b"x")
            with trio.fail_after(WAIT):
                await server.app.holding.wait()  # in flight when the shutdown begins
            server.stop.set()
            assert await idle.closed()
            server.app.release.set()
            head, _ = await busy.response()
            assert head.status_code == 200
            assert header(head, b"connection") == b"close"
            assert await busy.closed()
        with trio.fail_after(WAIT):
            await server.done.wait()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", server.port)


async def test_requests_past_the_graceful_time_are_cancelled() -> None:
    async with running(graceful_timeout=0.2) as server, connect(server) as busy:
        await busy.send(request("POST", "/slow", b"x"))
        with trio.fail_after(WAIT):
            await server.app.holding.wait()  # in flight when the shutdown begins
        server.stop.set()
        assert await busy.raw_until_closed() == b""
        with trio.fail_after(WAIT):
            await server.done.wait()


async def test_after_a_refusal_the_server_still_takes_the_clients_bytes_for_a_while() -> None:
    # A lingering close: the server shuts its side and drains what the client still
    # sends, instead of closing with bytes unread (the kernel would answer those with
    # a reset, which can destroy the refusal before the client has read it).
    async with running() as server, connect(server) as client:
        await client.send(b"POST /early HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n")
        answer = await client.raw_until_closed()
        assert answer.startswith(b"HTTP/1.1 501 ")
        for _ in range(4):  # a closed socket would have reset the connection by now
            await client.send(b"x" * 16384)
            # The client goes on sending for a while (the behaviour under test): time
            # for a reset, had the server closed, to come back before the next send.
            await trio.sleep(0.05)
