"""The engine registry: one entry per engine llmgw can run, with everything the other
parts ask about it, so that adding an engine is one entry (and its agent adapter), and
one dialect entry when it speaks a ``/metrics`` dialect of its own.

Readers: the catalog's rules (known engines, who takes an API key, who sleeps),
placement (which may run on a node without GPUs), the reconciler (where an engine's
API key goes, who puts it to sleep) and the agent, which keeps each engine's adapter
under the engine's name (:data:`llmgw.agent.adapters.ADAPTERS`: that mapping is the
agent's, so this bottom-layer module names nothing above it; tests/test_engine_registry.py
checks that every entry has an adapter and every adapter an entry); of the dialect
entries, the metrics parser (:mod:`llmgw.domain.engine_metrics`: the router's scrapes
and the agent's drain), the router's paths (:mod:`llmgw.router.paths`: what each engine
serves) and its scraper (where an engine says its capacity).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

__all__ = [
    "DIALECTS",
    "DIALECT_ENTRIES",
    "ENGINES",
    "Api",
    "Dialect",
    "DialectEntry",
    "Engine",
    "MetricNames",
    "Sleeper",
    "cpu_engines",
]

#: The metric names an engine's ``/metrics`` page uses (their prefix: ``vllm:``, ...):
#: a key of :data:`DIALECT_ENTRIES`.
Dialect = str
#: Who puts an idle engine to sleep (a profile's `sleep_after`): "router", llmgw's
#: router through the engine's sleep API, waking it before the next request; "engine",
#: the engine on its own, waking at its next request.
Sleeper = Literal["router", "engine"]


@attrs.frozen
class Engine:
    """One engine llmgw can run, as every part of llmgw needs to know it."""

    name: str
    # May run on a node without GPUs (placement's CPU-capable profiles), and needs no
    # GPU from the agent.
    cpu: bool
    # What its /metrics page speaks: the simulator imitates vLLM's by default.
    metrics: Dialect
    # The environment variable it reads its API key from. None: it takes the key only
    # on its command line, where any user of the node could read it, so a profile's
    # api_key is refused for it.
    api_key_env: str | None
    # Who puts it to sleep; None: it does not sleep under llmgw.
    sleeps: Sleeper | None


#: Every engine by name, in the order errors and documents list them.
ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        # vLLM's --api-key default is VLLM_API_KEY; its sleep mode is driven by the router.
        Engine(
            "vllm",
            cpu=False,
            metrics="vllm",
            api_key_env="VLLM_API_KEY",
            sleeps="router",
        ),
        # SGLang's memory release is not used yet.
        Engine(
            "sglang",
            cpu=False,
            metrics="sglang",
            api_key_env=None,
            sleeps=None,
        ),
        # llmgw-sim imitates vLLM, its sleep API too.
        Engine(
            "sim",
            cpu=True,
            metrics="vllm",
            api_key_env="LLMGW_SIM_API_KEY",
            sleeps="router",
        ),
        # llama-server: a CPU build; it sleeps on its own (--sleep-idle-seconds).
        Engine(
            "llamacpp",
            cpu=True,
            metrics="llamacpp",
            api_key_env="LLAMA_API_KEY",
            sleeps="engine",
        ),
    )
}


def _current_then_older(_: object, attribute: attrs.Attribute[Any], names: tuple[str, ...]) -> None:
    if len(names) > 2:
        raise ValueError(f"{attribute.name}: a current name and at most one older, got {names}")


@attrs.frozen
class MetricNames:
    """Where a dialect's ``/metrics`` page says what the router reads
    (:mod:`llmgw.domain.engine_metrics`). A name tuple holds the current name first,
    then at most one older one, read only when the current one is absent."""

    waiting: str
    running: str
    kv_usage: tuple[str, ...] = attrs.field(default=(), validator=_current_then_older)
    # Cumulative prefix-cache counters (a windowed hit rate comes from two scrapes)...
    prefix_hits: tuple[str, ...] = attrs.field(default=(), validator=_current_then_older)
    prefix_queries: tuple[str, ...] = attrs.field(default=(), validator=_current_then_older)
    # ...or a hit-rate gauge.
    prefix_hit_rate: str | None = None


@attrs.frozen
class Api:
    """What an engine's HTTP API offers the router (:mod:`llmgw.router.paths`)."""

    # How docs and errors name the engine.
    title: str
    # The model-routed paths it serves: others are not sent to its replicas.
    paths: frozenset[str]
    # Anthropic's /v1/messages (and its count_tokens) served by the engine itself:
    # "stream" streamed too, "whole" only unstreamed requests (streams go translated
    # to a chat completion), "none" never.
    messages: Literal["stream", "whole", "none"]
    # Its /tokenize takes chat messages (what /v1/messages/count_tokens needs).
    tokenize_messages: bool
    # Where it says how many sequences it runs at once: (path, integer field of the
    # JSON object there); None: nothing says, its capacity comes from configuration.
    capacity: tuple[str, str] | None = None


@attrs.frozen
class DialectEntry:
    """What a /metrics page in this dialect, and the engine behind it, offer."""

    metrics: MetricNames
    api: Api


#: The chat, completion, embedding and token paths every engine serves.
_COMMON = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/v1/rerank",
    }
)

#: Every metric dialect, in the order errors and documents list them.
DIALECT_ENTRIES: dict[Dialect, DialectEntry] = {
    "vllm": DialectEntry(
        MetricNames(
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            prefix_queries=(
                "vllm:prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries_total",
            ),
            prefix_hit_rate="vllm:gpu_prefix_cache_hit_rate",  # v0
        ),
        Api(
            "vLLM",
            _COMMON
            | {
                "/v1/responses",
                "/rerank",
                "/v2/rerank",
                "/v1/score",
                "/score",
                "/pooling",
                "/classify",
                "/v1/chat/completions/render",
                "/v1/completions/render",
                "/v1/audio/transcriptions",
                "/v1/audio/translations",
            },
            messages="stream",
            tokenize_messages=True,
        ),
    ),
    "sglang": DialectEntry(
        MetricNames(
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            kv_usage=("sglang:token_usage",),
            prefix_hit_rate="sglang:cache_hit_rate",
        ),
        # Its tokenize is not documented to take chat messages.
        Api(
            "SGLang",
            _COMMON | {"/v1/responses", "/v1/score", "/classify", "/v1/classify"},
            messages="none",
            tokenize_messages=False,
        ),
    ),
    "llamacpp": DialectEntry(
        # Current builds export no KV gauge (older ones did), and no prefix-cache one.
        MetricNames(
            "llamacpp:requests_deferred",
            "llamacpp:requests_processing",
            kv_usage=("llamacpp:kv_cache_usage_ratio",),
        ),
        # Streamed /v1/messages go translated: llama-server (b11434) leaves out
        # `message_start` when its first sampled token ends inside a UTF-8 sequence (a
        # character split over tokens: common in CJK text and emoji); that event goes
        # only with token 1's partial result, which is not sent then (server-task.cpp,
        # server-context.cpp's process_token). Anthropic's clients cannot read such a
        # stream and its input tokens are lost; the chat stream's first chunk, whatever
        # it holds, starts the translated message.
        Api(
            "llama.cpp",
            _COMMON | {"/rerank"},
            messages="whole",
            tokenize_messages=True,
            capacity=("/props", "total_slots"),
        ),
    ),
}
DIALECTS: tuple[Dialect, ...] = tuple(DIALECT_ENTRIES)
assert {e.metrics for e in ENGINES.values()} <= set(DIALECTS), "an engine speaks no dialect"


def cpu_engines() -> frozenset[str]:
    """The engines that may run without a GPU."""
    return frozenset(name for name, e in ENGINES.items() if e.cpu)
