"""One client request inside the router: what was asked and by whom (:class:`Request`,
fixed once the client app has read it), and what happened to it on the way
(:class:`Progress`, written by the pipeline's stages, read by its account).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from llmgw.domain.engine_metrics import UNKNOWN
from llmgw.domain.usage import Caller
from llmgw.router.usage import estimate_prompt_tokens, expected_tokens

if TYPE_CHECKING:
    from llmgw.domain.catalog import ModelConfig
    from llmgw.domain.keys import KeyRecord
    from llmgw.http.asgi import Scope, Send
    from llmgw.router.body import RequestBody
    from llmgw.router.endpoints import EndpointState
    from llmgw.router.forms import FormBody
    from llmgw.router.paths import ApiPath
    from llmgw.router.pipeline.early import EarlyStream
    from llmgw.router.tracing import RequestSpan

__all__ = ["KEY_ID", "REQUEST_ID", "Native", "Progress", "Request", "engine_of"]

#: The scope key of a request's id (llmgw.router.app.request_id_of).
REQUEST_ID = "llmgw.request_id"
#: The scope key of the id of the API key a request was authenticated with.
KEY_ID = "llmgw.key_id"
_TRACE_HEADERS = (b"traceparent", b"tracestate")


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


@attrs.define(slots=True)
class Progress:
    """What the stages decided of a request so far."""

    # The key at once (a refusal before admission is still the key's); admission adds
    # the band and tenant.
    caller: Caller
    queued: float = 0.0  # seconds admission held it
    retries: int = 0  # attempts after the first, on other endpoints
    # (affinity, reason) per routing decision that sent it away from its home.
    spills: tuple[tuple[str, str], ...] = ()
    # The id of the Responses API response relayed, once seen in the answer.
    response_id: str | None = None
    # Its trace span, when tracing is on and the sampler picked it.
    span: RequestSpan | None = None


@attrs.frozen(slots=True)
class Request:
    """One client request, from the moment its body is read to its end."""

    scope: Scope
    route: ApiPath
    # Where the answer goes (watched for the client leaving).
    send: Send
    body: RequestBody | FormBody
    # The model asked for, then its fallbacks (only the stored one's, for a follow-up).
    chain: tuple[ModelConfig, ...]
    started: float
    key: KeyRecord | None
    session_key: str | None
    progress: Progress
    # The endpoint a Responses follow-up must go to (the previous response's).
    pinned: str | None = None
    # The client's own request, for replicas whose engine serves its API natively.
    native: Native | None = None
    # A stream's answer, begun early while its model wakes (`send` goes through it).
    early: EarlyStream | None = None
    request_id: str = attrs.field(init=False)
    # W3C trace context, passed to the engine unchanged (vLLM continues the trace).
    trace: list[tuple[bytes, bytes]] = attrs.field(init=False)
    # Embeddings, rerank and the like never stream, whatever the body says.
    stream: bool = attrs.field(init=False)
    # What the client gets of the engine's usage: a chunk it asked for, or a Responses
    # stream's own (never stripped).
    wants_usage: bool = attrs.field(init=False)
    # Estimated from the body's size: the prefill work routing charges, and the usage
    # of a stream cut before the engine reported any.
    prompt_tokens: int = attrs.field(init=False)
    # Prompt and completion tokens it may take: what rate limits and admission charge.
    expected_tokens: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        body, route, scope = self.body, self.route, self.scope
        stream = body.stream and route.streams
        size = len(body.raw)
        put = object.__setattr__  # frozen: the derived fields are set once, here
        put(self, "request_id", bytes(scope[REQUEST_ID]).decode("ascii"))
        put(self, "trace", [(k, v) for k, v in scope["headers"] if k in _TRACE_HEADERS])
        put(self, "stream", stream)
        put(self, "wants_usage", stream and (body.include_usage or not route.usage_option))
        put(self, "prompt_tokens", estimate_prompt_tokens(size))
        put(self, "expected_tokens", expected_tokens(size, body.max_tokens))

    @property
    def model(self) -> ModelConfig:
        """The configured model asked for (an alias resolved)."""
        return self.chain[0]

    @property
    def path(self) -> str:
        return str(self.scope["path"])


def engine_of(state: EndpointState) -> str:
    """The engine a replica runs, as its metrics page says (unknown before a scrape)."""
    return UNKNOWN if state.sample is None else state.sample.engine
