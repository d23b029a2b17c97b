"""The client-facing OpenAI API as a plain ASGI app: the HTTP side of a request.

This is the hot path, so it is not built on a web framework: one dict lookup
routes the request, only the body's top level is parsed (llmgw.router.body), and
it is written back only when the router must change it (an alias, a fallback,
usage injection). The app reads, authenticates and parses the request (OpenAI's,
or Anthropic's Messages translated), answers what needs no engine (models, health,
a stored response's replica), and hands one :class:`~llmgw.router.call.Call` to the
dispatch (:mod:`llmgw.router.dispatch`: admission, routing, attempts), watching for
the client leaving meanwhile; a refusal is answered here.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio

from llmgw.domain.endpoints import public_name
from llmgw.domain.keys import KeyRecord
from llmgw.domain.usage import UsageRecord
from llmgw.http.asgi import (
    WATCH_DISCONNECT,
    BodyTooLarge,
    ClientLeft,
    Receive,
    Scope,
    Send,
    Watch,
    answer_non_http,
    error_body,
    header,
    read_body,
    send_json,
)
from llmgw.http.client import UpstreamError
from llmgw.router import anthropic
from llmgw.router.access import log_refusal
from llmgw.router.auth import AuthError
from llmgw.router.body import BIG_BODY, BodyError, RequestBody, parse
from llmgw.router.call import (
    KEY_ID,
    REQUEST_ID,
    Call,
    HttpError,
    Native,
    Routing,
    auth_error,
    buffer_full_error,
    engine_of,
)
from llmgw.router.dispatch import Dispatch
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
from llmgw.router.proxy import BufferFull
from llmgw.router.responses import SCAN_BYTES, response_id_in
from llmgw.router.usage import NO_USAGE
from llmgw.version import __version__

if TYPE_CHECKING:
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.tracing import RequestSpan


_MODEL_PREFIX = "/v1/models/"
_RESPONSE_PREFIX = RESPONSES + "/"
# What follows a stored response's id -> the methods that reach its replica.
_RESPONSE_ACTIONS = {"": ("GET", "DELETE"), "cancel": ("POST",), "input_items": ("GET",)}
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


async def send_error(send: Send, err: HttpError) -> None:
    body = error_body(str(err), err.type, err.code, err.param)
    await send_json(send, err.status, body, err.headers)


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class ClientApp:
    """`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`."""

    def __init__(self, router: Routing) -> None:
        self.router = router
        # Bodies past BIG_BODY are parsed in a worker thread, one at a time: what a
        # parse holds in memory is bounded by one body, not by how many arrive.
        self._big_parses = trio.CapacityLimiter(1)
        self._dispatch = Dispatch(router, self._big_parses)
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
        """``GET`` and ``DELETE /v1/responses/{id}``, ``POST .../{id}/cancel``, ``GET
        .../{id}/input_items``: sent to the replica that made the response (it alone
        has it); 404 when llmgw does not know it, another key made it, or that replica
        is gone."""
        router = self.router
        key = await self._authenticate(scope)
        rest = scope["path"].rstrip("/")[len(_RESPONSE_PREFIX) :]
        response_id, _, action = rest.partition("/")
        allowed = _RESPONSE_ACTIONS.get(action)
        if allowed is None or not response_id:
            raise HttpError(404, f"no route {scope['path']}", code="not_found")
        if scope["method"] not in allowed:
            raise HttpError(405, f"method {scope['method']} not allowed here")
        owner = key.id if key is not None else None
        home = router.responses.lookup(response_id, trio.current_time(), owner)
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
                raise auth_error(exc) from None
        url = state.endpoint.url.rstrip("/") + scope["path"]
        if action == "input_items" and scope.get("query_string"):
            url += "?" + bytes(scope["query_string"]).decode("latin-1")  # its paging
        headers = [(b"x-request-id", scope[REQUEST_ID]), *state.endpoint.headers]
        limit = router.config.router.max_response_bytes
        # Held whole like any non-streaming answer, within the same budget.
        budget = router.upstream.budget
        held = 0
        try:
            try:
                with trio.fail_after(router.config.router.timeouts.total):
                    async with router.engine_client.request(
                        scope["method"], url, headers
                    ) as answer:
                        data = bytearray()
                        while chunk := await answer.read_some():
                            data += chunk
                            if len(data) > limit:
                                raise HttpError(
                                    502,
                                    f"endpoint {state.public!r} answered more than {limit} bytes",
                                    type_="server_error",
                                    code="upstream_error",
                                )
                            budget.take(len(chunk))
                            held += len(chunk)
            except (trio.TooSlowError, UpstreamError) as exc:
                why = "timed out" if isinstance(exc, trio.TooSlowError) else type(exc).__name__
                raise HttpError(
                    502,
                    f"endpoint {state.public!r} did not answer: {why}",
                    type_="server_error",
                    code="upstream_error",
                ) from None
            except BufferFull as exc:
                raise buffer_full_error(exc) from None
            if scope["method"] == "DELETE" and answer.status_code == 200:
                router.responses.forget(response_id)
            await send_json(
                send,
                answer.status_code,
                bytes(data),
                [
                    (b"x-request-id", scope[REQUEST_ID]),
                    (b"x-llmgw-endpoint", state.public.encode()),
                ],
            )
        finally:
            budget.give(held)

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
            raise auth_error(exc) from None
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
            pinned, chain = self._follow_up(body, chain, key)
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
        call = Call(
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
        extensions = scope.get("extensions")
        watch_disconnect: Watch | None = (
            extensions.get(WATCH_DISCONNECT) if extensions is not None else None
        )
        cancel = trio.CancelScope()
        watching = watch_disconnect(partial(watch.left, cancel)) if watch_disconnect else None
        try:
            if watching is not None:
                # llmgw's own server watches for us, with no task of this request's.
                with cancel, watching:
                    try:
                        await self._dispatch.serve(call)
                    except HttpError as err:
                        refused = err
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch.run, receive, nursery.cancel_scope)
                    try:
                        await self._dispatch.serve(call)
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
                spills=call.spills,
            )
            refused.recorded = True
            raise refused

    def _follow_up(
        self, body: RequestBody | FormBody, chain: list[ModelConfig], key: KeyRecord | None
    ) -> tuple[str | None, list[ModelConfig]]:
        """For a Responses request with ``previous_response_id``: the endpoint that
        holds that response, and its model alone (no fallback has it); 404 when llmgw
        does not know where it is (or `key` did not make it), or the replica is gone."""
        raw = body.member("previous_response_id")
        if raw is None:
            return None, chain
        if not isinstance(raw, str):
            raise HttpError(
                400, "previous_response_id must be a string", param="previous_response_id"
            )
        owner = key.id if key is not None else None
        home = self.router.responses.lookup(raw, trio.current_time(), owner)
        if home is None:  # unknown, or another key's: the same answer for both
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
                f"previous response {raw!r} was stored by endpoint "
                f"{public_name(home.endpoint)!r}, which no longer serves: its context is "
                "gone, start from the full conversation",
                code="previous_response_gone",
                param="previous_response_id",
            )
        return home.endpoint, [m for m in chain if m.name == home.model] or chain[:1]

    def _id_tap(self, call: Call, send: Send) -> Send:
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

    def _check_served(self, route: ApiPath, asked: str, chain: list[ModelConfig]) -> None:
        """404 when every replica of the model and its fallbacks runs an engine known
        not to serve `route` (retrying them would only repeat the engine's 404)."""
        if route.engines == PATHS[CHAT].engines:
            return
        engines = {engine_of(s) for m in chain for s in self.router.endpoints.serving(m.name)}
        if engines and not any(route.served_by(e) for e in engines):
            raise HttpError(
                404,
                f"no replica of {asked!r} serves {route.path}: they run "
                f"{engine_names(engines)}; {route.what} is served by "
                f"{engine_names(route.engines)}",
                code="unsupported_endpoint",
            )


def _end_span(call: Call, span: RequestSpan, refused: HttpError | None, gone: bool) -> None:
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


class _DisconnectWatch:
    def __init__(self) -> None:
        self.gone = False
        self.complete = False

    def left(self, scope: trio.CancelScope) -> None:
        """The client closed the connection: unless the answer is all handed over,
        the request is cancelled (and with it the engine's)."""
        if not self.complete:
            self.gone = True
            scope.cancel()

    async def run(self, receive: Receive, scope: trio.CancelScope) -> None:
        """The watch as a task, under an ASGI server without WATCH_DISCONNECT."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.left(scope)
                return
