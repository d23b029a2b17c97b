"""A chat completion as a Messages response (:func:`from_chat`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from llmgw.router.anthropic.wire import FINISH, RAW_ARGUMENTS, Json, MessagesError

__all__ = ["bad_engine", "from_chat", "message_id", "stop_reason", "tool_id", "usage_of"]


def bad_engine(message: str) -> MessagesError:
    # The engine answered, but not in a shape we can translate: our fault, not the client's.
    return MessagesError(502, "api_error", f"engine response: {message}")


def message_id(chat_id: Any) -> str:
    # The engine's id inside ours, so that a client's message id finds the engine's logs.
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def tool_id(value: Any) -> str:
    # The engine's own id, kept: it comes back as tool_call_id, and some chat templates
    # check its format (Mistral's nine characters).
    return value if isinstance(value, str) and value else "toolu_" + uuid.uuid4().hex[:24]


def _input(arguments: Any) -> Json:
    """A tool call's arguments as a tool_use input."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}  # Some engines send nothing for a tool without parameters.
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    # Not a JSON object: kept, not dropped, so that the client's tool reports the
    # model's mistake back to it (and to_chat sends these very arguments back).
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {RAW_ARGUMENTS: text}


def stop_reason(
    finish: Any, choice: Json, has_tools: bool, stop_sequences: Sequence[str] | None
) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` for an engine's finish."""
    if isinstance(finish, str) and finish in FINISH:
        return FINISH[finish], None
    if has_tools:
        return "tool_use", None  # Some engines finish a tool call with "stop".
    for matched in (choice.get("stop_reason"), choice.get("matched_stop")):
        # vLLM and SGLang name the stop string they matched (an int is an EOS token).
        if isinstance(matched, str) and (stop_sequences is None or matched in stop_sequences):
            return "stop_sequence", matched
    return "end_turn", None


def usage_of(usage: Any) -> Json:
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    prompt = usage.get("prompt_tokens")
    prompt = prompt if isinstance(prompt, int) else 0
    output = usage.get("completion_tokens")
    result: Json = {
        "input_tokens": prompt,
        "output_tokens": output if isinstance(output, int) else 0,
    }
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool):
        # Anthropic's input_tokens excludes cache reads (the total is their sum).
        cached = min(cached, prompt)
        result["input_tokens"] = prompt - cached
        result["cache_read_input_tokens"] = cached
    return result


def from_chat(response: Json, model: str, *, stop_sequences: Sequence[str] | None = None) -> Json:
    """A chat completion as a Messages response.

    `model` is the name the client asked for (the engine's may differ). With
    `stop_sequences` (the request's), only those count as matched stop sequences.
    Raises :class:`MessagesError` (502, ``api_error``) for a response without a choice.
    """
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad_engine("no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise bad_engine("choices.0.message is not an object")
    content: list[Json] = []
    text = message.get("content")
    if isinstance(text, list):
        # Content parts, as some engines answer: the text ones are the answer.
        text = "".join(
            part["text"]
            for part in text
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise bad_engine("a tool call without a function")
        name = function.get("name")
        content.append(
            {
                "type": "tool_use",
                "id": tool_id(call.get("id")),
                "name": name if isinstance(name, str) else "",
                "input": _input(function.get("arguments")),
            }
        )
    has_tools = any(block["type"] == "tool_use" for block in content)
    reason, sequence = stop_reason(choice.get("finish_reason"), choice, has_tools, stop_sequences)
    return {
        "id": message_id(response.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(response.get("usage")),
    }
