"""Token accounting: what one request used, who sent it, and where the records go
(the router writes them; the store, the dashboard and the autoscaler read them)."""

from __future__ import annotations

from typing import Any, Protocol

import attrs


@attrs.frozen
class Usage:
    """Token counts of one response; `estimated` when the engine never said."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    estimated: bool = False

    @classmethod
    def from_openai(cls, usage: Any) -> Usage | None:
        """From an OpenAI `usage` object (the Responses API's names too), or None when
        it is not one."""
        if not isinstance(usage, dict):
            return None
        # The Responses and Anthropic APIs' names; Anthropic's message_delta carries
        # only output_tokens (the input came with message_start): 0 here, the relay
        # keeps the earlier count.
        responses = "input_tokens" in usage or "output_tokens" in usage
        prompt = usage.get("input_tokens", 0) if responses else usage.get("prompt_tokens")
        completion = usage.get("output_tokens" if responses else "completion_tokens", 0)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        details = usage.get("input_tokens_details" if responses else "prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        read = usage.get("cache_read_input_tokens")
        if isinstance(read, int) and not isinstance(read, bool):
            # Anthropic's input_tokens leaves out the tokens the cache read.
            return cls(prompt + read, completion, read)
        return cls(prompt, completion, cached if isinstance(cached, int) else None)


@attrs.frozen
class Caller:
    """Who sent a request: the API key (when keys are in use), its band and tenant."""

    key_id: str | None = None
    band: str | None = None
    tenant: str | None = None


@attrs.frozen
class UsageRecord:
    """One finished request, as the store and the dashboard see it."""

    model: str
    endpoint: str | None
    status: int
    usage: Usage
    latency: float
    ttft: float | None = None
    key_id: str | None = None
    band: str | None = None
    tenant: str | None = None
    # Attempts moved to another endpoint before this answer (or refusal); None where
    # the recorder does not count them, which is not the same as none.
    retries: int | None = None
    # The request's x-request-id (the client's, or the one llmgw made).
    request_id: str | None = None
    # The API path it came on (/v1/chat/completions, ...).
    path: str | None = None
    # Seconds admission held it in its band's queue.
    queue_wait: float | None = None
    # A refusal's error code (model_not_found, queue_full, upstream_error, ...).
    error: str | None = None
    # The prefix table's prediction of what the serving replica held of the prompt,
    # weighed against the engine's cached tokens: "hit", "miss", "over" or "under"
    # (llmgw_prefix_predictions_total's outcomes); None where none was weighed (no
    # prediction, or the engine reported no cached tokens).
    prediction: str | None = None
    # The affinity spills of its routing decisions, one (affinity, reason) per decision
    # that sent it away from its home (llmgw_affinity_spills_total's labels); () when
    # none did, None where the recorder does not count them. Not stored: the dashboard's.
    spills: tuple[tuple[str, str], ...] | None = None
    # For the access log (not stored): the model name the client sent (an alias, or
    # the model a fallback stood in for), the client's address, the key's name.
    asked: str | None = None
    client: str | None = None
    key_name: str | None = None
    # Served by a fallback of the model asked for (None: refused, or not known).
    fallback: bool | None = None


class UsageSink(Protocol):
    """Where finished requests are recorded (the store batches them)."""

    def record(self, record: UsageRecord) -> None:
        """Take one record; must not block (the caller is on the hot path)."""
