"""The Anthropic Messages API, translated to and from OpenAI chat completions.

So that llmgw can serve ``POST /v1/messages`` in front of engines that only speak
``/v1/chat/completions``. Pure translation: no I/O, no routing; the caller parses
the client's JSON, sends what :func:`to_chat` returns, and passes the engine's
answer (whole, or its SSE ``data:`` payloads one by one) back through
:func:`from_chat` or :class:`StreamTranslator`.

Translated:

- request: ``model``, ``max_tokens``, ``system`` (a string or text blocks),
  ``messages`` (string or block content: ``text``, ``image`` with a base64 or url
  source, ``tool_use``, ``tool_result`` with string or text/image content and
  ``is_error``), ``tools`` (custom tools only), ``tool_choice`` (auto, any, tool,
  none, and ``disable_parallel_tool_use``), ``stop_sequences``, ``temperature``,
  ``top_p``, ``top_k`` (an extra field vLLM, SGLang and llama.cpp take),
  ``stream`` (with ``stream_options.include_usage``, for the final usage) and
  ``metadata.user_id`` (as ``user``);
- response: text and tool calls as ``text`` and ``tool_use`` blocks, the finish
  reason as ``stop_reason`` (``stop_sequence`` with the matched string when the
  engine reports it: vLLM's ``stop_reason``, SGLang's ``matched_stop``), usage with
  cached prompt tokens as ``cache_read_input_tokens``;
- streams: the engine's chunks as Anthropic's event sequence, errors in
  Anthropic's error shape (whole responses and ``event: error`` mid-stream), an
  engine's own error responses included (:func:`error_from_chat`).

Requests are validated strictly, as Anthropic does: a member or block key not
listed here is a 400 (``invalid_request_error``) naming it, as is a
``tool_result`` that answers no ``tool_use`` of the message before it. An engine
response that cannot be translated is a 502 (``api_error``). Ids: a message is
``msg_`` + the engine's completion id (so the two can be matched in logs); a tool
call keeps the engine's id, which comes back as ``tool_call_id``.

Not translated (limitations):

- ``thinking`` other than ``{"type": "disabled"}`` is refused, and an engine's
  reasoning (``reasoning_content``) is dropped: no ``thinking`` blocks either way;
- server tools (web search, bash, text editor, ...), ``document``,
  ``search_result``, ``thinking`` and ``redacted_thinking`` blocks, ``mcp_servers``,
  ``container`` and ``context_management`` are refused (400);
- ``cache_control`` is accepted and ignored (the engines' prefix caching needs no
  markers), so ``cache_creation_input_tokens`` is never reported;
- an assistant message's text blocks are joined into one string placed before its
  tool calls (chat completions has no interleaving); a final assistant message is
  sent as an ordinary turn, so whether the engine continues it (Anthropic's
  "prefill") depends on the engine's chat template;
- a user message's ``tool_result`` blocks become ``tool`` messages placed before
  the rest of that message (Anthropic requires them first anyway); images inside a
  tool result move to the user message that follows (``tool`` messages carry text
  only), and ``is_error`` becomes an ``Error: `` prefix on the result's text;
- a streamed tool call's arguments are passed on as the engine streams them, so
  arguments that are not JSON reach the client as such (the SDK raises), whereas
  :func:`from_chat` keeps them as ``{"_raw": "<the arguments>"}``;
- ``system`` text blocks are joined with blank lines into one system message;
  ``citations`` in text blocks are refused;
- a stream's ``message_start`` reports ``input_tokens`` 0 unless the engine's first
  chunk carries usage (vLLM's ``continuous_usage_stats``): the count comes with
  ``message_delta``, which the SDK's accumulator takes;
- ``ping`` events are not generated (a caller may send its own).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = [
    "RAW_ARGUMENTS",
    "MessagesError",
    "StreamTranslator",
    "encode",
    "error_body",
    "error_event",
    "error_from_chat",
    "error_type",
    "from_chat",
    "to_chat",
]

Json = dict[str, Any]
Event = tuple[str, Json]

# Anthropic's documented status -> error type (docs "Errors"); statuses not listed
# fall back by class.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

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

_FINISH = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

# A tool_use input that is exactly this one key holds arguments the engine wrote
# but that were not a JSON object (from_chat); sent back as those bytes.
RAW_ARGUMENTS = "_raw"


class MessagesError(Exception):
    """A request or response that cannot be translated, as an Anthropic error."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message

    def body(self) -> Json:
        """The error as Anthropic's JSON error body."""
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(status: int, message: str) -> Json:
    """Anthropic's error body for a response with this status."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_from_chat(status: int, response: Any) -> Json:
    """Anthropic's error body for an engine's error response (its status, its JSON).

    Takes OpenAI's ``{"error": {"message": ...}}``, vLLM's and SGLang's
    ``{"object": "error", "message": ...}`` and llama.cpp's ``{"error": "..."}``.
    """
    if isinstance(response, dict):
        error = response.get("error", response)
        message = _error_message(error)
    else:
        message = f"engine error (HTTP {status})"
    return error_body(status, message)


def error_event(message: str, status: int = 500) -> Event:
    """The ``error`` event that ends a stream which failed after it started."""
    return "error", error_body(status, message)


def encode(event: str, data: Json) -> bytes:
    """One server-sent event as Anthropic writes it."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event}\ndata: {payload}\n\n".encode()


# --------------------------------------------------------------------------- request


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


# -------------------------------------------------------------------------- response


def _bad_engine(message: str) -> MessagesError:
    # The engine answered, but not in a shape we can translate: our fault, not the client's.
    return MessagesError(502, "api_error", f"engine response: {message}")


def _message_id(chat_id: Any) -> str:
    # The engine's id inside ours, so that a client's message id finds the engine's logs.
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def _tool_id(value: Any) -> str:
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


def _stop(
    finish: Any, choice: Json, has_tools: bool, stop_sequences: Sequence[str] | None
) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` for an engine's finish."""
    if isinstance(finish, str) and finish in _FINISH:
        return _FINISH[finish], None
    if has_tools:
        return "tool_use", None  # Some engines finish a tool call with "stop".
    for matched in (choice.get("stop_reason"), choice.get("matched_stop")):
        # vLLM and SGLang name the stop string they matched (an int is an EOS token).
        if isinstance(matched, str) and (stop_sequences is None or matched in stop_sequences):
            return "stop_sequence", matched
    return "end_turn", None


def _usage(usage: Any) -> Json:
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
        raise _bad_engine("no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _bad_engine("choices.0.message is not an object")
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
            raise _bad_engine("a tool call without a function")
        name = function.get("name")
        content.append(
            {
                "type": "tool_use",
                "id": _tool_id(call.get("id")),
                "name": name if isinstance(name, str) else "",
                "input": _input(function.get("arguments")),
            }
        )
    has_tools = any(block["type"] == "tool_use" for block in content)
    reason, sequence = _stop(choice.get("finish_reason"), choice, has_tools, stop_sequences)
    return {
        "id": _message_id(response.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(response.get("usage")),
    }


# ------------------------------------------------------------------------- streaming


class _Tool:
    __slots__ = ("arguments", "id", "index", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = ""  # Received before the block could start (no name yet).
        self.index: int | None = None  # The Anthropic block, once started.


class StreamTranslator:
    """A chat completions stream as Anthropic's stream events.

    :meth:`feed` takes each SSE ``data:`` payload of the engine's stream, decoded
    (a dict), and finally the string ``"[DONE]"``; it returns the events to send,
    as ``(event name, data)`` pairs for :func:`encode`, in Anthropic's order:
    ``message_start``; for each block (text, and each tool call) its
    ``content_block_start``, deltas and ``content_block_stop``; ``message_delta``
    (stop reason, usage) and ``message_stop`` at ``[DONE]``, once the usage chunk
    that follows the finish has been seen. An engine's ``{"error": ...}`` payload
    becomes an ``error`` event, and ends the stream.

    A stream that ends without ``[DONE]`` is cut: send :func:`error_event`.
    Raises :class:`MessagesError` (502, ``api_error``) for a chunk it cannot
    place (a tool call continued after the next block began, or never named);
    send its
    :meth:`MessagesError.body` as an ``error`` event.
    """

    def __init__(self, model: str, *, stop_sequences: Sequence[str] | None = None) -> None:
        self.model = model
        self.stop_sequences = stop_sequences
        self.done = False
        # Whether message_start went out: until it has, a failure can still be a
        # plain HTTP error response rather than an error event.
        self.started = False
        self._blocks = 0  # Blocks started so far: the next block's index.
        self._open: int | None = None  # The block started and not yet stopped.
        self._text_open = False
        self._tools: dict[int, _Tool] = {}
        self._finish: Any = None
        self._choice: Json = {}
        self._usage: Any = None

    def feed(self, payload: Json | str) -> list[Event]:
        """The events for one ``data:`` payload of the engine's stream."""
        if self.done:
            return []
        events: list[Event] = []
        if payload == "[DONE]":
            if any(tool.index is None for tool in self._tools.values()):
                # Its arguments are held back, and a tool_use block needs a name.
                raise _bad_engine("a tool call without a name")
            self._start(events, {})
            self._close(events)
            reason, sequence = _stop(
                self._finish,
                self._choice,
                any(tool.index is not None for tool in self._tools.values()),
                self.stop_sequences,
            )
            usage = _usage(self._usage)
            delta_usage: Json = {"output_tokens": usage.pop("output_tokens")}
            if self._usage is not None:
                # Cumulative counts: the SDK overwrites message_start's with these.
                delta_usage.update(usage)
            events.append(
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": delta_usage,
                    },
                )
            )
            events.append(("message_stop", {"type": "message_stop"}))
            self.done = True
            return events
        if not isinstance(payload, dict):
            raise _bad_engine("a stream chunk is not an object")
        if "error" in payload:
            self.done = True
            return [error_event(_error_message(payload["error"]))]
        if payload.get("usage") is not None:
            self._usage = payload["usage"]
        self._start(events, payload)
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(events, delta)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._choice = choice
        return events

    def _start(self, events: list[Event], chunk: Json) -> None:
        if self.started:
            return
        self.started = True
        usage = _usage(chunk.get("usage"))  # Known this early only with vLLM's
        usage["output_tokens"] = 0  # continuous_usage_stats; else zeros.
        message: Json = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        events.append(("message_start", {"type": "message_start", "message": message}))

    def _begin(self, events: list[Event], block: Json) -> int:
        self._close(events)
        index = self._blocks
        self._blocks += 1
        self._open = index
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        return index

    def _close(self, events: list[Event]) -> None:
        if self._open is not None:
            events.append(
                ("content_block_stop", {"type": "content_block_stop", "index": self._open})
            )
        self._open = None
        self._text_open = False

    def _delta(self, events: list[Event], delta: Json) -> None:
        text = delta.get("content")
        if isinstance(text, str) and text:
            if not self._text_open:
                self._begin(events, {"type": "text", "text": ""})
                self._text_open = True
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._open,
                        "delta": {"type": "text_delta", "text": text},
                    },
                )
            )
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                self._tool_delta(events, call)

    def _tool_delta(self, events: list[Event], call: Json) -> None:
        position = call.get("index", 0)
        if isinstance(position, bool) or not isinstance(position, int):
            raise _bad_engine("a tool call's index is not an integer")
        tool = self._tools.get(position)
        if tool is None:
            tool = self._tools[position] = _Tool()
        elif tool.index is not None and tool.index != self._open:
            raise _bad_engine(f"tool call {position} continued after the next block began")
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if tool.id is None and isinstance(call.get("id"), str):
            tool.id = call["id"]
        if tool.name is None and isinstance(function.get("name"), str) and function["name"]:
            tool.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            tool.arguments += arguments
        if tool.index is None and tool.name is not None:
            # The block can start only with its name; until then arguments wait.
            block = {"type": "tool_use", "id": _tool_id(tool.id), "name": tool.name, "input": {}}
            tool.index = self._begin(events, block)
        if tool.index is not None and tool.arguments:
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": tool.index,
                        "delta": {"type": "input_json_delta", "partial_json": tool.arguments},
                    },
                )
            )
            tool.arguments = ""


def _error_message(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) and message else "engine error"
