"""The client-facing OpenAI API as a plain ASGI app.

This is the hot path, so it is not built on a web framework: one dict lookup
routes the request, only the body's top level is parsed (llmgw.router.body), and
it is written back only when the router must change it (an alias, a fallback,
usage injection). One `_Call` value carries a request from admission to its end.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import httpx
import trio

from llmgw.domain.engine_metrics import UNKNOWN
from llmgw.domain.keys import KeyRecord
from llmgw.domain.usage import Caller, Usage, UsageRecord
from llmgw.http.asgi import (
    BodyTooLarge,
    ClientLeft,
    Receive,
    Scope,
    Send,
    answer_non_http,
    error_body,
    header,
    read_body,
    send_json,
)
from llmgw.router import anthropic
from llmgw.router.access import log_refusal
from llmgw.router.admission import AdmissionRejected, UnknownBand
from llmgw.router.auth import AuthError
from llmgw.router.body import BIG_BODY, BodyError, RequestBody, parse
from llmgw.router.breaker import Outcome, Ticket, classify_status
from llmgw.router.forms import FormBody, parse_form
from llmgw.router.messages import AnthropicSend, CountSend, json_response
from llmgw.router.paths import (
    CHAT,
    COUNT_TOKENS,
    MESSAGES_NATIVE,
    MESSAGES_NATIVE_STREAM,
    PATHS,
    RESPONSES,
    ApiPath,
    engine_names,
)
from llmgw.router.proxy import AttemptFailed, Delivery, PathMissing
from llmgw.router.responses import SCAN_BYTES, Home, response_id_in
from llmgw.router.usage import NO_USAGE, estimate_prompt_tokens
from llmgw.version import __version__

if TYPE_CHECKING:
    from collections.abc import Iterable

    from llmgw.catalog import Catalog
    from llmgw.config import Band, Config
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.access import AccessLog
    from llmgw.router.admission import AdmissionController
    from llmgw.router.affinity import PrefixIndex
    from llmgw.router.auth import Authenticator
    from llmgw.router.coldstart import ColdStarts
    from llmgw.router.endpoints import EndpointRegistry, EndpointState
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.proxy import Upstream
    from llmgw.router.responses import ResponseHomes
    from llmgw.router.scheduling import Decision
    from llmgw.router.scraper import Scraper
    from llmgw.router.sleep import Sleeper
    from llmgw.router.tracing import RequestSpan, Tracing


#: The scope key of a request's id (:func:`request_id_of`).
REQUEST_ID = "llmgw.request_id"
#: The scope key of the id of the API key a request was authenticated with.
KEY_ID = "llmgw.key_id"
_MODEL_PREFIX = "/v1/models/"
_RESPONSE_PREFIX = RESPONSES + "/"
_TRACE_HEADERS = (b"traceparent", b"tracestate")
# What a client's x-request-id may be to be passed on as is: short, and nothing a
# log line or another server's header parser could trip on.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,128}")


def request_id_of(given: bytes | None) -> bytes:
    """The client's ``x-request-id`` when it is 1-128 characters of letters, digits
    and ``._:+/=@-``; else a new random one (32 hex digits)."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return secrets.token_hex(16).encode()


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}


class HttpError(Exception):
    """A request refused with an OpenAI-shaped error."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or []
        #: The configured model the request was for, once known ("" before: a name a
        #: client made up never becomes a label).
        self.model = ""
        #: Whether Router.refused has recorded it (else only the access log gets it).
        self.recorded = False


async def send_error(send: Send, err: HttpError) -> None:
    body = error_body(str(err), err.type, err.code, err.param)
    await send_json(send, err.status, body, err.headers)


def _auth_error(exc: AuthError) -> HttpError:
    retry = [(b"retry-after", str(int(exc.retry_after)).encode())] if exc.retry_after else []
    kind = {401: "authentication_error", 403: "permission_error", 503: "server_error"}.get(
        exc.status, "rate_limit_exceeded"
    )
    return HttpError(exc.status, str(exc), type_=kind, code=exc.code, headers=retry)


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class Routing(Protocol):
    """What the client routes use of their router: llmgw.router.core.Router, which
    makes this app (and so is not imported here)."""

    config: Config
    catalog: Catalog
    endpoints: EndpointRegistry
    metrics: RouterMetrics
    auth: Authenticator
    admission: AdmissionController
    cold: ColdStarts
    responses: ResponseHomes
    scraper: Scraper
    sleeper: Sleeper
    upstream: Upstream
    access_log: AccessLog | None
    prefixes: PrefixIndex | None
    tracing: Tracing | None
    session_header: bytes
    band_header: bytes
    tenant_header: bytes

    def choose(
        self,
        model: ModelConfig,
        usable: Iterable[EndpointState],
        session_key: str | None,
        prefix: tuple[int, ...] | None,
        now: float,
        prompt_tokens: float = 0.0,
    ) -> Decision | None: ...

    def record_attempt(
        self, state: EndpointState, ticket: Ticket, outcome: Outcome, failure: AttemptFailed | None
    ) -> None: ...

    def finish(
        self,
        model: ModelConfig,
        state: EndpointState,
        delivery: Delivery,
        *,
        session_key: str | None,
        latency: float,
        caller: Caller = ...,
        status: int | None = None,
        retries: int = 0,
        request_id: str | None = None,
        path: str | None = None,
        queue_wait: float | None = None,
    ) -> None: ...

    def refused(
        self,
        model: str,
        status: int,
        latency: float,
        caller: Caller,
        *,
        retries: int = 0,
        request_id: str | None = None,
        path: str | None = None,
        queue_wait: float | None = None,
        error: str | None = None,
    ) -> None: ...


class ClientApp:
    """`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`."""

    def __init__(self, router: Routing) -> None:
        self.router = router
        # Bodies past BIG_BODY are parsed in a worker thread, one at a time: what a
        # parse holds in memory is bounded by one body, not by how many arrive.
        self._big_parses = trio.CapacityLimiter(1)
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            **{("POST", path): self._inference for path in PATHS},
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("GET", "/health"): self._health,
            ("GET", "/version"): self._version,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await answer_non_http(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        handler = self._routes.get((scope["method"], path))
        if handler is None and scope["method"] == "GET" and path.startswith(_MODEL_PREFIX):
            handler = self._model
        elif handler is None and path.startswith(_RESPONSE_PREFIX):
            handler = self._stored_response
        # The client's id when it is one we can pass on safely, else ours; on every
        # answer, to the engine, and in the usage record.
        request_id = request_id_of(header(scope, b"x-request-id"))
        scope[REQUEST_ID] = request_id
        started = trio.current_time()
        try:
            if handler is None:
                known = any(p == path for _, p in self._routes)
                if known:
                    raise HttpError(405, f"method {scope['method']} not allowed here")
                raise HttpError(404, f"no route {scope['path']}", code="not_found")
            await handler(scope, receive, send)
        except ClientGone:
            return
        except HttpError as err:
            self.router.metrics.reject(err.code or str(err.status), err.model, scope.get(KEY_ID))
            self._rejected(scope, err.status, err.code, str(err), err.model, started, err.recorded)
            err.headers.append((b"x-request-id", request_id))
            await send_error(send, err)

    def _rejected(
        self,
        scope: Scope,
        status: int,
        code: str | None,
        reason: str,
        model: str,
        started: float,
        recorded: bool,
    ) -> None:
        """Log a refusal: its reason at DEBUG, and its access line unless
        Router.refused recorded it (then the access log had it with the rest)."""
        request_id = bytes(scope[REQUEST_ID]).decode("ascii")
        log_refusal(request_id, status, code, reason, model)
        access = self.router.access_log
        if not recorded and access is not None:
            access.record(
                UsageRecord(
                    model=model,
                    endpoint=None,
                    status=status,
                    usage=NO_USAGE,
                    latency=trio.current_time() - started,
                    key_id=scope.get(KEY_ID),
                    request_id=request_id,
                    path=scope["path"],
                    error=code,
                )
            )

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Up and able to serve (an endpoint has been scraped); nothing more, no key."""
        ready = any(s.sample is not None for s in self.router.endpoints.all())
        body = b'{"status":"ok"}' if ready else b'{"status":"not ready"}'
        await send_json(send, 200 if ready else 503, body, [(b"x-request-id", scope[REQUEST_ID])])

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = json.dumps({"version": __version__, "server": "llmgw"}).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET`` and ``DELETE /v1/responses/{id}``, ``POST .../{id}/cancel``: sent to
        the replica that made the response (it alone has it); 404 when llmgw does not
        know it, or that replica is gone."""
        router = self.router
        key = await self._authenticate(scope)
        rest = scope["path"].rstrip("/")[len(_RESPONSE_PREFIX) :]
        response_id, _, action = rest.partition("/")
        allowed = {"": ("GET", "DELETE"), "cancel": ("POST",)}.get(action)
        if allowed is None or not response_id:
            raise HttpError(404, f"no route {scope['path']}", code="not_found")
        if scope["method"] not in allowed:
            raise HttpError(405, f"method {scope['method']} not allowed here")
        home = router.responses.lookup(response_id, trio.current_time())
        state = router.endpoints.get(home.endpoint) if home is not None else None
        if home is None or state is None:
            raise HttpError(
                404,
                f"response {response_id!r} is unknown to this gateway, or the replica that "
                "stored it is gone",
                code="response_not_found",
            )
        if key is not None:
            try:
                router.auth.check_model(key, home.model, home.model)
            except AuthError as exc:
                raise _auth_error(exc) from None
        url = state.endpoint.url.rstrip("/") + scope["path"]
        headers = [(b"x-request-id", scope[REQUEST_ID]), *state.endpoint.headers]
        limit = router.config.router.max_response_bytes
        try:
            with trio.fail_after(router.config.router.timeouts.total):
                async with router.scraper.client.stream(
                    scope["method"], url, headers=headers, timeout=None
                ) as answer:
                    data = bytearray()
                    async for chunk in answer.aiter_bytes():
                        data += chunk
                        if len(data) > limit:
                            raise HttpError(
                                502,
                                f"endpoint {home.endpoint!r} answered more than {limit} bytes",
                                type_="server_error",
                                code="upstream_error",
                            )
        except (trio.TooSlowError, httpx.HTTPError) as exc:
            why = "timed out" if isinstance(exc, trio.TooSlowError) else type(exc).__name__
            raise HttpError(
                502,
                f"endpoint {home.endpoint!r} did not answer: {why}",
                type_="server_error",
                code="upstream_error",
            ) from None
        if scope["method"] == "DELETE" and answer.status_code == 200:
            router.responses.forget(response_id)
        await send_json(
            send,
            answer.status_code,
            bytes(data),
            [
                (b"x-request-id", scope[REQUEST_ID]),
                (b"x-llmgw-endpoint", state.endpoint.id.encode()),
            ],
        )

    async def _model(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /v1/models/{id}``: one model or alias the key may use and a replica
        serves; 404 in OpenAI's shape otherwise (what ``models.retrieve`` expects)."""
        name = scope["path"].rstrip("/")[len(_MODEL_PREFIX) :]
        entry = next((m for m in self._listed(await self._authenticate(scope)) if m == name), None)
        if entry is None:
            raise HttpError(
                404, f"the model {name!r} does not exist", code="model_not_found", param="model"
            )
        body = json.dumps(_model_object(name)).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        names = self._listed(await self._authenticate(scope))
        data = [_model_object(name) for name in names]
        body = json.dumps({"object": "list", "data": data}).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    def _listed(self, key: KeyRecord | None) -> list[str]:
        """The names and aliases of the models a replica serves that `key` may use."""
        served = self.router.endpoints.models()
        names = []
        for model in self.router.catalog.models:
            if model.name not in served:
                continue
            permitted = None if key is None else key.models
            for name in (model.name, *model.aliases):
                # A key limited to some models sees those (by name or alias) only.
                if permitted is None or model.name in permitted or name in permitted:
                    names.append(name)
        return names

    async def _authenticate(self, scope: Scope, bearer: bytes | None = None) -> KeyRecord | None:
        try:
            key = await self.router.auth.authenticate(bearer or header(scope, b"authorization"))
        except AuthError as exc:
            raise _auth_error(exc) from None
        if key is not None:
            scope[KEY_ID] = key.id  # for the access line of a refusal after this
        return key

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        # Its deadline (router.timeouts.client_body) is the listener's: past it
        # llmgw.http.server reports a disconnect here and answers the 408 itself.
        try:
            return await read_body(scope, receive, self.router.config.router.max_body_bytes)
        except ClientLeft:
            raise ClientGone from None
        except BodyTooLarge as exc:
            of = f" of {exc.declared} bytes" if exc.declared is not None else ""
            raise HttpError(
                413, f"request body{of} exceeds the limit of {exc.limit} bytes"
            ) from None

    async def _inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = trio.current_time()
        key = await self._authenticate(scope)
        route = PATHS[scope["path"].rstrip("/")]
        raw = await self._read_body(scope, receive)
        body: RequestBody | FormBody
        if route.form:
            try:
                body = parse_form(raw, header(scope, b"content-type") or b"")
            except BodyError as exc:
                raise HttpError(400, str(exc), param=exc.param) from None
        else:
            body = await self._parse(raw)
        await self._proxy(scope, receive, send, route, body, key, started)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Anthropic's Messages API, translated to a chat completion and back
        (llmgw.router.messages); its errors in Anthropic's shape."""
        await self._anthropic(scope, receive, send, count=False)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/v1/messages/count_tokens``: the translated messages tokenized by a
        replica of the model (``/tokenize``), its count as ``input_tokens``."""
        await self._anthropic(scope, receive, send, count=True)

    async def _anthropic(self, scope: Scope, receive: Receive, send: Send, count: bool) -> None:
        started = trio.current_time()
        request_id = [(b"x-request-id", scope[REQUEST_ID])]
        try:
            # Anthropic's clients send the key as x-api-key.
            given = header(scope, b"x-api-key")
            bearer = header(scope, b"authorization") or (b"Bearer " + given if given else None)
            key = await self._authenticate(scope, bearer)
            raw = await self._read_body(scope, receive)
            try:
                request = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise anthropic.MessagesError(
                    400, "invalid_request_error", f"the body is not valid JSON: {exc}"
                ) from None
            if count and isinstance(request, dict):
                # Counting takes no max_tokens; the translation wants one.
                request = {**request, "max_tokens": 1, "stream": False}
            chat = anthropic.to_chat(request)
            reply: Send
            native = Native(
                MESSAGES_NATIVE_STREAM if chat.get("stream") else MESSAGES_NATIVE,
                scope["path"].rstrip("/"),
                await self._parse(raw),
                send,
                () if count else (b"event: message_stop",),
            )
            if count:
                chat = {k: chat[k] for k in ("model", "messages", "tools") if k in chat}
                reply = CountSend(send)
                route = COUNT_TOKENS
            else:
                reply = AnthropicSend(
                    send,
                    request["model"],
                    stream=bool(chat.get("stream")),
                    stop_sequences=request.get("stop_sequences"),
                )
                route = PATHS[CHAT]
            body = await self._parse(json.dumps(chat).encode())
            await self._proxy(scope, receive, reply, route, body, key, started, native)
        except anthropic.MessagesError as exc:
            self._rejected(scope, exc.status, exc.type, str(exc), "", started, False)
            await json_response(send, exc.status, exc.body(), request_id)
        except HttpError as err:
            self.router.metrics.reject(err.code or str(err.status), err.model, scope.get(KEY_ID))
            self._rejected(scope, err.status, err.code, str(err), err.model, started, err.recorded)
            body_ = anthropic.error_body(err.status, str(err))
            await json_response(send, err.status, body_, [*err.headers, *request_id])

    async def _parse(self, raw: bytes) -> RequestBody:
        try:
            if len(raw) > BIG_BODY:
                return await trio.to_thread.run_sync(parse, raw, limiter=self._big_parses)
            return parse(raw)
        except BodyError as exc:
            raise HttpError(400, str(exc), param=exc.param) from None

    async def _proxy(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: ApiPath,
        body: RequestBody | FormBody,
        key: KeyRecord | None,
        started: float,
        native: Native | None = None,
    ) -> None:
        """Route `body` on `route` and relay the answer; HttpError for a refusal. With
        `native`, a replica whose engine serves the client's own API gets the client's
        request (`native.body` on `native.path`, its answer sent as is) instead."""
        router = self.router
        chain = router.catalog.candidates(body.model)
        if not chain:
            raise HttpError(
                404,
                f"the model {body.model!r} does not exist",
                code="model_not_found",
                param="model",
            )
        self._check_served(route, body.model, chain)
        pinned = None
        if route.path == RESPONSES:
            pinned, chain = self._follow_up(body, chain)
        # The client may go away at any point; the watcher cancels the upstream
        # request at once, which frees the engine's slot.
        # Once the last byte is handed over, a disconnect no longer matters.
        watch = _DisconnectWatch()

        def track(send: Send) -> Send:
            async def tracked_send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    watch.complete = True
                try:
                    await send(message)
                except OSError:
                    # What an ASGI server raises on a send to a client that has gone: the
                    # disconnect may be seen here before the watcher's receive() sees it.
                    watch.gone = watch.gone or not watch.complete
                    raise

            return tracked_send

        tracked_send = track(send)

        session = header(scope, router.session_header)
        call = _Call(
            scope,
            route,
            tracked_send,
            body,
            chain,
            started,
            key,
            session.decode(errors="replace") if session else None,
        )
        call.pinned = pinned
        if native is not None:
            call.native = attrs.evolve(native, send=track(native.send))
        if route.path == RESPONSES:
            call.send = self._id_tap(call, tracked_send)
        if router.tracing is not None:
            call.span = router.tracing.request(
                call.trace, f"{route.operation} {body.model}", started
            )
        refused: HttpError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run, receive, nursery.cancel_scope)
                try:
                    await self._serve(call)
                except HttpError as err:
                    refused = err  # raised outside, so no exception group wraps it
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            # Counted however it was noticed: the watcher's receive(), or a failed send.
            if watch.gone:
                kind = "stream" if call.stream else "request"
                router.metrics.disconnects.labels(body.model, kind).inc()
            if call.span is not None:
                _end_span(call, call.span, refused, watch.gone)
        if refused is not None:
            # Refused once the model was known (429, 503, 502/504 after every attempt,
            # 403, ...): a client-visible failure that usage and the dashboard count.
            refused.model = chain[0].name
            router.refused(
                refused.model,
                refused.status,
                trio.current_time() - started,
                call.caller,
                retries=call.retries,
                request_id=call.request_id,
                path=scope["path"],
                queue_wait=call.queued,
                error=refused.code,
            )
            refused.recorded = True
            raise refused

    def _follow_up(
        self, body: RequestBody | FormBody, chain: list[ModelConfig]
    ) -> tuple[str | None, list[ModelConfig]]:
        """For a Responses request with ``previous_response_id``: the endpoint that
        holds that response, and its model alone (no fallback has it); 404 when llmgw
        does not know where it is, or the replica is gone."""
        raw = body.member("previous_response_id")
        if raw is None:
            return None, chain
        if not isinstance(raw, str):
            raise HttpError(
                400, "previous_response_id must be a string", param="previous_response_id"
            )
        home = self.router.responses.lookup(raw, trio.current_time())
        if home is None:
            raise HttpError(
                404,
                f"previous response {raw!r} is unknown to this gateway: it was not made "
                "through it, was made before it started, or more than "
                f"{self.router.responses.ttl / 3600:g}h ago",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        state = self.router.endpoints.get(home.endpoint)
        if state is None or state.draining:
            raise HttpError(
                404,
                f"previous response {raw!r} was stored by endpoint {home.endpoint!r}, which "
                "no longer serves: its context is gone, start from the full conversation",
                code="previous_response_gone",
                param="previous_response_id",
            )
        return home.endpoint, [m for m in chain if m.name == home.model] or chain[:1]

    def _id_tap(self, call: _Call, send: Send) -> Send:
        """`send`, noting the id of the response it relays (so follow-ups find it)."""
        seen = 0

        async def tapped(message: MutableMapping[str, Any]) -> None:
            nonlocal seen
            if (
                call.response_id is None
                and seen < SCAN_BYTES
                and message["type"] == "http.response.body"
            ):
                data = bytes(message.get("body", b""))
                call.response_id = response_id_in(data)
                seen += len(data)
            await send(message)

        return tapped

    @staticmethod
    def _native_for(native: Native, state: EndpointState) -> bool:
        return _engine(state) in native.engines and not state.lacks_native

    def _check_served(self, route: ApiPath, asked: str, chain: list[ModelConfig]) -> None:
        """404 when every replica of the model and its fallbacks runs an engine known
        not to serve `route` (retrying them would only repeat the engine's 404)."""
        if route.engines == PATHS[CHAT].engines:
            return
        engines = {_engine(s) for m in chain for s in self.router.endpoints.serving(m.name)}
        if engines and not any(route.served_by(e) for e in engines):
            raise HttpError(
                404,
                f"no replica of {asked!r} serves {route.path}: they run "
                f"{engine_names(engines)}; {route.what} is served by "
                f"{engine_names(route.engines)}",
                code="unsupported_endpoint",
            )

    async def _serve(self, call: _Call) -> None:
        """Admission by priority band, then routing. The request waits in its band's
        queue while the model's pool is above the band's saturation ceiling."""
        router = self.router
        admission = router.admission
        key = call.key
        # With keys, the key decides the band and is the tenant; the headers are
        # trusted only without them.
        value = None if key is not None else header(call.scope, router.band_header)
        try:
            band = admission.select_band(
                value.decode(errors="replace") if value else None,
                key.band if key is not None else None,
            )
        except UnknownBand as exc:
            raise HttpError(
                400, str(exc), param=router.band_header.decode(), code="unknown_band"
            ) from None
        limit = call.body.max_tokens
        expected = len(call.body.raw) // 4 + (limit if limit is not None else 256)
        if key is not None:
            try:
                router.auth.check_model(key, call.body.model, call.chain[0].name)
                await router.auth.admit(key, expected)
            except AuthError as exc:
                raise _auth_error(exc) from None
            tenant = key.id
        else:
            tenant = (header(call.scope, router.tenant_header) or b"").decode(errors="replace")
        call.caller = Caller(key.id if key is not None else None, band.name, tenant or None)
        now = trio.current_time()
        pool = next(
            (
                m.name
                for m in call.chain
                if any(s.breaker.allows(now) for s in router.endpoints.serving(m.name))
            ),
            None,
        )
        if pool is None:
            cold = router.cold.model_for(call.chain) if admission.enabled else None
            if cold is None:  # nothing to queue for: routing answers 503 at once
                await self._route(call)
                return
            await self._serve_cold(call, cold, band, tenant, expected)
            return
        queued = trio.current_time()
        try:
            ticket = await admission.admit(pool, band, tenant, expected)
        except AdmissionRejected as exc:
            call.queued = trio.current_time() - queued  # the wait that gave up, for the log
            router.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            if call.span is not None:
                call.span.admitted(queued, trio.current_time(), band.name, pool, exc.reason)
            why = "its queue is full" if exc.reason == "queue_full" else "it waited too long"
            raise HttpError(
                429,
                f"band {band.name!r} cannot be admitted for {pool!r} now: {why}",
                type_="rate_limit_exceeded",
                code=exc.reason,
                headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
            ) from None
        call.queued = trio.current_time() - queued
        if call.span is not None:
            call.span.admitted(queued, queued + call.queued, band.name, pool)
        with ticket:
            await self._route(call)

    async def _serve_cold(
        self, call: _Call, model: ModelConfig, band: Band, tenant: str, expected: int
    ) -> None:
        """Wake on request (router/coldstart.py): wait in `band`'s queue for `model`'s
        first replica, up to its `cold_start_timeout`, then route as usual."""
        router = self.router
        assert model.autoscale is not None
        timeout = float(model.autoscale.cold_start_timeout)
        metrics = router.metrics
        queued = trio.current_time()
        outcome = "disconnected"  # unless the wait ends otherwise
        try:
            with router.cold.wait(model.name) as wait:
                with wait.scope:
                    ticket = await router.admission.admit(
                        model.name, band, tenant, expected, ttl=timeout
                    )
                if wait.refused is not None:
                    outcome = "unplaceable"
                    raise HttpError(
                        503,
                        f"model {model.name!r} has no replica and cannot be placed: {wait.refused}",
                        type_="server_error",
                        code="model_unplaceable",
                        # A fleet change is needed: nodes joining, or the operator's.
                        headers=[(b"retry-after", b"60")],
                    )
            outcome = "admitted"
        except AdmissionRejected as exc:
            call.queued = trio.current_time() - queued
            outcome = "queue_full" if exc.reason == "queue_full" else "starting"
            router.metrics.admission_rejected.labels(band.name, exc.reason).inc()
            if exc.reason == "queue_full":
                raise HttpError(
                    429,
                    f"band {band.name!r} cannot queue for {model.name!r} now: its queue is full",
                    type_="rate_limit_exceeded",
                    code="queue_full",
                    headers=[(b"retry-after", str(max(1, round(exc.retry_after))).encode())],
                ) from None
            raise HttpError(
                503,
                f"model {model.name!r} is starting: no replica was ready within its "
                f"cold_start_timeout ({timeout:g}s)",
                type_="server_error",
                code="model_starting",
                headers=[(b"retry-after", str(_starting_retry(timeout)).encode())],
            ) from None
        finally:
            metrics.cold_waits.labels(model.name, outcome).inc()
        call.queued = trio.current_time() - queued
        metrics.cold_wait.labels(model.name).observe(call.queued)
        if call.span is not None:
            call.span.admitted(queued, queued + call.queued, band.name, model.name)
        with ticket:
            await self._route(call)

    async def _route(self, call: _Call) -> None:
        """Try the model's replicas in score order, then its fallbacks' replicas, within
        `retries` + 1 attempts in all; only attempts that sent nothing to the client
        are retried."""
        router = self.router
        chain = call.chain
        prompt_text = await self._prompt_text(call) if router.prefixes else None
        prompt_tokens = call.prompt_tokens
        budget = router.config.router.retries + 1
        last: AttemptFailed | None = None
        attempted: ModelConfig | None = None
        tried: set[str] = set()
        for model in chain:
            payload = b""
            # Pick, try the ranked candidates, and pick again among those not yet tried:
            # a replica published after the first pick (e.g. a replacement) counts too.
            while budget > 0:
                now = trio.current_time()
                usable = [
                    s
                    for s in router.endpoints.serving(model.name)
                    if s.endpoint.id not in tried
                    and s.breaker.allows(now)
                    and call.route.served_by(_engine(s))
                    and (call.pinned is None or s.endpoint.id == call.pinned)
                ]
                prefix = (
                    router.prefixes.chain(prompt_text, model.name)
                    if router.prefixes and prompt_text and usable
                    else None
                )
                decision = (
                    router.choose(model, usable, call.session_key, prefix, now, prompt_tokens)
                    if usable
                    else None
                )
                if decision is None:
                    break
                if attempted is not model:
                    if model is not chain[0]:
                        router.metrics.fallbacks.labels(chain[0].name, model.name).inc()
                        if call.span is not None:
                            call.span.fallback(chain[0].name, model.name)
                    # Engines know canonical names: an alias or a fallback is renamed.
                    payload = call.body.payload(model.name, add_usage=self._add_usage(call))
                    # llmgw's own time: admission's queueing is its own histogram.
                    router.metrics.overhead.observe(
                        trio.current_time() - call.started - call.queued
                    )
                    attempted = model
                router.metrics.decisions.labels(model.name, decision.tier).inc()
                for endpoint_id in decision.ranked:
                    if budget <= 0:
                        break
                    tried.add(endpoint_id)
                    state = router.endpoints.get(endpoint_id)
                    ticket = state.breaker.acquire(trio.current_time()) if state else None
                    if state is None or ticket is None:
                        continue
                    if last is not None:
                        router.metrics.retries.labels(model.name, last.kind).inc()
                        call.retries += 1
                        if call.span is not None:
                            call.span.retry(last.endpoint, last.kind, endpoint_id)
                    budget -= 1
                    prefill = decision.uncached.get(endpoint_id, prompt_tokens)
                    try:
                        delivery = await self._attempt(
                            call, model, state, ticket, payload, prefill, decision.tier
                        )
                    except AttemptFailed as failure:
                        last = failure
                        continue
                    router.finish(
                        model,
                        state,
                        delivery,
                        session_key=call.session_key,
                        latency=trio.current_time() - call.started,
                        caller=call.caller,
                        retries=call.retries,
                        request_id=call.request_id,
                        path=call.scope["path"],
                        queue_wait=call.queued,
                    )
                    if call.response_id is not None and delivery.status == 200:
                        home = Home(state.endpoint.id, model.name)
                        router.responses.record(call.response_id, home, trio.current_time())
                    return
        requested = call.body.model
        if attempted is None:
            retry_after = str(max(1, math.ceil(router.config.router.cooldown / 3)))
            fallbacks = [m.name for m in chain[1:]]
            raise HttpError(
                503,
                f"no replica of {requested!r} can take the request now"
                + (f" (fallbacks tried: {', '.join(fallbacks)})" if fallbacks else ""),
                type_="server_error",
                code="no_healthy_replica",
                headers=[(b"retry-after", retry_after.encode())],
            )
        status = 504 if last is not None and last.outcome is Outcome.TIMEOUT else 502
        router.metrics.requests.labels(attempted.name, "", str(status)).inc()
        # Endpoints are named by id: their addresses stay out of what clients see.
        raise HttpError(
            status,
            f"every replica tried failed; the last, endpoint {last.endpoint!r}: {last}"
            if last
            else "no replica was free",
            type_="server_error",
            code="upstream_timeout" if status == 504 else "upstream_error",
        )

    async def _prompt_text(self, call: _Call) -> str:
        """The prompt text prefix affinity hashes; a large body's is decoded in a
        worker thread, one at a time."""
        prefixes = self.router.prefixes
        assert prefixes is not None
        body = call.body
        chars = prefixes.block_chars * prefixes.max_blocks
        try:
            if len(body.raw) > BIG_BODY:
                fields = await trio.to_thread.run_sync(
                    body.affinity_fields, chars, limiter=self._big_parses
                )
            else:
                fields = body.affinity_fields(chars)
        except BodyError as exc:
            raise HttpError(400, str(exc), param=exc.param) from None
        return prefixes.text(fields)

    def _add_usage(self, call: _Call) -> bool:
        """Ask the engine for a usage chunk the client did not ask for (to account)."""
        return (
            call.route.usage_option
            and call.stream
            and self.router.config.router.inject_usage
            and not call.wants_usage
        )

    async def _attempt(
        self,
        call: _Call,
        model: ModelConfig,
        state: EndpointState,
        ticket: Ticket,
        payload: bytes,
        prefill: float,
        tier: str,
    ) -> Delivery:
        """One attempt at one endpoint; raises AttemptFailed when it may be retried.

        `prefill` (the prompt tokens it is estimated to compute) counts in the
        endpoint's prefill work until the first token, or the answer, is in. `tier`
        is the routing decision's that picked it (for its trace)."""
        router = self.router
        native = call.native
        # The engine speaks the client's API itself (its request, its answer as is),
        # unless it showed it does not; then the translation.
        tries = (
            (True, False) if native is not None and self._native_for(native, state) else (False,)
        )
        base = state.endpoint.url.rstrip("/")
        request_id = call.scope[REQUEST_ID]
        extra = [
            (b"x-llmgw-model", model.name.encode()),
            (b"x-llmgw-endpoint", state.endpoint.id.encode()),
            (b"x-request-id", request_id),
        ]
        traced = (
            None if call.span is None else call.span.attempt(state.endpoint.id, model.name, tier)
        )
        headers = [
            (b"content-type", call.body.content_type),
            (b"x-request-id", request_id),
            *state.endpoint.headers,
            # Traced, the engine's parent span is this attempt's; else the client's.
            *(call.trace if traced is None else traced.headers()),
        ]
        in_flight = router.metrics.in_flight.labels(model.name)
        in_flight.inc()
        state.inflight += 1
        state.prefill += prefill
        prefilling = True

        def prefilled() -> None:
            nonlocal prefilling
            if prefilling:
                prefilling = False
                state.prefill -= prefill

        partial = Delivery(200)
        try:
            await router.sleeper.wake(state)  # a sleeping engine first wakes
            for natively in tries:
                send, path, final = call.send, call.route.path, call.route.final
                strip, body = not call.wants_usage, payload
                if natively:
                    assert native is not None
                    send, path, final, strip = native.send, native.path, native.final, False
                    body = native.body.payload(model.name, add_usage=False)
                try:
                    if call.stream:
                        delivery = await router.upstream.stream(
                            base + path,
                            body,
                            headers,
                            send,
                            extra,
                            strip_usage=strip,
                            final=final,
                            started=call.started,
                            outcome=partial,
                            first_token=prefilled,
                            missing_ok=natively,
                        )
                    else:
                        delivery = await router.upstream.unary(
                            base + path, body, headers, send, extra, missing_ok=natively
                        )
                    break
                except PathMissing:
                    state.lacks_native = True  # an engine version without that API
        except AttemptFailed as failure:
            failure.endpoint = state.endpoint.id
            router.record_attempt(state, ticket, failure.outcome, failure)
            if traced is not None:
                traced.end(failure.kind, failure.status, str(failure))
            raise
        except BaseException:
            # Cancelled (the client left) or a bug: the probe slot must not stick,
            # and what was already relayed still counts.
            router.record_attempt(state, ticket, Outcome.CLIENT_GONE, None)
            if traced is not None:
                traced.end(Outcome.CLIENT_GONE.value, None)
            if partial.ttft is not None:
                partial.usage = Usage(call.prompt_tokens, partial.events, estimated=True)
                if call.span is not None:
                    call.span.served(
                        model.name, state.endpoint.id, tier, 499, partial.usage, partial.ttft, None
                    )
                router.finish(
                    model,
                    state,
                    partial,
                    session_key=None,
                    latency=trio.current_time() - call.started,
                    caller=call.caller,
                    status=499,
                    retries=call.retries,
                    request_id=call.request_id,
                    path=call.scope["path"],
                    queue_wait=call.queued,
                )
            raise
        finally:
            prefilled()
            state.inflight -= 1
            state.used_at = trio.current_time()  # idle from here (router/sleep.py)
            in_flight.dec()
        broken = delivery.failure
        outcome = broken.outcome if broken else classify_status(delivery.status)
        router.record_attempt(state, ticket, outcome, broken)
        if traced is not None and call.span is not None:
            traced.end(outcome.value, delivery.status, None if broken is None else str(broken))
            call.span.served(
                model.name,
                state.endpoint.id,
                tier,
                delivery.status,
                delivery.usage,
                delivery.ttft,
                None if broken is None else broken.kind,
            )
        return delivery


class _Call:
    """One client request on its way through the router: what was asked and by whom,
    from admission to its end. Made by `_inference`, which owns it; the steps after
    (`_serve`, `_route`, `_attempt`) read it and fill in what they decide."""

    __slots__ = (
        "body",
        "caller",
        "chain",
        "key",
        "native",
        "pinned",
        "prompt_tokens",
        "queued",
        "request_id",
        "response_id",
        "retries",
        "route",
        "scope",
        "send",
        "session_key",
        "span",
        "started",
        "stream",
        "trace",
        "wants_usage",
    )

    def __init__(
        self,
        scope: Scope,
        route: ApiPath,
        send: Send,
        body: RequestBody | FormBody,
        chain: list[ModelConfig],
        started: float,
        key: KeyRecord | None,
        session_key: str | None,
    ) -> None:
        self.scope = scope
        self.route = route
        # W3C trace context, passed to the engine unchanged (vLLM continues the trace).
        self.trace = [(k, v) for k, v in scope["headers"] if k in _TRACE_HEADERS]
        self.body = body
        #: The model asked for, then its fallbacks.
        self.chain = chain
        self.started = started
        self.key = key
        self.send = send
        # The key at once (a refusal before admission is still the key's); admission
        # adds the band and tenant.
        self.caller = Caller(key.id if key is not None else None)
        self.queued = 0.0  # seconds admission held it
        self.retries = 0  # attempts after the first, on other endpoints
        # Embeddings, rerank and the like never stream, whatever the body says.
        self.stream = body.stream and route.streams
        # What the client gets of the engine's usage: a chunk it asked for, or a
        # Responses stream's own (never stripped).
        self.wants_usage = self.stream and (body.include_usage or not route.usage_option)
        #: The endpoint a Responses follow-up must go to (the previous response's).
        self.pinned: str | None = None
        #: The client's own request, for replicas whose engine serves its API natively.
        self.native: Native | None = None
        self.response_id: str | None = None  # the id of the response relayed, if seen
        self.request_id = bytes(scope[REQUEST_ID]).decode("ascii")
        self.session_key = session_key
        # Estimated from the body's size: the prefill work routing charges, and the
        # usage of a stream cut before the engine reported any.
        self.prompt_tokens = estimate_prompt_tokens(len(body.raw))
        #: Its trace span, when tracing is on and the sampler picked it.
        self.span: RequestSpan | None = None


@attrs.frozen
class Native:
    """A request in an API some engines serve themselves (Anthropic's Messages): what
    such a replica gets instead of its translation, and where its answer goes."""

    engines: frozenset[str]
    path: str
    body: RequestBody
    send: Send
    # The events that end a whole stream of that API.
    final: tuple[bytes, ...] = ()


def _end_span(call: _Call, span: RequestSpan, refused: HttpError | None, gone: bool) -> None:
    """End the request's span with how the client was answered."""
    error: str | None
    if refused is not None:
        status, error = refused.status, refused.code or str(refused.status)
    elif span.status is not None:  # served, in whole or (the client left) in part
        status, error = span.status, "client_gone" if gone else None
    elif gone:
        status, error = 499, "client_gone"
    else:  # a bug: the ASGI server answers 500
        status, error = 500, "internal_error"
    span.end(
        operation=call.route.operation,
        model=call.body.model,
        request_id=call.request_id,
        caller=call.caller,
        queued=call.queued,
        retries=call.retries,
        status=status,
        error=error,
    )


def _starting_retry(cold_start_timeout: float) -> int:
    """Retry-After for a cold start that outlasted its timeout: a tenth of it (the
    start may be nearly done), from 1 s to a minute."""
    return min(60, max(1, math.ceil(cold_start_timeout / 10)))


def _engine(state: EndpointState) -> str:
    return UNKNOWN if state.sample is None else state.sample.engine


class _DisconnectWatch:
    def __init__(self) -> None:
        self.gone = False
        self.complete = False

    async def run(self, receive: Receive, scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.complete:
                    self.gone = True
                    scope.cancel()
                return
