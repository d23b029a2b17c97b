"""vLLM's render endpoints: a chat or completion request turned into token ids, unrun.

``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` take the
body of ``/v1/chat/completions`` and ``/v1/completions`` and answer with what vLLM
would hand its engine: a ``GenerateRequest`` (vLLM's token-in API object) per
prompt, the chat route one object, the completions route a list (one per prompt of a
batch). A router that scores replicas on token-level prefixes calls these to get the
engine's own token ids without generating anything.

The shape follows vLLM's ``vllm/entrypoints/serve/render/`` (``api_router.py``,
``serving.py``) and ``GenerateRequest`` in ``vllm/entrypoints/serve/disagg/protocol.py``::

    {"request_id": "chatcmpl-<uuid4 hex>" | "cmpl-<uuid4 hex>",
     "token_ids": [int, ...],
     "features": null,                      # multimodal hashes/placeholders; none here
     "sampling_params": {...},              # vLLM SamplingParams field names
     "model": <the request's "model", as given, or null>,
     "stream": bool,
     "stream_options": {...} | null,        # only when streaming, as vLLM does
     "cache_salt": str | null, "priority": int, "kv_transfer_params": null}

Errors are OpenAI-shaped: 404 for an unknown model, 400 for anything malformed.
``max_tokens`` is what vLLM computes: the request's (which must fit the context with
the prompt), else what is left of ``max_model_len`` after the prompt.

What is uncertain: vLLM has changed this shape. Earlier versions (their
``tests/entrypoints/openai/test_render.py``) answered the chat route with
``[conversation, engine_prompts]`` and each prompt as ``{"prompt_token_ids",
"prompt"}``; the simulator serves only the current ``GenerateRequest`` form, which is
what the callers found read (llm-d's and Dynamo's scheduler plug-ins, vLLM's own
scale-out frontend): ``token_ids`` of the chat object and of each completions item.
The vllm-project/router sources read for this (``policies/cache_aware.rs``,
``docs/load_balancing/README.md``) key the ``cache_aware`` tree on request text, and
no call to render was found in them, so the shape a given vllm-router release expects
is not confirmed. ``sampling_params`` carries the fields the simulator validates, in
vLLM's names and defaults, not every field of vLLM's ``SamplingParams``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["RenderError", "request_fields", "sampling_params"]


class RenderError(ValueError):
    """A malformed field: `param` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RenderError(f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise RenderError(f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _int(body: Mapping[str, Any], name: str, default: int | None, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise RenderError(f"'{name}' must be an integer of at least {lo}", name)
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RenderError(f"'{name}' must be a boolean", name)
    return value


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise RenderError("'stop' must be a string or a list of strings", "stop")


def _stop_token_ids(body: Mapping[str, Any]) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if isinstance(ids, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        return list(ids)
    raise RenderError("'stop_token_ids' must be a list of token ids", "stop_token_ids")


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    if not chat:
        return _int(body, "logprobs", None, 0)
    # Chat: a boolean switch and the number of alternatives per token.
    top = _int(body, "top_logprobs", None, 0)
    if _bool(body, "logprobs", False):
        return top if top is not None else 0
    return None


def sampling_params(
    body: Mapping[str, Any], chat: bool, max_tokens: int, seed: int | None
) -> dict[str, Any]:
    """``sampling_params`` of a rendered request, in vLLM's names and defaults."""
    min_tokens = _int(body, "min_tokens", 0, 0)
    assert min_tokens is not None
    if min_tokens > max_tokens:
        raise RenderError(
            f"'min_tokens' ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    return {
        "n": 1,
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _number(body, "repetition_penalty", 1.0, 0.0, math.inf),
        "temperature": _number(body, "temperature", 1.0, 0.0, math.inf),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "top_k": _int(body, "top_k", 0, -1),
        "min_p": _number(body, "min_p", 0.0, 0.0, 1.0),
        "seed": seed,
        "stop": _stop(body),
        "stop_token_ids": _stop_token_ids(body),
        "ignore_eos": _bool(body, "ignore_eos", False),
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "logprobs": _logprobs(body, chat),
        "prompt_logprobs": _int(body, "prompt_logprobs", None, 0),
        "skip_special_tokens": _bool(body, "skip_special_tokens", True),
        "spaces_between_special_tokens": _bool(body, "spaces_between_special_tokens", True),
    }


def request_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a rendered request that do not depend on its prompt."""
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RenderError("'stream_options' must be an object", "stream_options")
    stream_options: dict[str, Any] | None = None
    if options is not None:
        try:
            stream_options = {
                "include_usage": _bool(options, "include_usage", True),
                "continuous_usage_stats": _bool(options, "continuous_usage_stats", False),
            }
        except RenderError as e:
            raise RenderError(f"'stream_options': {e}", "stream_options") from None
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise RenderError("'cache_salt' must be a non-empty string", "cache_salt")
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RenderError("'priority' must be an integer", "priority")
    return {
        "features": None,
        "model": body.get("model"),
        "stream": stream,
        "stream_options": stream_options if stream else None,
        "cache_salt": salt,
        "priority": priority,
        "kv_transfer_params": None,
    }
