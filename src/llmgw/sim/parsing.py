"""What a generation request asks for, read from its body: the model, the prompt as
token ids, the output limit and seed, whether it streams. A bad body is a 400 (an
unknown model a 404) in OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from llmgw.sim import tokens
from llmgw.sim.config import SimConfig
from llmgw.sim.model import Engine
from llmgw.sim.wire import HTTPError


@attrs.frozen
class GenerationRequest:
    """A validated /v1/chat/completions or /v1/completions body."""

    chat: bool
    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    explicit_max_tokens: bool
    stream: bool
    include_usage: bool
    seed: int | None


def check_model(config: SimConfig, body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        return config.models[0]
    if not isinstance(model, str) or model not in config.models:
        raise HTTPError(
            404,
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    return model


def prompt_ids(config: SimConfig, body: Mapping[str, Any], chat: bool) -> tuple[int, ...]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "'messages' must be a non-empty list", param="messages")
        try:
            return _encode(config, tokens.render_chat(messages), "messages")
        except ValueError as e:
            raise HTTPError(400, str(e), param="messages") from None
    prompt = body.get("prompt")
    # A one-element batch is the same as its element; real batches are not simulated.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _encode(config, prompt, "prompt")
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
    ):
        return tuple(prompt)
    raise HTTPError(
        400,
        "'prompt' must be a string or a list of token ids (batches are not supported)",
        param="prompt",
    )


def _encode(config: SimConfig, text: str, param: str) -> tuple[int, ...]:
    # Refuse an oversized prompt before paying to tokenize all of it.
    limit = config.engine.max_model_len
    if tokens.count(text) >= limit:
        raise HTTPError(
            400,
            f"the prompt has {tokens.count(text)} tokens; this model's maximum context "
            f"length is {limit} tokens",
            param=param,
        )
    return tuple(tokens.encode(text))


def generation_request(
    config: SimConfig, engine: Engine, body: Mapping[str, Any], chat: bool
) -> GenerationRequest:
    model = check_model(config, body)
    prompt = prompt_ids(config, body, chat)
    asked, param, seed = sampling_limits(body, chat)
    explicit = asked is not None
    if asked is None:
        room = config.engine.max_model_len - len(prompt)
        asked = max(1, min(config.default_max_tokens, room))
    limit: int = asked
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    try:
        engine.check(len(prompt), limit)
    except ValueError as e:
        raise HTTPError(400, str(e), param=param) from None
    return GenerationRequest(
        chat=chat,
        model=model,
        prompt=prompt,
        max_tokens=limit,
        explicit_max_tokens=explicit,
        stream=stream,
        include_usage=include_usage,
        seed=seed,
    )


def sampling_limits(body: Mapping[str, Any], chat: bool) -> tuple[int | None, str, int | None]:
    """The output limit a request asks for (None: none), the field that asked it, and
    its seed; 400 for what the simulator does not serve (n > 1) or a bad value."""
    n = body.get("n", 1)
    if n not in (None, 1):
        raise HTTPError(400, "only n=1 is supported", param="n")
    limit = body.get("max_completion_tokens") if chat else None
    param = "max_completion_tokens"
    if limit is None:
        limit, param = body.get("max_tokens"), "max_tokens"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HTTPError(400, f"'{param}' must be a positive integer", param=param)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise HTTPError(400, "'seed' must be an integer", param="seed")
    return limit, param, seed
