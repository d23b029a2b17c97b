"""`import llmgw`: a gateway assembled and served from Python, in one trio process."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import trio

import llmgw

from .procs import sim


async def test_router_serves_from_a_library_caller() -> None:
    with sim(model="m") as (_, base):
        # Bound here, on port 0: the caller knows the port before the server starts.
        (client_socket,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        admin_sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = client_socket.socket.getsockname()[1]
        config = llmgw.load_config(
            data={
                "listen": "127.0.0.1:0",
                "admin_listen": "127.0.0.1:0",
                "endpoints": [{"id": "s0", "url": base, "models": ["m"]}],
            },
            environ={},
        )
        records: list[llmgw.UsageRecord] = []

        class Collect:
            def record(self, record: llmgw.UsageRecord) -> None:
                records.append(record)

        stop = trio.Event()
        async with (
            llmgw.assemble(
                config,
                usage_sinks=[Collect()],
                client_listeners=[client_socket],
                admin_listeners=admin_sockets,
            ) as gateway,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(partial(llmgw.serve, gateway, shutdown=stop, handle_signals=False))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                r = await client.post(
                    "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}
                )
            assert r.status_code == 200
            stop.set()
        assert len(records) == 1
        assert records[0].model == "m" and records[0].endpoint == "s0"
        assert records[0].usage.completion_tokens == 3 and not records[0].usage.estimated


async def test_under_a_server_without_the_watch_extension_a_disconnect_cancels() -> None:
    """Under an ASGI server that does not offer WATCH_DISCONNECT (hypercorn serves the
    TLS client port), the router waits on receive() in a task of the request's own."""
    with sim(model="m") as (_, base):
        router = _router(base)
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        body += b'"max_tokens": 5000, "stream": true}'
        first_event = trio.Event()

        async def leave() -> dict[str, object]:
            await first_event.wait()
            return {"type": "http.disconnect"}

        receive = _receive(body, leave)

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                first_event.set()

        scope = _chat_scope()
        with trio.fail_after(30):
            await router.app(scope, receive, send)  # returns once the stream is cut
        await router.engine_client.aclose()
        _assert_one_disconnect_and_nothing_in_flight(router)


async def test_a_client_gone_at_a_send_is_counted_as_a_disconnect() -> None:
    """The server may notice a client that left at a send (the write fails) before its
    receive() reports http.disconnect: the router counts it either way. (A CI run with
    a second copy of the suite beside it caught the send path winning, and the
    disconnect uncounted.)"""
    with sim(model="m") as (_, base):
        router = _router(base)
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        body += b'"max_tokens": 500, "stream": true}'
        receive = _receive(body, _stay)  # never a disconnect: only the send says so
        bodies = 0

        async def send(message: dict[str, object]) -> None:
            nonlocal bodies
            if message["type"] == "http.response.body":
                bodies += 1
                if bodies == 2:
                    raise OSError("the client has gone")

        scope = _chat_scope()
        with trio.fail_after(30):
            try:
                await router.app(scope, receive, send)
            except BaseException as exc:  # the failed send, as the server would see it
                if isinstance(exc, BaseExceptionGroup):
                    assert exc.split(OSError)[1] is None, exc
                else:
                    assert isinstance(exc, OSError), exc
        await router.engine_client.aclose()
        _assert_one_disconnect_and_nothing_in_flight(router)


async def test_an_injected_httpx_client_carries_unary_answers_and_streams() -> None:
    """A caller's own httpx client serves every endpoint (https:// engines take the
    same path, llmgw/http/engine_httpx.py): answers, streams and usage come through."""
    with sim(model="m") as (_, base):
        async with httpx.AsyncClient() as injected:
            router = _router(base, upstream=injected)
            for stream in (False, True):
                body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                body += b'"max_tokens": 4, "stream": %s}' % (b"true" if stream else b"false")
                with trio.fail_after(30):
                    sent = await _call(router, body)
                assert sent[0]["status"] == 200
                text = b"".join(m.get("body", b"") for m in sent[1:])  # type: ignore[misc]
                if stream:
                    assert text.rstrip().endswith(b"data: [DONE]")
                    assert text.count(b'"delta"') >= 4
                else:
                    assert json.loads(text)["usage"]["completion_tokens"] == 4
            assert router.engine_client.pool._targets == {}  # llmgw's own client never dialled
            served = router.metrics.registry.get_sample_value(
                "llmgw_completion_tokens_total", {"model": "m", "endpoint": "s0"}
            )
            assert served == 8
            # The stream's gaps between writes, in the inter-token latency histogram.
            gaps = router.metrics.registry.get_sample_value(
                "llmgw_inter_token_latency_seconds_count", {"model": "m"}
            )
            assert gaps is not None and gaps >= 1
            every = router.metrics.registry.get_sample_value(
                "llmgw_inter_token_latency_seconds_bucket", {"model": "m", "le": "+Inf"}
            )
            assert every == gaps
            text = (await router.metrics_text()).decode()
            assert 'llmgw_inter_token_latency_seconds_bucket{le="0.001",model="m"}' in text


async def _call(router: llmgw.Router, body: bytes) -> list[dict[str, object]]:
    """The messages the router's app sends for one chat request with `body`."""
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await router.app(_chat_scope(), _receive(body, _stay), send)
    return sent


Message = dict[str, object]


def _receive(
    body: bytes, then: Callable[[], Awaitable[Message]]
) -> Callable[[], Awaitable[Message]]:
    """An ASGI receive() that gives `body` whole, then whatever `then` gives."""
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


async def _stay() -> Message:
    """A client that stays to the end."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _router(base: str, upstream: httpx.AsyncClient | None = None) -> llmgw.Router:
    """A Router with no store in front of the one engine at `base` (model m)."""
    config = llmgw.load_config(
        data={
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "store": {"url": ""},
            "endpoints": [{"id": "s0", "url": base, "models": ["m"]}],
        },
        environ={},
    )
    return llmgw.Router(config, upstream=upstream)


def _chat_scope() -> dict[str, object]:
    """An ASGI scope of a chat request, as a server without extensions makes it."""
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
    }


def _assert_one_disconnect_and_nothing_in_flight(router: llmgw.Router) -> None:
    counted = router.metrics.registry.get_sample_value(
        "llmgw_client_disconnects_total", {"model": "m", "phase": "stream"}
    )
    assert counted == 1
    assert router.endpoints.get("s0").inflight == 0  # type: ignore[union-attr]
