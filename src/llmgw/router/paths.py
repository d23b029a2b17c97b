"""The engine API paths the client port serves, and which engines serve each.

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
from llmgw.domain.engines import DIALECTS

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

_VLLM, _SGLANG, _LLAMACPP = "vllm", "sglang", "llamacpp"
_ALL = frozenset(DIALECTS)

#: How docs and errors name the engines.
_NAMES = {_VLLM: "vLLM", _SGLANG: "SGLang", _LLAMACPP: "llama.cpp"}


@attrs.frozen
class ApiPath:
    """One engine path: what it is, whether its body's ``stream`` applies, and the
    engines that serve it."""

    path: str
    what: str
    engines: frozenset[str]
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
        ApiPath(CHAT, "chat completions", _ALL, streams=True, usage_option=True, operation="chat"),
        ApiPath(
            "/v1/completions",
            "completions",
            _ALL,
            streams=True,
            usage_option=True,
            operation="text_completion",
        ),
        ApiPath(
            RESPONSES,
            "responses",
            frozenset({_VLLM, _SGLANG}),
            streams=True,
            operation="chat",
            final=tuple(
                b"event: response." + end for end in (b"completed", b"failed", b"incomplete")
            ),
        ),
        ApiPath("/v1/embeddings", "embeddings", _ALL),
        ApiPath("/tokenize", "tokenize", _ALL),
        ApiPath("/detokenize", "detokenize", _ALL),
        ApiPath("/v1/rerank", "rerank", _ALL),
        ApiPath("/rerank", "rerank", frozenset({_VLLM, _LLAMACPP})),
        ApiPath("/v2/rerank", "rerank (Cohere v2 shape)", frozenset({_VLLM})),
        ApiPath("/v1/score", "score", frozenset({_VLLM, _SGLANG})),
        ApiPath("/score", "score", frozenset({_VLLM})),
        ApiPath("/pooling", "pooling", frozenset({_VLLM})),
        ApiPath("/classify", "classify", frozenset({_VLLM, _SGLANG})),
        ApiPath("/v1/classify", "classify", frozenset({_SGLANG})),
        ApiPath("/v1/chat/completions/render", "chat prompt rendered, not run", frozenset({_VLLM})),
        ApiPath(
            "/v1/completions/render", "completion prompt rendered, not run", frozenset({_VLLM})
        ),
        ApiPath("/v1/audio/transcriptions", "audio transcription", frozenset({_VLLM}), form=True),
        ApiPath("/v1/audio/translations", "audio translation", frozenset({_VLLM}), form=True),
    )
}


#: Engines that serve Anthropic's ``/v1/messages`` (and ``/count_tokens``) themselves:
#: they get the client's request as sent. The others get its translation to a chat
#: completion, and so does a replica whose engine answers 404 to it (vLLM's versions
#: before it had the endpoint).
MESSAGES_NATIVE = frozenset({_LLAMACPP, _VLLM})
#: Those of them that get a *streamed* request as sent. llama-server (b11434) leaves
#: out ``message_start`` when its first sampled token ends inside a UTF-8 sequence (a
#: character split over tokens: common in CJK text and emoji): that event goes only
#: with the partial result of token 1, which is not sent then (server-task.cpp,
#: server-context.cpp's process_token). Anthropic's clients cannot read such a stream
#: and its input tokens are lost, so llama.cpp's streams go translated, where the chat
#: stream's first chunk, whatever it holds, starts the message.
MESSAGES_NATIVE_STREAM = frozenset({_VLLM})

#: Where ``/v1/messages/count_tokens`` goes: ``/tokenize`` of chat messages on vLLM, the
#: engine's own on llama.cpp (SGLang's tokenize is not documented to take messages).
COUNT_TOKENS = ApiPath(
    "/tokenize", "counting the tokens of chat messages", frozenset({_VLLM, _LLAMACPP})
)


def engine_names(engines: Iterable[str]) -> str:
    """``vLLM, SGLang`` for error messages and docs, in a fixed order."""
    return ", ".join(_NAMES[e] for e in DIALECTS if e in set(engines))
