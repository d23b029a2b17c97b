"""vLLM's tokenize-only routes: a prompt to token ids and back, and the render
routes' GenerateRequests (see :mod:`llmgw.sim.render`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from llmgw.sim import parsing, render, tokens
from llmgw.sim.state import SimState
from llmgw.sim.wire import HTTPError, Receive, Scope, Send, parse_json, read_body, send_json

_WORD_OF = dict(zip(tokens.WORD_IDS, tokens.WORDS, strict=True))


class Tokenizing:
    """vLLM's tokenizer routes: ``/tokenize``, ``/detokenize`` and the render routes."""

    def __init__(self, state: SimState) -> None:
        self.config = state.config

    def _render_prompts(self, body: Mapping[str, Any]) -> list[tuple[int, ...]]:
        """A completions body's prompts: one string or token-id list, or a batch of them."""
        prompt = body.get("prompt")
        is_ids = isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        )
        if not isinstance(prompt, list) or is_ids:
            return [parsing.prompt_ids(self.config, body, chat=False)]
        if not prompt:
            raise HTTPError(400, "'prompt' must not be an empty list", param="prompt")
        out: list[tuple[int, ...]] = []
        for item in prompt:
            if not isinstance(item, str | list) or (
                isinstance(item, list) and any(isinstance(x, str | list) for x in item)
            ):
                raise HTTPError(
                    400,
                    "each 'prompt' of a batch must be a string or a list of token ids",
                    param="prompt",
                )
            out.append(parsing.prompt_ids(self.config, {"prompt": item}, chat=False))
        return out

    def _render(self, body: Mapping[str, Any], chat: bool) -> list[dict[str, Any]]:
        """The GenerateRequest of each prompt of `body` (one for chat)."""
        parsing.check_model(self.config, body)
        prompts = (
            [parsing.prompt_ids(self.config, body, chat=True)]
            if chat
            else self._render_prompts(body)
        )
        limit, param, seed = parsing.sampling_limits(body, chat)
        context = self.config.engine.max_model_len
        try:
            fields = render.request_fields(body)
            out: list[dict[str, Any]] = []
            for ids in prompts:
                if not ids:
                    raise HTTPError(
                        400, "the prompt is empty", param="messages" if chat else "prompt"
                    )
                room = context - len(ids)
                if room < 1 or (limit is not None and limit > room):
                    asked = f" and asks for {limit} more" if limit is not None else ""
                    raise HTTPError(
                        400,
                        f"this model's maximum context length is {context} tokens; the "
                        f"request has {len(ids)} prompt tokens{asked}",
                        param=param,
                    )
                max_tokens = room if limit is None else limit
                prefix = "chatcmpl" if chat else "cmpl"
                out.append(
                    {
                        "request_id": f"{prefix}-{uuid.uuid4().hex}",
                        "token_ids": list(ids),
                        "sampling_params": render.sampling_params(body, chat, max_tokens, seed),
                        **fields,
                    }
                )
        except render.RenderError as e:
            raise HTTPError(400, str(e), param=e.param) from None
        return out

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /tokenize: a `prompt` or chat `messages` to token ids."""
        body = parse_json(await read_body(scope, receive))
        parsing.check_model(self.config, body)
        ids = parsing.prompt_ids(self.config, body, chat="messages" in body)
        await send_json(
            send,
            200,
            {
                "count": len(ids),
                "max_model_len": self.config.engine.max_model_len,
                "tokens": list(ids),
            },
        )

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /detokenize: token ids back to text. Ids of generated words become
        their words; any other id (prompt slices are hashed) becomes ``<id>``."""
        body = parse_json(await read_body(scope, receive))
        parsing.check_model(self.config, body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokens.VOCAB_SIZE
            for t in ids
        ):
            raise HTTPError(400, "'tokens' must be a list of token ids", param="tokens")
        text = "".join(_WORD_OF.get(t, f"<{t}>") for t in ids)
        await send_json(send, 200, {"prompt": text})

    async def chat_render(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        await send_json(send, 200, self._render(body, chat=True)[0])

    async def completions_render(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        await send_json(send, 200, self._render(body, chat=False))
