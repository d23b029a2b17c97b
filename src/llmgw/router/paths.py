"""The engine API paths the client port serves, and which engines serve each (as
their entries in the engine registry, llmgw.domain.engines, say).

Every path here is model-routed: its JSON body names the model, and the request
gets the catalog (aliases, fallbacks, a key's models), admission, scoring, retries
before the first byte, breakers, deadlines and usage accounting, then goes to the
chosen replica under the same path. A replica whose engine (as its metrics say) does
not serve the path is not chosen; when none of a model's replicas does, the client
gets 404 ``unsupported_endpoint`` naming the engines that would, never a retry.
A replica whose engine is not known yet (not scraped, or an engine llmgw does not
recognise) is tried, and its answer relayed: an engine's own 404 is not retried.

docs/router.md shows this table; tests/test_api_paths.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llmgw.domain.engine_metrics import UNKNOWN
from llmgw.domain.engines import DIALECT_ENTRIES, DIALECTS

__all__ = [
    "CHAT",
    "COUNT_TOKENS",
    "MESSAGES_NATIVE",
    "MESSAGES_NATIVE_STREAM",
    "PATHS",
    "RESPONSES",
    "ApiPath",
    "engine_names",
]


def _serving(path: str) -> frozenset[str]:
    """The engines whose registry entry serves `path`."""
    return frozenset(d for d, entry in DIALECT_ENTRIES.items() if path in entry.api.paths)


@attrs.frozen
class ApiPath:
    """One engine path: what it is, whether its body's ``stream`` applies, and the
    engines that serve it."""

    path: str
    what: str
    # Default: those whose registry entry lists the path (llmgw.domain.engines).
    engines: frozenset[str] = attrs.field()
    streams: bool = False
    # Whether ``stream_options.include_usage`` asks the engine for a usage chunk (chat
    # completions and completions; a Responses stream ends with its usage anyway).
    usage_option: bool = False
    # The events that end a whole stream, besides ``data: [DONE]``.
    final: tuple[bytes, ...] = ()
    # A multipart upload whose ``model`` form field names the model (audio).
    form: bool = False
    # Its ``gen_ai.operation.name`` in traces (the GenAI semantic conventions' name
    # where they have one): by default the path's last segment.
    operation: str = attrs.field()

    @engines.default
    def _registered(self) -> frozenset[str]:
        return _serving(self.path)

    @operation.default
    def _last_segment(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def served_by(self, engine: str) -> bool:
        """Whether a replica running `engine` may be sent this path (unknown: yes)."""
        return engine == UNKNOWN or engine in self.engines


CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"

PATHS: dict[str, ApiPath] = {
    p.path: p
    for p in (
        ApiPath(CHAT, "chat completions", streams=True, usage_option=True, operation="chat"),
        ApiPath(
            "/v1/completions",
            "completions",
            streams=True,
            usage_option=True,
            operation="text_completion",
        ),
        ApiPath(
            RESPONSES,
            "responses",
            streams=True,
            operation="chat",
            final=tuple(
                b"event: response." + end for end in (b"completed", b"failed", b"incomplete")
            ),
        ),
        ApiPath("/v1/embeddings", "embeddings"),
        ApiPath("/tokenize", "tokenize"),
        ApiPath("/detokenize", "detokenize"),
        ApiPath("/v1/rerank", "rerank"),
        ApiPath("/rerank", "rerank"),
        ApiPath("/v2/rerank", "rerank (Cohere v2 shape)"),
        ApiPath("/v1/score", "score"),
        ApiPath("/score", "score"),
        ApiPath("/pooling", "pooling"),
        ApiPath("/classify", "classify"),
        ApiPath("/v1/classify", "classify"),
        ApiPath("/v1/chat/completions/render", "chat prompt rendered, not run"),
        ApiPath("/v1/completions/render", "completion prompt rendered, not run"),
        ApiPath("/v1/audio/transcriptions", "audio transcription", form=True),
        ApiPath("/v1/audio/translations", "audio translation", form=True),
    )
}
_unserved = set().union(*(e.api.paths for e in DIALECT_ENTRIES.values())) - set(PATHS)
assert not _unserved, f"engine entries name paths the router does not serve: {_unserved}"


#: Engines that serve Anthropic's ``/v1/messages`` (and ``/count_tokens``) themselves:
#: they get the client's request as sent. The others get its translation to a chat
#: completion, and so does a replica whose engine answers 404 to it (vLLM's versions
#: before it had the endpoint).
MESSAGES_NATIVE = frozenset(d for d, e in DIALECT_ENTRIES.items() if e.api.messages != "none")
#: Those of them that get a *streamed* request as sent (llama.cpp's entry says why it
#: does not).
MESSAGES_NATIVE_STREAM = frozenset(
    d for d, e in DIALECT_ENTRIES.items() if e.api.messages == "stream"
)

#: Where ``/v1/messages/count_tokens`` goes: ``/tokenize`` of chat messages, on the
#: engines whose tokenize takes them.
COUNT_TOKENS = ApiPath(
    "/tokenize",
    "counting the tokens of chat messages",
    frozenset(d for d, e in DIALECT_ENTRIES.items() if e.api.tokenize_messages),
)


def engine_names(engines: Iterable[str]) -> str:
    """``vLLM, SGLang`` for error messages and docs, in a fixed order."""
    return ", ".join(DIALECT_ENTRIES[e].api.title for e in DIALECTS if e in set(engines))
