"""A client request inside the router, and what the client routes share.

* :class:`Call`: one request from admission to its end, what was asked and by whom;
  made by the client app (:mod:`llmgw.router.app`), read and filled in by the
  dispatch (:mod:`llmgw.router.dispatch`).
* :class:`Native`: the client's own request, for replicas whose engine serves its API.
* :class:`HttpError`: a refusal in OpenAI's shape (:func:`auth_error` for the
  authenticator's).
* :class:`Routing`: what both use of their router.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol

import attrs

from llmgw.domain.engine_metrics import UNKNOWN
from llmgw.domain.keys import KeyRecord
from llmgw.domain.usage import Caller
from llmgw.http.asgi import Scope, Send
from llmgw.router.auth import AuthError
from llmgw.router.body import RequestBody
from llmgw.router.breaker import Outcome, Ticket
from llmgw.router.forms import FormBody
from llmgw.router.paths import ApiPath
from llmgw.router.proxy import AttemptFailed, BufferFull, Delivery
from llmgw.router.usage import estimate_prompt_tokens

if TYPE_CHECKING:
    from collections.abc import Iterable

    from llmgw.catalog import Catalog
    from llmgw.config import Config
    from llmgw.domain.catalog import ModelConfig
    from llmgw.http.engine_client import EngineClient
    from llmgw.router.access import AccessLog
    from llmgw.router.admission import AdmissionController
    from llmgw.router.affinity import PrefixIndex, Probe
    from llmgw.router.auth import Authenticator
    from llmgw.router.coldstart import ColdStarts
    from llmgw.router.endpoints import EndpointRegistry, EndpointState
    from llmgw.router.kv_events import Exact, KVEvents
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.proxy import Upstream
    from llmgw.router.responses import ResponseHomes
    from llmgw.router.scheduling import Decision
    from llmgw.router.sleep import Sleeper
    from llmgw.router.tracing import RequestSpan, Tracing


#: The scope key of a request's id (:func:`llmgw.router.app.request_id_of`).
REQUEST_ID = "llmgw.request_id"
#: The scope key of the id of the API key a request was authenticated with.
KEY_ID = "llmgw.key_id"
_TRACE_HEADERS = (b"traceparent", b"tracestate")


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


def auth_error(exc: AuthError) -> HttpError:
    """The authenticator's refusal as the client's error (its status, type and retry)."""
    retry = [(b"retry-after", str(int(exc.retry_after)).encode())] if exc.retry_after else []
    kind = {401: "authentication_error", 403: "permission_error", 503: "server_error"}.get(
        exc.status, "rate_limit_exceeded"
    )
    return HttpError(exc.status, str(exc), type_=kind, code=exc.code, headers=retry)


def buffer_full_error(exc: BufferFull) -> HttpError:
    """The buffered-answer budget spent: memory, not the replica (another's answer would
    not fit either), so the client is told to come back, and nothing is retried."""
    return HttpError(
        503,
        str(exc),
        type_="server_error",
        code="response_buffer_full",
        headers=[(b"retry-after", b"1")],
    )


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
    engine_client: EngineClient
    sleeper: Sleeper
    upstream: Upstream
    access_log: AccessLog | None
    prefixes: PrefixIndex | None
    kv_events: KVEvents | None
    rng: random.Random
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
        exact: Exact | None = None,
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
        probe: Probe | None = None,
        spills: tuple[tuple[str, str], ...] = (),
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
        spills: tuple[tuple[str, str], ...] = (),
    ) -> None: ...


class Call:
    """One client request on its way through the router: what was asked and by whom,
    from admission to its end. Made by the client app (`ClientApp._proxy`), which owns
    it; the dispatch's steps (`serve`, `_route`, `_attempt`) read it and fill in what
    they decide."""

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
        "spills",
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
        # (affinity, reason) per routing decision that sent it away from its home.
        self.spills: tuple[tuple[str, str], ...] = ()
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


def engine_of(state: EndpointState) -> str:
    """The engine a replica runs, as its metrics page says (unknown before a scrape)."""
    return UNKNOWN if state.sample is None else state.sample.engine
