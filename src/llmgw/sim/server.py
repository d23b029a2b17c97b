"""The simulator's HTTP face: a plain ASGI app and the trio task that drives the engine.

One ``EngineDriver`` task owns the ``Engine``: it asks for a batch, sleeps what the batch
costs, commits it and hands each token to the request that waits for it through an
unbounded memory channel (a slow client must never stall the batch, as in a real
engine). Handlers submit requests, relay tokens as SSE or collect them, and abort
their sequence the moment the client goes away — the watcher task below turns
``http.disconnect`` into a cancellation, and the handler's ``finally`` frees the blocks.

What requests may ask for: ``max_tokens`` (or ``max_completion_tokens``) bounds the
output, else ``--default-max-tokens``; every sequence produces exactly that many tokens,
so ``ignore_eos`` is always honoured (and accepted but not needed). The finish reason is
"length" when the request set a limit and "stop" when the default ended it (as if the
model had stopped by itself). ``seed`` makes the output deterministic. ``stop``,
``temperature``, ``logprobs`` and friends are accepted and ignored; ``n`` must be 1 and
a completion prompt is one string or one list of token ids. A missing ``model`` means
the primary one.

Faults (flags or ``POST /sim/faults``; see :mod:`llmgw.sim.faults`) apply to the chat,
completion and embedding routes only, so health checks and scrapes keep passing on a
sick replica.

Side endpoints: vLLM's (``/tokenize``, ``/reset_prefix_cache``, ``/version`` and the
render routes of :mod:`llmgw.sim.render`) and SGLang's (``/get_model_info``,
``/get_server_info``, ``/flush_cache``, ``/health_generate``) always; llama-server's
``/props`` and ``/slots`` (:mod:`llmgw.sim.llamacpp`) only with the ``llamacpp``
metrics format, so a replica that looks like vLLM does not hand out a slot count.
Request bodies are validated before anything else: a malformed one is a 400 (an
unknown model a 404) in OpenAI's error shape, never a 500.

Served by llmgw's own HTTP/1.1 server (:mod:`llmgw.http.server`), like llmgw-server: the
simulator shares the benchmark machine's cores with the router it is measured against,
so its per-request cost is kept low too. TCP_NODELAY is on for every accepted
connection, so the first SSE events are not held back by Nagle.

This module is the application: its routing table and what every request goes
through (the API key, the record of passed-on headers, the fault count). The routes
are in their own modules: :mod:`~llmgw.sim.generation`, :mod:`~llmgw.sim.pooling`,
:mod:`~llmgw.sim.tokenizing` and :mod:`~llmgw.sim.info`, over the
:class:`~llmgw.sim.state.SimState` they share.
"""

from __future__ import annotations

import collections
import hmac
import signal
import urllib.parse
from collections.abc import Sequence
from typing import Any, cast

import trio

from llmgw.http import asgi
from llmgw.http.asgi import answer_non_http
from llmgw.http.server import HttpServerConfig
from llmgw.http.server import serve as http_serve
from llmgw.sim.config import SimConfig
from llmgw.sim.faults import Faults
from llmgw.sim.generation import Generation
from llmgw.sim.info import Info
from llmgw.sim.kv_publisher import KVPublisher
from llmgw.sim.pooling import Pooling
from llmgw.sim.state import SimState
from llmgw.sim.tokenizing import Tokenizing
from llmgw.sim.wire import (
    Disconnected,
    Handler,
    HTTPError,
    Receive,
    Scope,
    Send,
    parse_json,
    read_body,
    send_bytes,
    send_json,
)
from llmgw.units import Address
from llmgw.version import __version__

#: SimConfig with them: what serve() and SimApp are given.
__all__ = ["SimApp", "SimConfig", "describe", "serve"]

#: Paths an ``api_key`` does not guard (as vLLM leaves its probes and metrics open).
_OPEN_PATHS = frozenset(
    {"/health", "/version", "/metrics", "/sim/faults", "/sim/requests", "/props", "/slots"}
)

#: Requests GET /sim/requests remembers.
SEEN_REQUESTS = 64
_PASSED_ON = (b"x-request-id", b"traceparent", b"tracestate")


def _seen(scope: Scope) -> dict[str, Any]:
    headers = {bytes(k): bytes(v) for k, v in scope["headers"]}
    return {
        "method": scope["method"],
        "path": scope["path"],
        **{k.decode(): headers[k].decode("latin-1") for k in _PASSED_ON if k in headers},
        "authorized": b"authorization" in headers,  # never the secret itself
    }


class SimApp:
    """The ASGI application; `driver.run()` must be running in the same trio run."""

    def __init__(self, config: SimConfig, kv_publisher: KVPublisher | None = None) -> None:
        self.config = config
        self.state = state = SimState(config, kv_publisher)
        self.engine = state.engine
        self.driver = state.driver
        # What the last requests carried that a gateway should pass on (GET /sim/requests).
        self._seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=SEEN_REQUESTS)
        gen, pool, tok, info = Generation(state), Pooling(state), Tokenizing(state), Info(state)
        self._stored_response = gen.stored_response
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): gen.chat,
            ("POST", "/v1/completions"): gen.completions,
            ("POST", "/v1/embeddings"): pool.embeddings,
            ("POST", "/v1/chat/completions/render"): tok.chat_render,
            ("POST", "/v1/completions/render"): tok.completions_render,
            ("GET", "/v1/models"): info.models,
            ("GET", "/health"): info.health,
            ("GET", "/metrics"): info.metrics,
            ("GET", "/version"): info.version,
            ("POST", "/reset_prefix_cache"): info.reset_prefix_cache,
            ("POST", "/flush_cache"): info.reset_prefix_cache,  # SGLang's name for it
            ("GET", "/get_model_info"): info.model_info,
            ("GET", "/get_server_info"): info.server_info,
            ("GET", "/health_generate"): info.health,  # SGLang's deep probe
            ("POST", "/tokenize"): tok.tokenize,
            ("POST", "/v1/responses"): gen.responses,
            ("POST", "/v1/audio/transcriptions"): pool.audio,
            ("POST", "/v1/audio/translations"): pool.audio,
            ("POST", "/detokenize"): tok.detokenize,
            ("POST", "/v1/rerank"): pool.rerank,
            ("POST", "/rerank"): pool.rerank,
            ("POST", "/v2/rerank"): pool.rerank,
            ("POST", "/v1/score"): pool.score,
            ("POST", "/score"): pool.score,
            ("GET", "/sim/faults"): self._get_faults,
            ("POST", "/sim/faults"): self._set_faults,
            ("GET", "/sim/requests"): self._requests,
        }
        if config.metrics_format == "llamacpp":
            # llama-server's own side endpoints, only where its metric names are: a
            # replica that looks like vLLM must not answer /props with its slot count.
            self._routes[("GET", "/props")] = info.props
            self._routes[("GET", "/slots")] = info.slot_list
        if config.serves_messages:
            self._routes[("POST", "/v1/messages")] = gen.messages
            self._routes[("POST", "/v1/messages/count_tokens")] = gen.count_tokens
        # The routes whose requests count towards faults.exit_after.
        self._counted = (gen.chat, gen.completions, pool.embeddings)
        self._asleep = False
        if config.sleep_mode:
            self._routes[("POST", "/sleep")] = self._sleep
            self._routes[("POST", "/wake_up")] = self._wake_up
            self._routes[("GET", "/is_sleeping")] = self._is_sleeping

    @property
    def faults(self) -> Faults:
        return self.state.faults.current

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await answer_non_http(scope, receive, send)
            return
        route = self._routes.get((scope["method"], scope["path"]))
        if route is None and scope["path"].startswith("/v1/responses/"):
            route = self._stored_response
        if not scope["path"].startswith(("/sim/", "/metrics")):
            self._seen.append(_seen(scope))
        try:
            if self.config.api_key is not None and scope["path"] not in _OPEN_PATHS:
                self._check_api_key(scope)
            if route is None:
                if any(path == scope["path"] for _, path in self._routes):
                    raise HTTPError(405, f"method {scope['method']} not allowed here")
                raise HTTPError(404, f"no route for {scope['path']}", code="not_found")
            if self._asleep and scope["path"].startswith("/v1/"):
                raise HTTPError(503, "the engine is asleep: POST /wake_up first", code="asleep")
            await route(scope, receive, send)
        except HTTPError as e:
            await send_json(send, e.status, e.body())
        except Disconnected:
            pass
        finally:
            if route in self._counted:
                self.state.faults.count_served()

    def _check_api_key(self, scope: Scope) -> None:
        expected = f"Bearer {self.config.api_key}".encode()
        given = asgi.header(scope, b"authorization") or b""
        if not hmac.compare_digest(given, expected):
            raise HTTPError(401, "Unauthorized", code="unauthorized")

    async def _sleep(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's POST /sleep?level=1|2: the weights leave the GPU (here: nothing to
        free), generation stops until /wake_up."""
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode())
        level = query.get("level", ["1"])[-1]
        if level not in ("1", "2"):
            raise HTTPError(400, f"level must be 1 or 2, got {level!r}", code="bad_level")
        self._asleep = True
        await send_bytes(send, 200, b"", [])

    async def _wake_up(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's POST /wake_up: the weights back on the GPU, in `wake_delay`."""
        if self._asleep:
            await trio.sleep(self.config.wake_delay)
            self._asleep = False
        await send_bytes(send, 200, b"", [])

    async def _is_sleeping(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"is_sleeping": self._asleep})

    async def _requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The last requests (oldest first): method, path and the headers a gateway
        should pass on (request id, trace context; whether credentials came)."""
        await send_json(send, 200, {"requests": list(self._seen)})

    async def _get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.faults.to_json())

    async def _set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        changes = parse_json(await read_body(scope, receive))
        try:
            faults = self.state.faults.change(changes)
        except (ValueError, TypeError) as e:
            raise HTTPError(400, str(e)) from None
        await send_json(send, 200, faults.to_json())


async def serve(
    config: SimConfig,
    *,
    shutdown: trio.Event | None = None,
    kv_publisher: KVPublisher | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT or SIGTERM, or, when `shutdown` is given, until it is set
    (then signals are left to the caller: an engine embedded in a process does not
    take over its Ctrl-C); `task_status` gets the bound URLs."""
    owned = None
    if kv_publisher is None and config.kv_events_endpoint is not None:
        kv_publisher = owned = KVPublisher(
            config.kv_events_endpoint, config.kv_events_topic, config.kv_events_replay_endpoint
        )
    try:
        await _serve(config, shutdown, kv_publisher, task_status)
    finally:
        if owned is not None:
            owned.close()


async def _serve(
    config: SimConfig,
    shutdown: trio.Event | None,
    kv_publisher: KVPublisher | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    app = SimApp(config, kv_publisher)
    http_config = HttpServerConfig(header_timeout=None, graceful_timeout=2.0)
    own_signals = shutdown is None
    stop = trio.Event() if shutdown is None else shutdown

    async def watch_signals(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                stop.set()
                return

    async with trio.open_nursery() as nursery:

        async def http(task_status: trio.TaskStatus[list[str]]) -> None:
            await http_serve(
                cast(Any, app),  # its Scope/Receive/Send are stricter than ASGI's
                Address(config.host, config.port),
                http_config,
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()  # the engine driver never returns by itself

        if own_signals:
            await nursery.start(watch_signals)
        nursery.start_soon(app.driver.run)
        if kv_publisher is not None:
            nursery.start_soon(kv_publisher.serve_replay)
        task_status.started(await nursery.start(http))


def describe(config: SimConfig, binds: Sequence[str]) -> str:
    """The line `llmgw-sim` prints once it listens on `binds` (URLs)."""
    where = ", ".join(url.removeprefix("http://") for url in binds)
    persona = f"personality {config.personality}, " if config.personality else ""
    return (
        f"llmgw-sim {__version__}: listening on {where}, serving {', '.join(config.models)} "
        f"({persona}{config.metrics_format} metrics, max_num_seqs={config.engine.max_num_seqs}, "
        f"kv_blocks={config.engine.num_blocks})"
    )
