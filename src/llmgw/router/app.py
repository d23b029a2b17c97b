"""The client-facing OpenAI API as a plain ASGI app: the HTTP side of a request.

This is the hot path, so it is not built on a web framework: one dict lookup
routes the request, only the body's top level is parsed (llmgw.router.body), and
it is written back only when the router must change it (an alias, a fallback,
usage injection). The app authenticates the key, reads and parses the request
(OpenAI's, or Anthropic's Messages translated), answers what needs no engine (models,
health, a stored response's replica), and hands one
:class:`~llmgw.router.pipeline.Request` to the pipeline (llmgw.router.pipeline:
admission, scheduling, attempts, accounting), watching for the client leaving
meanwhile. Refusals are answered here in the client's API's shape.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import attrs
import trio

from llmgw.domain.endpoints import public_name
from llmgw.domain.usage import Caller
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
from llmgw.router import anthropic
from llmgw.router.body import BIG_BODY, BodyError, RequestBody, parse
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
from llmgw.router.pipeline.account import Refusal
from llmgw.router.pipeline.early import EarlyStream
from llmgw.router.pipeline.request import KEY_ID, REQUEST_ID, Native, Progress, Request, engine_of
from llmgw.router.refusal import HttpError
from llmgw.router.responses import SCAN_BYTES, response_id_in
from llmgw.router.stored import PREFIX as _RESPONSE_PREFIX
from llmgw.version import __version__

if TYPE_CHECKING:
    from llmgw.catalog.rules import Catalog
    from llmgw.domain.catalog import ModelConfig
    from llmgw.domain.keys import KeyRecord
    from llmgw.router.endpoints import EndpointRegistry
    from llmgw.router.pipeline import Pipeline
    from llmgw.router.readiness import ModelState, Readiness
    from llmgw.router.responses import ResponseHomes
    from llmgw.router.stored import StoredResponses
    from llmgw.router.tracing import Tracing

__all__ = ["ClientApp", "request_id_of"]

_MODEL_PREFIX = "/v1/models/"
# What a client's x-request-id may be to be passed on as is: short, and nothing a
# log line or another server's header parser could trip on.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,128}")

#: How a refusal is answered: in OpenAI's shape, or Anthropic's.
Refuse = Callable[[HttpError], Awaitable[None]]


def request_id_of(given: bytes | None) -> bytes:
    """The client's ``x-request-id`` when it is 1-128 characters of letters, digits
    and ``._:+/=@-``; else a new random one (32 hex digits)."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return secrets.token_hex(16).encode()


def _model_object(name: str, state: ModelState) -> dict[str, Any]:
    # Beside OpenAI's fields: whether a replica serves it now or it starts on request.
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "llmgw",
        "llmgw": {"state": state},
    }


async def _send_error(send: Send, request_id: bytes, err: HttpError) -> None:
    body = error_body(str(err), err.type, err.code, err.param)
    await send_json(send, err.status, body, [*err.headers, (b"x-request-id", request_id)])


async def _send_anthropic_error(send: Send, request_id: bytes, err: HttpError) -> None:
    body = anthropic.error_body(err.status, str(err))
    await json_response(send, err.status, body, [*err.headers, (b"x-request-id", request_id)])


def _query_model(scope: Scope) -> str | None:
    """The ``model`` query parameter's value, if given."""
    query = bytes(scope.get("query_string") or b"")
    for key, value in parse_qsl(query.decode("latin-1")):
        if key == "model":
            return value
    return None


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class ClientApp:
    """`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`, ..."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        catalog: Callable[[], Catalog],
        endpoints: EndpointRegistry,
        readiness: Readiness,
        responses: ResponseHomes,
        stored: StoredResponses,
        tracing: Tracing | None,
        big_parses: trio.CapacityLimiter,
        max_body_bytes: int,
        session_header: str,
    ) -> None:
        """`catalog` gives the models served now (swapped whole on a change);
        `big_parses` bounds the parses of bodies past BIG_BODY in worker threads (what a
        parse holds in memory is bounded by one body, not by how many arrive)."""
        self.pipeline = pipeline
        self.authenticate = pipeline.authenticate
        self.account = pipeline.account
        self.catalog = catalog
        self.endpoints = endpoints
        self.readiness = readiness
        self.responses = responses
        self.stored = stored
        self.tracing = tracing
        self._big_parses = big_parses
        self.max_body_bytes = max_body_bytes
        self.session_header = session_header.lower().encode()
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
            self._refused(scope, err, started)
            await _send_error(send, request_id, err)

    def _refused(
        self, scope: Scope, err: HttpError, started: float, code: str | None = None
    ) -> None:
        """Account a refusal made before the request was handed to the pipeline."""
        request_id = bytes(scope[REQUEST_ID]).decode("ascii")
        before = Refusal(request_id, scope["path"], started, scope.get(KEY_ID))
        self.account.refused(err, before=before, code=code)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Able to accept and hold requests (router.readiness); no key. With
        ``?model=NAME``, whether a replica serves that model now (its state either way)."""
        headers = [(b"x-request-id", scope[REQUEST_ID])]
        model = _query_model(scope)
        if model is None:
            ready = self.readiness.gateway()
            body = b'{"status":"ok"}' if ready else b'{"status":"not ready"}'
            await send_json(send, 200 if ready else 503, body, headers)
            return
        found = self.catalog().resolve(model)
        if found is None:
            raise HttpError(404, f"the model {model!r} does not exist", code="model_not_found")
        state = self.readiness.model(found)
        body = json.dumps(
            {
                "status": "ok" if state == "ready" else "not ready",
                "model": found.name,
                "state": state,
            }
        ).encode()
        await send_json(send, 200 if state == "ready" else 503, body, headers)

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = json.dumps({"version": __version__, "server": "llmgw"}).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.stored(scope, await self.authenticate.key(scope), send)

    async def _model(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /v1/models/{id}``: one model or alias the key may use and a replica
        serves or a request starts; 404 in OpenAI's shape otherwise (what
        ``models.retrieve`` expects)."""
        name = scope["path"].rstrip("/")[len(_MODEL_PREFIX) :]
        key = await self.authenticate.key(scope)
        entry = next((m for m in self._listed(key) if m[0] == name), None)
        if entry is None:
            raise HttpError(
                404, f"the model {name!r} does not exist", code="model_not_found", param="model"
            )
        body = json.dumps(_model_object(*entry)).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        listed = self._listed(await self.authenticate.key(scope))
        data = [_model_object(name, state) for name, state in listed]
        body = json.dumps({"object": "list", "data": data}).encode()
        await send_json(send, 200, body, [(b"x-request-id", scope[REQUEST_ID])])

    def _listed(self, key: KeyRecord | None) -> list[tuple[str, ModelState]]:
        """The names and aliases of the models a client may ask for now that `key` may
        use, with each one's state."""
        names = []
        permitted = None if key is None else key.models
        for model, state in self.readiness.listed():
            for name in (model.name, *model.aliases):
                # A key limited to some models sees those (by name or alias) only.
                if permitted is None or model.name in permitted or name in permitted:
                    names.append((name, state))
        return names

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        # Its deadline (router.timeouts.client_body) is the listener's: past it
        # llmgw.http.server reports a disconnect here and answers the 408 itself.
        try:
            return await read_body(scope, receive, self.max_body_bytes)
        except ClientLeft:
            raise ClientGone from None
        except BodyTooLarge as exc:
            of = f" of {exc.declared} bytes" if exc.declared is not None else ""
            raise HttpError(
                413, f"request body{of} exceeds the limit of {exc.limit} bytes"
            ) from None

    async def _inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = trio.current_time()
        key = await self.authenticate.key(scope)
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
        refuse = partial(_send_error, send, scope[REQUEST_ID])
        await self._proxy(scope, receive, send, route, body, key, started, refuse)

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
        refuse = partial(_send_anthropic_error, send, scope[REQUEST_ID])
        try:
            # Anthropic's clients send the key as x-api-key.
            given = header(scope, b"x-api-key")
            bearer = header(scope, b"authorization") or (b"Bearer " + given if given else None)
            key = await self.authenticate.key(scope, bearer)
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
            await self._proxy(scope, receive, reply, route, body, key, started, refuse, native)
        except anthropic.MessagesError as exc:
            err = HttpError(exc.status, str(exc), type_=exc.type)
            self._refused(scope, err, started, code=exc.type)
            await json_response(
                send, exc.status, exc.body(), [(b"x-request-id", scope[REQUEST_ID])]
            )
        except HttpError as err:
            self._refused(scope, err, started)
            await refuse(err)

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
        refuse: Refuse,
        native: Native | None = None,
    ) -> None:
        """Hand `body` on `route` to the pipeline, watching for the client leaving; a
        refusal before that raises HttpError, the pipeline's is answered with `refuse`.
        With `native`, a replica whose engine serves the client's own API gets the
        client's request (`native.body` on `native.path`, its answer sent as is)."""
        chain = self.catalog().candidates(body.model)
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
        watch = _DisconnectWatch()
        progress = Progress(_caller_of(key))
        tracked = watch.track(send)
        session = header(scope, self.session_header)
        # An OpenAI-shaped stream may begin before its replica answers (a cold start).
        responses = route.path == RESPONSES
        early = (
            EarlyStream(
                tracked,
                [(b"x-request-id", scope[REQUEST_ID])],
                partial(self._id_tap, progress) if responses else None,
            )
            if body.stream and route.streams and native is None
            else None
        )
        request = Request(
            scope,
            route,
            self._id_tap(progress, tracked) if responses else tracked,
            body,
            tuple(chain),
            started,
            key,
            session.decode(errors="replace") if session else None,
            progress,
            pinned=pinned,
            native=None if native is None else attrs.evolve(native, send=watch.track(native.send)),
            early=early,
        )
        if self.tracing is not None:
            progress.span = self.tracing.request(
                request.trace, f"{route.operation} {body.model}", started
            )
        refused: HttpError | None = None
        try:
            refused = await self._watched(request, receive, watch)
        finally:
            self.account.closed(request, refused, watch.gone)
        if refused is not None:
            if early is not None and early.begun:
                await early.refuse(refused)
            else:
                await refuse(refused)

    async def _watched(
        self, request: Request, receive: Receive, watch: _DisconnectWatch
    ) -> HttpError | None:
        """The pipeline's run, cancelled when the client leaves; its refusal, if any."""
        extensions = request.scope.get("extensions")
        watch_disconnect: Watch | None = (
            extensions.get(WATCH_DISCONNECT) if extensions is not None else None
        )
        cancel = trio.CancelScope()
        watching = watch_disconnect(partial(watch.left, cancel)) if watch_disconnect else None
        if watching is not None:
            # llmgw's own server watches for us, with no task of this request's.
            with cancel, watching:
                try:
                    await self.pipeline.serve(request)
                except HttpError as err:
                    return err
            return None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run, receive, nursery.cancel_scope)
            try:
                await self.pipeline.serve(request)
            except HttpError as err:
                return err  # returned outside, so no exception group wraps it
            finally:
                nursery.cancel_scope.cancel()
        return None

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
        home = self.responses.lookup(raw, trio.current_time(), owner)
        if home is None:  # unknown, or another key's: the same answer for both
            raise HttpError(
                404,
                f"previous response {raw!r} is unknown to this gateway: it was not made "
                "through it, was made before it started, or more than "
                f"{self.responses.ttl / 3600:g}h ago",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        state = self.endpoints.get(home.endpoint)
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

    @staticmethod
    def _id_tap(progress: Progress, send: Send) -> Send:
        """`send`, noting the id of the response it relays (so follow-ups find it)."""
        seen = 0

        async def tapped(message: MutableMapping[str, Any]) -> None:
            nonlocal seen
            if (
                progress.response_id is None
                and seen < SCAN_BYTES
                and message["type"] == "http.response.body"
            ):
                data = bytes(message.get("body", b""))
                progress.response_id = response_id_in(data)
                seen += len(data)
            await send(message)

        return tapped

    def _check_served(self, route: ApiPath, asked: str, chain: list[ModelConfig]) -> None:
        """404 when every replica of the model and its fallbacks runs an engine known
        not to serve `route` (retrying them would only repeat the engine's 404)."""
        if route.engines == PATHS[CHAT].engines:
            return
        engines = {engine_of(s) for m in chain for s in self.endpoints.serving(m.name)}
        if engines and not any(route.served_by(e) for e in engines):
            raise HttpError(
                404,
                f"no replica of {asked!r} serves {route.path}: they run "
                f"{engine_names(engines)}; {route.what} is served by "
                f"{engine_names(route.engines)}",
                code="unsupported_endpoint",
            )


def _caller_of(key: KeyRecord | None) -> Caller:
    return Caller(key.id if key is not None else None)


class _DisconnectWatch:
    """Whether the client left before its answer was all handed over."""

    def __init__(self) -> None:
        self.gone = False
        self.complete = False

    def track(self, send: Send) -> Send:
        """`send`, noting when the last byte is handed over (a disconnect no longer
        matters then) and a send that failed because the client has gone."""

        async def tracked(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.complete = True
            try:
                await send(message)
            except OSError:
                # What an ASGI server raises on a send to a client that has gone: the
                # disconnect may be seen here before the watcher's receive() sees it.
                self.gone = self.gone or not self.complete
                raise

        return tracked

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
