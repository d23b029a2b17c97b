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

Faults (flags or ``POST /sim/faults``; see ``Faults``) apply to the chat, completion and
embedding routes only, so health checks and scrapes keep passing on a sick replica.

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
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import json
import math
import os
import random
import signal
import struct
import sys
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, cast

import attrs
import trio

from llmgw import __version__
from llmgw.http import asgi
from llmgw.http.asgi import answer_non_http
from llmgw.http.server import HttpServerConfig
from llmgw.http.server import serve as http_serve
from llmgw.router import anthropic
from llmgw.router.body import BodyError
from llmgw.router.forms import parse_form
from llmgw.router.messages import AnthropicSend
from llmgw.sim import llamacpp, render, responses, tokens
from llmgw.sim.metrics import CONTENT_TYPES, MetricsFormat, Recorder, exposition
from llmgw.sim.model import Engine, EngineConfig, Finished, Request, Token
from llmgw.units import Address

Scope = Mapping[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 64 * 1024 * 1024
FAULT_EXIT_CODE = 1


# -- configuration ----------------------------------------------------------------------


def _rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number between 0 and 1")
    return float(value)


def _optional_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer or null")
    return value


@attrs.frozen
class Faults:
    """Misbehaviour to inject; replaced as a whole when changed at runtime.

    * error_rate/error_status: answer that fraction of requests with an OpenAI-shaped
      error of that status, before doing anything else.
    * hang_rate: that fraction never produces anything (a stream gets its 200 headers
      first, as from a real engine) until the client gives up; no KV is held.
    * first_token_delay: every request waits this long in the engine's queue (counted
      in num_requests_waiting) before it may be scheduled, so TTFT grows by as much.
    * abort_after_chunks: a stream is cut after this many SSE events (role chunk
      included) by closing the connection, without [DONE]; non-streaming requests are
      not affected.
    * exit_after: the process exits with status 1, like a crash, once this many
      requests have been answered (counted from startup, or from when it was set at
      runtime).
    """

    error_rate: float = 0.0  # fraction of requests answered with error_status
    error_status: int = 500
    hang_rate: float = 0.0  # fraction of requests that never produce a token
    first_token_delay: float = 0.0  # seconds a request waits before it may be scheduled
    abort_after_chunks: int | None = None  # close a stream after this many SSE events
    exit_after: int | None = None  # exit the process after this many requests

    FIELDS = (
        "error_rate",
        "error_status",
        "hang_rate",
        "first_token_delay",
        "abort_after_chunks",
        "exit_after",
    )

    def __attrs_post_init__(self) -> None:
        _rate("error_rate", self.error_rate)
        _rate("hang_rate", self.hang_rate)
        if not 400 <= self.error_status <= 599:
            raise ValueError("error_status must be an HTTP error status (400-599)")
        if self.first_token_delay < 0 or not math.isfinite(self.first_token_delay):
            raise ValueError("first_token_delay must be a non-negative number of seconds")
        _optional_count("abort_after_chunks", self.abort_after_chunks)
        _optional_count("exit_after", self.exit_after)

    def merged(self, changes: Any) -> Faults:
        """These faults with the fields in `changes` replaced; ValueError if invalid."""
        if not isinstance(changes, dict):
            raise ValueError("expected a JSON object")
        unknown = sorted(set(changes) - set(self.FIELDS))
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(unknown)}")
        values: dict[str, Any] = dict(changes)
        for name in ("error_rate", "hang_rate"):
            if name in values:
                values[name] = _rate(name, values[name])
        status = values.get("error_status", self.error_status)
        if isinstance(status, bool) or not isinstance(status, int):
            raise ValueError("error_status must be an integer")
        delay = values.get("first_token_delay", self.first_token_delay)
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise ValueError("first_token_delay must be a number")
        values["first_token_delay"] = float(delay)
        for name in ("abort_after_chunks", "exit_after"):
            if name in values:
                values[name] = _optional_count(name, values[name])
        return attrs.evolve(self, **values)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}


#: Paths an ``api_key`` does not guard (as vLLM leaves its probes and metrics open).
_OPEN_PATHS = frozenset(
    {"/health", "/version", "/metrics", "/sim/faults", "/sim/requests", "/props", "/slots"}
)
_WORD_OF = dict(zip(tokens.WORD_IDS, tokens.WORDS, strict=True))


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


def _texts(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise HTTPError(400, f"'{name}' must be a string or a list of them", param=name)
    return texts


def _similarity(query: str, document: str) -> float:
    """The share of `query`'s 4-character pieces found in `document` (0 to 1)."""
    wanted = set(tokens.pieces(query.lower()))
    if not wanted:
        return 0.0
    have = set(tokens.pieces(document.lower()))
    return round(len(wanted & have) / len(wanted), 6)


@attrs.frozen
class SimConfig:
    """Everything `llmgw-sim` is started with."""

    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[str, ...] = ("sim-model",)
    engine: EngineConfig = attrs.Factory(EngineConfig)
    metrics_format: MetricsFormat = "vllm"
    default_max_tokens: int = 16
    embedding_dim: int = 384
    faults: Faults = attrs.Factory(Faults)
    #: The personality the defaults came from (llmgw.sim.personalities), if any.
    personality: str | None = None
    #: Like vLLM's ``--api-key``: the API routes want ``Authorization: Bearer <it>``
    #: (health, version, metrics and the sim's own routes stay open).
    api_key: str | None = attrs.field(default=None, repr=False)
    #: Whether ``/v1/messages`` (Anthropic's API) is served natively; None: as the
    #: engine the metrics look like does (llama.cpp yes; vLLM before it had one, no).
    messages: bool | None = None
    #: vLLM's sleep mode (``--enable-sleep-mode`` in its dev mode): POST /sleep,
    #: POST /wake_up (taking `wake_delay` seconds), GET /is_sleeping; asleep, it
    #: answers generation requests 503.
    sleep_mode: bool = False
    wake_delay: float = 1.0

    @property
    def serves_messages(self) -> bool:
        return self.metrics_format == "llamacpp" if self.messages is None else self.messages


# -- engine driver ----------------------------------------------------------------------

Output = Token | Finished


class EngineDriver:
    """Runs the engine in real (trio) time and routes its tokens to their requests."""

    def __init__(self, engine: Engine, recorder: Recorder) -> None:
        self.engine = engine
        self.recorder = recorder
        self._outputs: dict[str, trio.MemorySendChannel[Output]] = {}
        self._reasons: dict[str, str] = {}
        self._last_token_at: dict[str, float] = {}
        self._wake = trio.Event()

    def submit(self, request: Request, finish_reason: str) -> trio.MemoryReceiveChannel[Output]:
        """Queue `request`; its tokens, then its Finished, arrive on the returned channel."""
        self.engine.add(request, trio.current_time())  # ValueError for impossible requests
        send, receive = trio.open_memory_channel[Output](math.inf)
        self._outputs[request.request_id] = send
        self._reasons[request.request_id] = finish_reason
        self._wake.set()
        return receive

    def abort(self, request_id: str) -> None:
        """Forget a request and free its KV blocks now (no-op once it has finished)."""
        if self.engine.abort(request_id):
            self.recorder.finished["abort"] += 1
        self._reasons.pop(request_id, None)
        self._last_token_at.pop(request_id, None)
        channel = self._outputs.pop(request_id, None)
        if channel is not None:
            channel.close()

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            step = self.engine.begin_step(now)
            if step is None:
                wake_at = self.engine.next_wakeup(now)
                with trio.move_on_at(math.inf if wake_at is None else wake_at):
                    await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.sleep_until(step.ends)
            now = trio.current_time()
            outcome = self.engine.end_step(now)
            rec = self.recorder
            rec.stepped(outcome.step)
            for latency in outcome.first_token_latencies:
                rec.ttft.observe(latency)
            if outcome.tokens:
                rec.generated(now, len(outcome.tokens))
            for token in outcome.tokens:
                rid = token.request_id
                last = self._last_token_at.get(rid)
                if last is not None:
                    rec.itl.observe(now - last)
                self._last_token_at[rid] = now
                self._deliver(rid, token, last=False)
            for done in outcome.finished:
                rid = done.request_id
                rec.e2e.observe(done.finished_at - done.arrival)
                rec.sequence_done(done)
                rec.finished[self._reasons.pop(rid, "length")] += 1
                self._last_token_at.pop(rid, None)
                self._deliver(rid, done, last=True)

    def _deliver(self, request_id: str, output: Output, last: bool) -> None:
        channel = self._outputs.pop(request_id, None) if last else self._outputs.get(request_id)
        if channel is None:
            return
        try:
            channel.send_nowait(output)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The handler is gone without aborting; never let that stop the engine.
            self.abort(request_id)
        if last:
            channel.close()


# -- HTTP helpers -----------------------------------------------------------------------


class HTTPError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class Disconnected(Exception):
    pass


JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def start_stream(send: Send) -> None:
    """Send an SSE response's head now, before its first event (as engines do; the
    server would otherwise hold it for the first body bytes)."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": b"", "more_body": True})


async def send_bytes(send: Send, status: int, body: bytes, headers: list[Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, obj: Any) -> None:
    await send_bytes(send, status, _dumps(obj), JSON_HEADERS)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def read_body(scope: Scope, receive: Receive) -> bytes:
    try:
        return await asgi.read_body(scope, receive, MAX_BODY)
    except asgi.ClientLeft:
        raise Disconnected from None
    except asgi.BodyTooLarge:
        raise HTTPError(413, "request body too large") from None


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    except RecursionError:
        raise HTTPError(
            400, "malformed JSON body: nested too deeply", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise HTTPError(400, "the request body must be a JSON object", code="invalid_json")
    return obj


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    # The body has been read, so the only thing left to receive is the disconnect.
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def embedding(text_key: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on the input (blake2b-seeded Gaussian)."""
    seed = int.from_bytes(hashlib.blake2b(text_key, digest_size=8).digest(), "little")
    rng = random.Random(seed)
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


# -- the app ----------------------------------------------------------------------------


@attrs.frozen
class GenerationRequest:
    """A validated /v1/chat/completions or /v1/completions body."""

    chat: bool
    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    explicit_max_tokens: bool
    stream: bool
    include_usage: bool
    seed: int | None


class SimApp:
    """The ASGI application; `driver.run()` must be running in the same trio run."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.engine)
        self.recorder = Recorder()
        self.driver = EngineDriver(self.engine, self.recorder)
        self.faults = config.faults
        self._fault_rng = random.Random(config.engine.seed ^ 0x5EED)
        self._served = 0  # requests counted towards faults.exit_after
        self._ids = 0
        self._stored = responses.ResponseStore()
        # What the last requests carried that a gateway should pass on (GET /sim/requests).
        self._seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=SEEN_REQUESTS)
        self._id_prefix = uuid.uuid4().hex[:12]
        self.started = int(time.time())
        self.exposition = exposition(
            config.metrics_format,
            config.models[0],
            config.engine,
            self.engine.stats,
            self.recorder,
            trio.current_time,
        )
        self.slots = llamacpp.SlotTable(config.engine.max_num_seqs, config.engine.max_model_len)
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/v1/chat/completions/render"): self._chat_render,
            ("POST", "/v1/completions/render"): self._completions_render,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/version"): self._version,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("POST", "/flush_cache"): self._reset_prefix_cache,  # SGLang's name for it
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/health_generate"): self._health,  # SGLang's deep probe
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/v1/responses"): self._responses,
            ("POST", "/v1/audio/transcriptions"): self._audio,
            ("POST", "/v1/audio/translations"): self._audio,
            ("POST", "/detokenize"): self._detokenize,
            ("POST", "/v1/rerank"): self._rerank,
            ("POST", "/rerank"): self._rerank,
            ("POST", "/v2/rerank"): self._rerank,
            ("POST", "/v1/score"): self._score,
            ("POST", "/score"): self._score,
            ("GET", "/sim/faults"): self._get_faults,
            ("POST", "/sim/faults"): self._set_faults,
            ("GET", "/sim/requests"): self._requests,
        }
        if config.metrics_format == "llamacpp":
            # llama-server's own side endpoints, only where its metric names are: a
            # replica that looks like vLLM must not answer /props with its slot count.
            self._routes[("GET", "/props")] = self._props
            self._routes[("GET", "/slots")] = self._slots
        if config.serves_messages:
            self._routes[("POST", "/v1/messages")] = self._messages
            self._routes[("POST", "/v1/messages/count_tokens")] = self._count_tokens
        # The routes whose requests count towards faults.exit_after.
        self._counted = (self._chat, self._completions, self._embeddings)
        self._asleep = False
        if config.sleep_mode:
            self._routes[("POST", "/sleep")] = self._sleep
            self._routes[("POST", "/wake_up")] = self._wake_up
            self._routes[("GET", "/is_sleeping")] = self._is_sleeping

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
                self._count_served()

    def _check_api_key(self, scope: Scope) -> None:
        expected = f"Bearer {self.config.api_key}".encode()
        given = asgi.header(scope, b"authorization") or b""
        if not hmac.compare_digest(given, expected):
            raise HTTPError(401, "Unauthorized", code="unauthorized")

    def _next_id(self, prefix: str, sep: str = "-") -> str:
        self._ids += 1
        return f"{prefix}{sep}{self._id_prefix}{self._ids:08x}"

    # -- routes without generation -------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"", [])

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"version": __version__})

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        fmt = self.config.metrics_format
        headers = [(b"content-type", CONTENT_TYPES[fmt])]
        if fmt == "llamacpp":
            headers.append((b"process-start-time-unix", str(self.started).encode()))
        await send_bytes(send, 200, self.exposition.render(), headers)

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

    async def _props(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's /props (llamacpp format only; see llmgw.sim.llamacpp)."""
        build = f"llmgw-sim {__version__}"
        await send_json(send, 200, llamacpp.props(self.config.models, self.config.engine, build))

    async def _slots(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's /slots; ``?fail_on_no_slot=1`` answers 503 when all are busy."""
        running = self.engine.running()
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if any(query.get("fail_on_no_slot", [])) and self.slots.idle(running) == 0:
            raise HTTPError(503, "no slot available", type="unavailable_error")
        await send_json(send, 200, self.slots.slots(running))

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.started,
                "owned_by": "llmgw-sim",
                "root": self.config.models[0],
                "parent": None,
                "max_model_len": self.config.engine.max_model_len,
            }
            for name in self.config.models
        ]
        await send_json(send, 200, {"object": "list", "data": data})

    async def _reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.engine.reset_prefix_cache()
        await send_bytes(send, 200, b"", [])

    async def _model_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self.config.models[0]
        await send_json(
            send,
            200,
            {
                "model_path": name,
                "tokenizer_path": name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            },
        )

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        cfg = self.config.engine
        await send_json(
            send,
            200,
            {
                "version": f"llmgw-sim {__version__}",
                "model_path": self.config.models[0],
                "served_model_name": self.config.models[0],
                "max_running_requests": cfg.max_num_seqs,
                "max_total_num_tokens": cfg.num_blocks * cfg.block_size,
                "page_size": cfg.block_size,
                "context_length": cfg.max_model_len,
                "chunked_prefill_size": cfg.max_num_batched_tokens,
                "disable_radix_cache": not cfg.enable_prefix_caching,
                "tp_size": 1,
                "dp_size": 1,
                "host": self.config.host,
                "port": self.config.port,
            },
        )

    async def _requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The last requests (oldest first): method, path and the headers a gateway
        should pass on (request id, trace context; whether credentials came)."""
        await send_json(send, 200, {"requests": list(self._seen)})

    async def _get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.faults.to_json())

    async def _set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        changes = parse_json(await read_body(scope, receive))
        try:
            faults = self.faults.merged(changes)
        except (ValueError, TypeError) as e:
            raise HTTPError(400, str(e)) from None
        if "exit_after" in changes:
            self._served = 0  # count from now, so a running replica can be told to die soon
        self.faults = faults
        await send_json(send, 200, faults.to_json())

    # -- request parsing ------------------------------------------------------------------

    def _check_model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.config.models[0]
        if not isinstance(model, str) or model not in self.config.models:
            raise HTTPError(
                404,
                f"The model `{model}` does not exist.",
                param="model",
                code="model_not_found",
            )
        return model

    def _prompt(self, body: Mapping[str, Any], chat: bool) -> tuple[int, ...]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HTTPError(400, "'messages' must be a non-empty list", param="messages")
            try:
                return self._encode(tokens.render_chat(messages), "messages")
            except ValueError as e:
                raise HTTPError(400, str(e), param="messages") from None
        prompt = body.get("prompt")
        # A one-element batch is the same as its element; real batches are not simulated.
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self._encode(prompt, "prompt")
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
        ):
            return tuple(prompt)
        raise HTTPError(
            400,
            "'prompt' must be a string or a list of token ids (batches are not supported)",
            param="prompt",
        )

    def _encode(self, text: str, param: str) -> tuple[int, ...]:
        # Refuse an oversized prompt before paying to tokenize all of it.
        limit = self.config.engine.max_model_len
        if tokens.count(text) >= limit:
            raise HTTPError(
                400,
                f"the prompt has {tokens.count(text)} tokens; this model's maximum context "
                f"length is {limit} tokens",
                param=param,
            )
        return tuple(tokens.encode(text))

    def _generation_request(self, body: Mapping[str, Any], chat: bool) -> GenerationRequest:
        model = self._check_model(body)
        prompt = self._prompt(body, chat)
        asked, param, seed = _sampling_limits(body, chat)
        explicit = asked is not None
        if asked is None:
            room = self.config.engine.max_model_len - len(prompt)
            asked = max(1, min(self.config.default_max_tokens, room))
        limit: int = asked
        stream = body.get("stream") is True
        options = body.get("stream_options")
        include_usage = (
            stream and isinstance(options, dict) and options.get("include_usage") is True
        )
        try:
            self.engine.check(len(prompt), limit)
        except ValueError as e:
            raise HTTPError(400, str(e), param=param) from None
        return GenerationRequest(
            chat=chat,
            model=model,
            prompt=prompt,
            max_tokens=limit,
            explicit_max_tokens=explicit,
            stream=stream,
            include_usage=include_usage,
            seed=seed,
        )

    # -- render (vLLM's tokenize-only endpoints; see llmgw.sim.render) ---------------------

    def _render_prompts(self, body: Mapping[str, Any]) -> list[tuple[int, ...]]:
        """A completions body's prompts: one string or token-id list, or a batch of them."""
        prompt = body.get("prompt")
        is_ids = isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        )
        if not isinstance(prompt, list) or is_ids:
            return [self._prompt(body, chat=False)]
        if not prompt:
            raise HTTPError(400, "'prompt' must not be an empty list", param="prompt")
        out: list[tuple[int, ...]] = []
        for item in prompt:
            if not isinstance(item, str | list) or (
                isinstance(item, list) and any(isinstance(x, str | list) for x in item)
            ):
                raise HTTPError(
                    400,
                    "each 'prompt' of a batch must be a string or a list of token ids",
                    param="prompt",
                )
            out.append(self._prompt({"prompt": item}, chat=False))
        return out

    def _render(self, body: Mapping[str, Any], chat: bool) -> list[dict[str, Any]]:
        """The GenerateRequest of each prompt of `body` (one for chat)."""
        self._check_model(body)
        prompts = [self._prompt(body, chat=True)] if chat else self._render_prompts(body)
        limit, param, seed = _sampling_limits(body, chat)
        context = self.config.engine.max_model_len
        try:
            fields = render.request_fields(body)
            out: list[dict[str, Any]] = []
            for ids in prompts:
                if not ids:
                    raise HTTPError(
                        400, "the prompt is empty", param="messages" if chat else "prompt"
                    )
                room = context - len(ids)
                if room < 1 or (limit is not None and limit > room):
                    asked = f" and asks for {limit} more" if limit is not None else ""
                    raise HTTPError(
                        400,
                        f"this model's maximum context length is {context} tokens; the "
                        f"request has {len(ids)} prompt tokens{asked}",
                        param=param,
                    )
                max_tokens = room if limit is None else limit
                prefix = "chatcmpl" if chat else "cmpl"
                out.append(
                    {
                        "request_id": f"{prefix}-{uuid.uuid4().hex}",
                        "token_ids": list(ids),
                        "sampling_params": render.sampling_params(body, chat, max_tokens, seed),
                        **fields,
                    }
                )
        except render.RenderError as e:
            raise HTTPError(400, str(e), param=e.param) from None
        return out

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /tokenize: a `prompt` or chat `messages` to token ids."""
        body = parse_json(await read_body(scope, receive))
        self._check_model(body)
        ids = self._prompt(body, chat="messages" in body)
        await send_json(
            send,
            200,
            {
                "count": len(ids),
                "max_model_len": self.config.engine.max_model_len,
                "tokens": list(ids),
            },
        )

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /detokenize: token ids back to text. Ids of generated words become
        their words; any other id (prompt slices are hashed) becomes ``<id>``."""
        body = parse_json(await read_body(scope, receive))
        self._check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokens.VOCAB_SIZE
            for t in ids
        ):
            raise HTTPError(400, "'tokens' must be a list of token ids", param="tokens")
        text = "".join(_WORD_OF.get(t, f"<{t}>") for t in ids)
        await send_json(send, 200, {"prompt": text})

    async def _rerank(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's (and Jina's, Cohere's) rerank: each document scored against the query
        by the share of the query's 4-character pieces it contains, best first."""
        body = parse_json(await read_body(scope, receive))
        model = self._check_model(body)
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str):
            raise HTTPError(400, "'query' must be a string", param="query")
        if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            raise HTTPError(400, "'documents' must be a list of strings", param="documents")
        top_n = body.get("top_n", len(documents))
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
            raise HTTPError(400, "'top_n' must be a whole number", param="top_n")
        scored = sorted(
            ((i, _similarity(query, d)) for i, d in enumerate(documents)),
            key=lambda x: (-x[1], x[0]),
        )
        results = [
            {"index": i, "document": {"text": documents[i]}, "relevance_score": score}
            for i, score in scored[: top_n or len(documents)]
        ]
        used = tokens.count(query) * len(documents) + sum(tokens.count(d) for d in documents)
        await send_json(
            send,
            200,
            {
                "id": self._next_id("rerank"),
                "model": model,
                "usage": {"total_tokens": used},
                "results": results,
            },
        )

    async def _score(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /score: `text_1` against each of `text_2` (strings or lists of them)."""
        body = parse_json(await read_body(scope, receive))
        model = self._check_model(body)
        firsts, seconds = _texts(body, "text_1"), _texts(body, "text_2")
        if len(firsts) != 1 and len(firsts) != len(seconds):
            raise HTTPError(400, "'text_1' must be one text or as many as 'text_2'", param="text_1")
        pairs = [(firsts[0] if len(firsts) == 1 else firsts[i], t) for i, t in enumerate(seconds)]
        used = sum(tokens.count(a) + tokens.count(b) for a, b in pairs)
        await send_json(
            send,
            200,
            {
                "id": self._next_id("score"),
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": [
                    {"index": i, "object": "score", "score": _similarity(a, b)}
                    for i, (a, b) in enumerate(pairs)
                ],
                "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0},
            },
        )

    async def _chat_render(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        await send_json(send, 200, self._render(body, chat=True)[0])

    async def _completions_render(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        await send_json(send, 200, self._render(body, chat=False))

    # -- faults ---------------------------------------------------------------------------

    def _roll(self, rate: float) -> bool:
        return rate > 0 and self._fault_rng.random() < rate

    def _count_served(self) -> None:
        limit = self.faults.exit_after
        self._served += 1
        if limit is not None and self._served >= limit:
            _fault_exit(self._served)

    async def _faulty(
        self, receive: Receive, send: Send, work: Callable[[], Awaitable[None]], stream: bool
    ) -> None:
        """Run `work` under the injected faults, cancelling it if the client disconnects."""
        faults = self.faults
        if self._roll(faults.error_rate):
            raise HTTPError(
                faults.error_status,
                f"injected fault: HTTP {faults.error_status}",
                code="injected_fault",
            )
        error: HTTPError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
            try:
                if self._roll(faults.hang_rate):
                    if stream:  # a real engine has sent its headers by then
                        await start_stream(send)
                    await trio.sleep_forever()
                await work()
            except HTTPError as e:
                error = e  # raised outside the nursery, so it is not wrapped in a group
            finally:
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    # -- generation -----------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=True)

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's Responses API, text only; stored responses live in this process,
        so a ``previous_response_id`` made elsewhere is a 404 here, as with vLLM."""
        body = parse_json(await read_body(scope, receive))
        model = self._check_model(body)
        previous = body.get("previous_response_id")
        history: list[dict[str, Any]] = []
        if previous is not None:
            stored = self._stored.get(previous) if isinstance(previous, str) else None
            if stored is None:
                raise HTTPError(
                    404,
                    f"Response with id '{previous}' not found.",
                    param="previous_response_id",
                    code="response_not_found",
                )
            history = stored[1]
        try:
            conversation = [*history, *responses.input_messages(body)]
        except ValueError as e:
            raise HTTPError(400, str(e), param="input") from None
        limit = body.get("max_output_tokens")
        chat_body = {"model": model, "messages": conversation, "stream": body.get("stream")}
        if limit is not None:
            chat_body["max_tokens"] = limit
        req = self._generation_request(chat_body, chat=True)
        rid = self._next_id("resp", sep="_")  # vLLM's shape: resp_<hex>
        writer = responses.EventWriter(rid, model, previous)

        async def work() -> None:
            outputs, _ = self._submit(req, rid)
            try:
                if req.stream:
                    await start_stream(send)
                    await send(
                        {"type": "http.response.body", "body": writer.start(), "more_body": True}
                    )
                text: list[str] = []
                done: Finished | None = None
                async for out in outputs:
                    if isinstance(out, Token):
                        text.append(out.text)
                        if req.stream:
                            piece = writer.delta(out.text)
                            await send(
                                {"type": "http.response.body", "body": piece, "more_body": True}
                            )
                    else:
                        done = out
                if done is None:
                    raise HTTPError(500, "the request was aborted")
                usage = responses.usage_of(
                    done.prompt_tokens, done.completion_tokens, done.cached_tokens
                )
                answer = responses.response_object(
                    rid, model, "".join(text), usage, previous=previous
                )
                if body.get("store", True) is not False:
                    reply = {"role": "assistant", "content": "".join(text)}
                    self._stored.put(answer, [*conversation, reply])
                if req.stream:
                    await send({"type": "http.response.body", "body": writer.end(answer)})
                else:
                    await send_json(send, 200, answer)
            finally:
                self.driver.abort(rid)

        await self._faulty(receive, send, work, req.stream)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's ``/v1/messages``: Anthropic's API over the simulator's own chat
        generation (translated as llmgw does, so the engine answers in that shape)."""
        try:
            request = parse_json(await read_body(scope, receive))
            chat = anthropic.to_chat(request)
        except anthropic.MessagesError as e:
            await send_json(send, e.status, e.body())
            return
        reply = AnthropicSend(
            cast(asgi.Send, send),
            request["model"],
            stream=bool(chat.get("stream")),
            stop_sequences=request.get("stop_sequences"),
        )
        await self._generate_from(chat, receive, cast(Send, reply), chat=True)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            request = parse_json(await read_body(scope, receive))
            chat = anthropic.to_chat({**request, "max_tokens": 1})
        except anthropic.MessagesError as e:
            await send_json(send, e.status, e.body())
            return
        ids = self._prompt(chat, chat=True)
        await send_json(send, 200, {"input_tokens": len(ids)})

    async def _audio(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's transcription and translation: text derived from the upload (its name
        and size, so a test can tell it arrived whole), usage in tokens."""
        content_type = asgi.header(scope, b"content-type") or b""
        try:
            form = parse_form(await read_body(scope, receive), content_type)
        except BodyError as e:
            raise HTTPError(400, str(e), param=e.param) from None
        self._check_model({"model": form.model})
        upload = form.part("file")
        if upload is None or upload[0] is None:
            raise HTTPError(400, "a 'file' upload is required", param="file")
        filename, data = upload
        verb = "translated" if scope["path"].endswith("translations") else "transcribed"
        text = f"{verb} {filename}: {len(data)} bytes"
        heard = max(1, len(data) // 320)  # about 100 tokens a second of 16 kHz 16-bit audio
        words = tokens.count(text)
        usage = {
            "type": "tokens",
            "input_tokens": heard,
            "output_tokens": words,
            "total_tokens": heard + words,
        }
        await send_json(send, 200, {"text": text, "usage": usage})

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET`` or ``DELETE /v1/responses/{id}`` of this process's store."""
        rid = scope["path"].removeprefix("/v1/responses/").rstrip("/")
        stored = self._stored.get(rid)
        if stored is None:
            raise HTTPError(404, f"Response with id '{rid}' not found.", code="response_not_found")
        if scope["method"] == "GET":
            await send_json(send, 200, stored[0])
        elif scope["method"] == "DELETE":
            self._stored.delete(rid)
            await send_json(send, 200, {"id": rid, "object": "response", "deleted": True})
        else:
            raise HTTPError(405, f"method {scope['method']} not allowed here")

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=False)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        await self._generate_from(parse_json(await read_body(scope, receive)), receive, send, chat)

    async def _generate_from(
        self, body: Mapping[str, Any], receive: Receive, send: Send, chat: bool
    ) -> None:
        req = self._generation_request(body, chat)
        rid = self._next_id("chatcmpl" if chat else "cmpl")

        async def work() -> None:
            outputs, reason = self._submit(req, rid)
            try:
                if req.stream:
                    await self._stream(send, req, rid, reason, outputs)
                else:
                    await self._complete(send, req, rid, reason, outputs)
            finally:
                self.driver.abort(rid)  # no-op when it finished; frees blocks when it did not

        await self._faulty(receive, send, work, req.stream)

    def _submit(
        self, req: GenerationRequest, rid: str
    ) -> tuple[trio.MemoryReceiveChannel[Output], str]:
        """Queue `req` on the engine (after the first-token fault's delay): its output
        channel, and the finish reason its end will have."""
        delay = self.faults.first_token_delay
        request = Request(
            request_id=rid,
            prompt=req.prompt,
            max_tokens=req.max_tokens,
            seed=req.seed,
            not_before=trio.current_time() + delay if delay > 0 else 0.0,
        )
        reason = "length" if req.explicit_max_tokens else "stop"
        try:
            return self.driver.submit(request, reason), reason
        except ValueError as e:
            raise HTTPError(400, str(e)) from None

    def _usage(self, done: Finished) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }

    async def _complete(
        self,
        send: Send,
        req: GenerationRequest,
        rid: str,
        reason: str,
        outputs: trio.MemoryReceiveChannel[Output],
    ) -> None:
        text: list[str] = []
        done: Finished | None = None
        async for out in outputs:
            if isinstance(out, Token):
                text.append(out.text)
            else:
                done = out
        if done is None:
            raise HTTPError(500, "the request was aborted")
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        await send_json(
            send,
            200,
            {
                "id": rid,
                "object": "chat.completion" if req.chat else "text_completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [choice],
                "usage": self._usage(done),
            },
        )

    async def _stream(
        self,
        send: Send,
        req: GenerationRequest,
        rid: str,
        reason: str,
        outputs: trio.MemoryReceiveChannel[Output],
    ) -> None:
        created = int(time.time())
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(req.model)},"choices":['
        ).encode()
        if req.chat:
            piece_head = b'{"index":0,"delta":{"content":'
            piece_tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            piece_head = b'{"index":0,"text":'
            piece_tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        limit = self.faults.abort_after_chunks
        sent = 0

        async def push(chunks: list[bytes], last: bool) -> bool:
            """Send SSE events; False once the abort fault has cut the stream."""
            nonlocal sent
            if limit is not None and sent + len(chunks) >= limit:
                # Stop after exactly `limit` events, without [DONE]; returning mid-body
                # makes the server close the connection.
                cut = b"".join(chunks[: limit - sent])
                await send({"type": "http.response.body", "body": cut, "more_body": True})
                return False
            sent += len(chunks)
            if last:
                chunks.append(b"data: [DONE]\n\n")
            body = b"".join(chunks)
            await send({"type": "http.response.body", "body": body, "more_body": not last})
            return True

        await start_stream(send)
        # Like vLLM, the role chunk goes out with the first token, not before it: a
        # router that times the first event must see the real time to first token.
        role_event: list[bytes] = []
        if req.chat:
            role = b'{"index":0,"delta":{"role":"assistant","content":""},'
            role_event = [head + role + b'"logprobs":null,"finish_reason":null}]}\n\n']

        done: Finished | None = None
        while done is None:
            try:
                out = await outputs.receive()
            except trio.EndOfChannel:
                return  # aborted elsewhere: end the stream without [DONE]
            batch = [out]
            while True:  # everything already waiting goes out in one write
                try:
                    batch.append(outputs.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            events: list[bytes] = role_event
            role_event = []
            for item in batch:
                if isinstance(item, Token):
                    text = json.dumps(item.text).encode()
                    events.append(head + piece_head + text + piece_tail)
                else:
                    done = item
            if done is None and not await push(events, False):
                return

        if req.chat:
            final = b'{"index":0,"delta":{},"logprobs":null,"finish_reason":'
        else:
            final = b'{"index":0,"text":"","logprobs":null,"finish_reason":'
        events.append(head + final + f'"{reason}"}}]}}\n\n'.encode())
        if req.include_usage:
            events.append(head + b'],"usage":' + _dumps(self._usage(done)) + b"}\n\n")
        await push(events, True)

    # -- embeddings -----------------------------------------------------------------------

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        model = self._check_model(body)
        inputs = _embedding_inputs(body.get("input"))
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise HTTPError(400, "'encoding_format' must be 'float' or 'base64'")
        dim = body.get("dimensions") or self.config.embedding_dim
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
            raise HTTPError(400, "'dimensions' must be a positive integer", param="dimensions")

        async def work() -> None:
            data = []
            total = 0
            for i, item in enumerate(inputs):
                if isinstance(item, str):
                    key, n = item.encode("utf-8", "surrogatepass"), tokens.count(item)
                else:
                    key, n = struct.pack(f"<{len(item)}q", *item), len(item)
                total += n
                vector = embedding(key, dim)
                value: Any = vector
                if fmt == "base64":
                    value = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
                data.append({"object": "embedding", "index": i, "embedding": value})
            await send_json(
                send,
                200,
                {
                    "object": "list",
                    "data": data,
                    "model": model,
                    "usage": {"prompt_tokens": total, "total_tokens": total},
                },
            )

        await self._faulty(receive, send, work, stream=False)


def _embedding_inputs(value: Any) -> list[str | list[int]]:
    def is_ids(x: Any) -> bool:
        return (
            isinstance(x, list)
            and bool(x)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        )

    if isinstance(value, str):
        return [value]
    if is_ids(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, str) or is_ids(x) for x in value):
        return list(value)
    raise HTTPError(
        400, "'input' must be a string, a list of strings, or token id lists", param="input"
    )


def _fault_exit(served: int) -> NoReturn:
    print(f"llmgw-sim: fault injected: exiting after {served} requests", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    # Like a crash: no graceful shutdown, in-flight requests lose their connections.
    os._exit(FAULT_EXIT_CODE)


# -- running ----------------------------------------------------------------------------


def _sampling_limits(body: Mapping[str, Any], chat: bool) -> tuple[int | None, str, int | None]:
    """The output limit a request asks for (None: none), the field that asked it, and
    its seed; 400 for what the simulator does not serve (n > 1) or a bad value."""
    n = body.get("n", 1)
    if n not in (None, 1):
        raise HTTPError(400, "only n=1 is supported", param="n")
    limit = body.get("max_completion_tokens") if chat else None
    param = "max_completion_tokens"
    if limit is None:
        limit, param = body.get("max_tokens"), "max_tokens"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HTTPError(400, f"'{param}' must be a positive integer", param=param)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise HTTPError(400, "'seed' must be an integer", param="seed")
    return limit, param, seed


async def serve(
    config: SimConfig,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT or SIGTERM; `task_status` gets the bound URLs."""
    app = SimApp(config)
    http_config = HttpServerConfig(header_timeout=None, graceful_timeout=2.0)
    shutdown = trio.Event()

    async def watch_signals(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                shutdown.set()
                return

    async with trio.open_nursery() as nursery:

        async def http(task_status: trio.TaskStatus[list[str]]) -> None:
            await http_serve(
                cast(Any, app),  # its Scope/Receive/Send are stricter than ASGI's
                Address(config.host, config.port),
                http_config,
                shutdown_trigger=shutdown.wait,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()  # the engine driver never returns by itself

        await nursery.start(watch_signals)
        nursery.start_soon(app.driver.run)
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
