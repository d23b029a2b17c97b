"""A Messages request as a chat completions request (:func:`to_chat`), every member
checked strictly: what cannot be honoured is a 400, never dropped."""

from __future__ import annotations

import json
import re
from typing import Any

from llmgw.router.anthropic.wire import RAW_ARGUMENTS, Json, MessagesError

__all__ = ["to_chat"]

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

# Request members accepted; anything else is a 400 rather than silently dropped, so
# a client relying on a feature we cannot honour learns it at once.
_MEMBERS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "metadata",
        "thinking",
        # Scheduling hints for Anthropic's own fleet: meaningless here, harmless.
        "service_tier",
    }
)


def _invalid(message: str) -> MessagesError:
    return MessagesError(400, "invalid_request_error", message)


def _object(value: Any, path: str) -> Json:
    if not isinstance(value, dict):
        raise _invalid(f"{path}: Input should be an object")
    return value


def _string(value: Any, path: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{path}: Input should be a valid string")
    if not empty and not value:
        raise _invalid(f"{path}: String should have at least 1 character")
    return value


def _list(value: Any, path: str, *, empty: bool = True) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid(f"{path}: Input should be a valid list")
    if not empty and not value:
        raise _invalid(f"{path}: List should have at least 1 item")
    return value


def _keys(block: Json, path: str, allowed: frozenset[str]) -> None:
    extra = sorted(set(block) - allowed)
    if extra:
        raise _invalid(f"{path}.{extra[0]}: Extra inputs are not permitted")


def _number(value: Any, path: str, low: float, high: float) -> float:
    # bool is an int to Python, never a number to JSON Schema.
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _invalid(f"{path}: Input should be a number from {low:g} to {high:g}")
    return value


# The router's own bound on max_tokens (router/body.py): past it, its arithmetic on the
# token budget stops meaning anything.
_MAX_INTEGER = 1 << 31


def _integer(value: Any, path: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INTEGER:
        raise _invalid(f"{path}: Input should be an integer from {low} to {_MAX_INTEGER}")
    return value


_TEXT_KEYS = frozenset({"type", "text", "cache_control", "citations"})
_IMAGE_KEYS = frozenset({"type", "source", "cache_control"})
_TOOL_USE_KEYS = frozenset({"type", "id", "name", "input", "cache_control"})
_TOOL_RESULT_KEYS = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"})


def _text(block: Json, path: str) -> str:
    _keys(block, path, _TEXT_KEYS)
    if block.get("citations"):
        raise _invalid(f"{path}.citations: citations are not supported")
    return _string(block.get("text"), f"{path}.text")


def _image(block: Json, path: str) -> Json:
    _keys(block, path, _IMAGE_KEYS)
    source = _object(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        _keys(source, f"{path}.source", frozenset({"type", "media_type", "data"}))
        media = source.get("media_type")
        if not isinstance(media, str) or media not in _IMAGE_TYPES:
            raise _invalid(
                f"{path}.source.media_type: Input should be one of "
                + ", ".join(sorted(_IMAGE_TYPES))
            )
        data = _string(source.get("data"), f"{path}.source.data", empty=False)
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        _keys(source, f"{path}.source", frozenset({"type", "url"}))
        url = _string(source.get("url"), f"{path}.source.url", empty=False)
    else:
        raise _invalid(f"{path}.source.type: Input should be 'base64' or 'url'")
    return {"type": "image_url", "image_url": {"url": url}}


def _block(value: Any, path: str) -> tuple[str, Json]:
    block = _object(value, path)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise _invalid(f"{path}.type: Field required")
    return kind, block


def _system(value: Any) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for i, item in enumerate(_list(value, "system")):
        kind, block = _block(item, f"system.{i}")
        if kind != "text":
            raise _invalid(f"system.{i}.type: Input should be 'text'")
        texts.append(_text(block, f"system.{i}"))
    # Separate blocks are separate passages to whoever wrote them.
    return "\n\n".join(texts)


def _tool_result(block: Json, path: str, calls: set[str]) -> tuple[Json, list[Json]]:
    """The ``tool`` message for one result, and the images it carried."""
    _keys(block, path, _TOOL_RESULT_KEYS)
    call = _string(block.get("tool_use_id"), f"{path}.tool_use_id", empty=False)
    if call not in calls:
        # As Anthropic refuses it: a chat template would render a result of nothing.
        raise _invalid(
            f"{path}.tool_use_id: no tool_use block with id '{call}' in the previous message"
        )
    content = block.get("content", "")
    images: list[Json] = []
    if isinstance(content, str):
        text = content
    else:
        texts = []
        for i, item in enumerate(_list(content, f"{path}.content")):
            kind, part = _block(item, f"{path}.content.{i}")
            if kind == "text":
                texts.append(_text(part, f"{path}.content.{i}"))
            elif kind == "image":
                images.append(_image(part, f"{path}.content.{i}"))
            else:
                raise _invalid(f"{path}.content.{i}.type: Input should be 'text' or 'image'")
        text = "\n\n".join(texts)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _invalid(f"{path}.is_error: Input should be a valid boolean")
    if is_error:
        # Chat completions has no failed-tool flag; the model must still learn of it.
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call, "content": text}, images


def _user(content: Any, path: str, calls: set[str]) -> list[Json]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[Json] = []
    parts: list[Json] = []
    for i, item in enumerate(_list(content, path, empty=False)):
        where = f"{path}.{i}"
        kind, block = _block(item, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            message, images = _tool_result(block, where, calls)
            tools.append(message)
            parts.extend(images)
        elif kind == "tool_use":
            raise _invalid(f"{where}.type: tool_use blocks belong in assistant messages")
        else:
            raise _invalid(f"{where}.type: '{kind}' blocks are not supported")
    messages = list(tools)
    if parts:
        # A lone text part as a plain string: every chat template takes that.
        single = len(parts) == 1 and parts[0]["type"] == "text"
        messages.append({"role": "user", "content": parts[0]["text"] if single else parts})
    return messages


def _arguments(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {RAW_ARGUMENTS}:
        raw = value[RAW_ARGUMENTS]
        if isinstance(raw, str):
            return raw
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _assistant(content: Any, path: str) -> Json:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[Json] = []
    for i, item in enumerate(_list(content, path, empty=False)):
        where = f"{path}.{i}"
        kind, block = _block(item, where)
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use":
            _keys(block, where, _TOOL_USE_KEYS)
            call = _string(block.get("id"), f"{where}.id", empty=False)
            name = _string(block.get("name"), f"{where}.name", empty=False)
            arguments = _object(block.get("input"), f"{where}.input")
            calls.append(
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": name, "arguments": _arguments(arguments)},
                }
            )
        elif kind in ("image", "tool_result"):
            raise _invalid(f"{where}.type: {kind} blocks belong in user messages")
        else:
            raise _invalid(f"{where}.type: '{kind}' blocks are not supported")
    message: Json = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tools(value: Any) -> list[Json]:
    tools = []
    for i, item in enumerate(_list(value, "tools")):
        path = f"tools.{i}"
        tool = _object(item, path)
        if tool.get("type", "custom") != "custom":
            raise _invalid(f"{path}.type: server tool '{tool.get('type')}' is not supported")
        _keys(
            tool, path, frozenset({"type", "name", "description", "input_schema", "cache_control"})
        )
        name = _string(tool.get("name"), f"{path}.name")
        if not _TOOL_NAME.fullmatch(name):
            raise _invalid(f"{path}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        schema = _object(tool.get("input_schema"), f"{path}.input_schema")
        if schema.get("type") != "object":
            raise _invalid(f"{path}.input_schema.type: Input should be 'object'")
        function: Json = {"name": name, "parameters": schema}
        if "description" in tool:
            function["description"] = _string(tool["description"], f"{path}.description")
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any, names: set[str], chat: Json) -> None:
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    allowed = {"type", "disable_parallel_tool_use"}
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        allowed = {"type"}
        chat["tool_choice"] = "none"
    elif kind == "tool":
        allowed.add("name")
        name = _string(choice.get("name"), "tool_choice.name", empty=False)
        if name not in names:
            raise _invalid(f"tool_choice.name: no tool named '{name}' in tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise _invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    _keys(choice, "tool_choice", frozenset(allowed))
    if kind != "none" and not names:
        raise _invalid("tool_choice: requires tools")
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise _invalid("tool_choice.disable_parallel_tool_use: Input should be a valid boolean")
    if parallel:
        chat["parallel_tool_calls"] = False


def to_chat(body: Json) -> Json:
    """A Messages request as a chat completions request.

    Raises :class:`MessagesError` (400, ``invalid_request_error``) naming the first
    member that is missing, of the wrong type or out of range, or not translatable.
    """
    body = _object(body, "body")
    _keys(body, "body", _MEMBERS)
    model = _string(body.get("model"), "model", empty=False)
    if "max_tokens" not in body:
        raise _invalid("max_tokens: Field required")
    max_tokens = _integer(body["max_tokens"], "max_tokens", 1)
    chat: Json = {"model": model, "max_tokens": max_tokens}
    messages: list[Json] = []
    if body.get("system") is not None:
        system = _system(body["system"])
        if system:
            messages.append({"role": "system", "content": system})
    if "messages" not in body:
        raise _invalid("messages: Field required")
    calls: set[str] = set()  # The tool calls a user message may answer.
    for i, item in enumerate(_list(body["messages"], "messages", empty=False)):
        message = _object(item, f"messages.{i}")
        _keys(message, f"messages.{i}", frozenset({"role", "content"}))
        if "content" not in message:
            raise _invalid(f"messages.{i}.content: Field required")
        role = message.get("role")
        if role == "user":
            messages.extend(_user(message["content"], f"messages.{i}.content", calls))
            calls = set()
        elif role == "assistant":
            messages.append(_assistant(message["content"], f"messages.{i}.content"))
            calls = {call["id"] for call in messages[-1].get("tool_calls", ())}
        else:
            raise _invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
    chat["messages"] = messages

    names: set[str] = set()
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        names = {tool["function"]["name"] for tool in tools}
        if len(names) != len(tools):
            raise _invalid("tools: Tool names must be unique")
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], names, chat)
    if body.get("stop_sequences") is not None:
        stops = _list(body["stop_sequences"], "stop_sequences")
        for i, stop in enumerate(stops):
            _string(stop, f"stop_sequences.{i}", empty=False)
        if stops:
            chat["stop"] = list(stops)
    for name, high in (("temperature", 1.0), ("top_p", 1.0)):
        if body.get(name) is not None:
            chat[name] = _number(body[name], name, 0.0, high)
    if body.get("top_k") is not None:
        chat["top_k"] = _integer(body["top_k"], "top_k", 0)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _invalid("stream: Input should be a valid boolean")
    if stream:
        chat["stream"] = True
        # Chat completions streams report usage only when asked; message_delta needs it.
        chat["stream_options"] = {"include_usage": True}
    if body.get("metadata") is not None:
        metadata = _object(body["metadata"], "metadata")
        _keys(metadata, "metadata", frozenset({"user_id"}))
        if metadata.get("user_id") is not None:
            chat["user"] = _string(metadata["user_id"], "metadata.user_id")
    if body.get("thinking") is not None:
        thinking = _object(body["thinking"], "thinking")
        if thinking.get("type") != "disabled":
            raise _invalid("thinking: extended thinking is not supported by this gateway")
    return chat
