"""A Messages request as a chat completions request (:func:`to_chat`), every member
checked strictly: what cannot be honoured is a 400, never dropped.

The request's shape (types, required members, bounds, no unknown member, the content
blocks as a union tagged by ``type``) is declared below as msgspec Structs and checked
by msgspec; the code checks only what a type cannot say (a tool result answering a
call of the message before, a block in the wrong role's message, a server tool, tool
names, ``thinking``). msgspec's error is reworded as Anthropic's (pydantic's) are,
naming the member by its dotted path."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from llmgw.router.anthropic.wire import RAW_ARGUMENTS, Json, MessagesError

__all__ = ["to_chat"]

# The router's own bound on max_tokens (router/body.py): past it, its arithmetic on the
# token budget stops meaning anything.
_MAX_INTEGER = 1 << 31

_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
_Unit = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    """A member not declared is a 400 rather than silently dropped, so a client relying
    on a feature we cannot honour learns it at once."""


class _Block(_Strict, tag_field="type"):
    """A member of a union told apart by its ``type`` (content blocks, image sources,
    tool choices): another ``type`` is refused naming the value."""


class _Text(_Block, tag="text"):
    text: str
    cache_control: Any = None  # accepted and ignored (module docstring of the package)
    citations: Any = None


class _Base64(_Block, tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: _NonEmpty


class _Url(_Block, tag="url"):
    url: _NonEmpty


class _Image(_Block, tag="image"):
    source: _Base64 | _Url
    cache_control: Any = None


class _ToolUse(_Block, tag="tool_use"):
    id: _NonEmpty
    name: _NonEmpty
    input: dict[str, Any]
    cache_control: Any = None


class _ToolResult(_Block, tag="tool_result"):
    tool_use_id: _NonEmpty
    content: str | list[_Text | _Image] = ""
    is_error: bool = False
    cache_control: Any = None


class _Message(_Strict):
    role: Literal["user", "assistant"]
    # Either role's blocks: which belong where is checked in code, to say so.
    content: (
        str | Annotated[list[_Text | _Image | _ToolUse | _ToolResult], msgspec.Meta(min_length=1)]
    )


class _Auto(_Block, tag="auto"):
    disable_parallel_tool_use: bool = False


class _Any(_Block, tag="any"):
    disable_parallel_tool_use: bool = False


class _Tool(_Block, tag="tool"):
    name: _NonEmpty
    disable_parallel_tool_use: bool = False


class _None(_Block, tag="none"):
    pass


class _CustomTool(_Strict):
    """A tool after its ``type`` was found to be ``custom`` (a server tool's other
    members would be refused before what matters: that it is a server tool)."""

    name: Annotated[str, msgspec.Meta(pattern="^[a-zA-Z0-9_-]{1,128}$")]
    input_schema: dict[str, Any]
    type: Literal["custom"] = "custom"
    description: str | msgspec.UnsetType = msgspec.UNSET
    cache_control: Any = None


class _Metadata(_Strict):
    user_id: str | None = None


class _Request(_Strict):
    model: _NonEmpty
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=_MAX_INTEGER)]
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    system: str | list[_Text] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _Auto | _Any | _Tool | _None | None = None
    stop_sequences: list[_NonEmpty] | None = None
    temperature: _Unit | None = None
    top_p: _Unit | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=_MAX_INTEGER)] | None = None
    stream: bool = False
    metadata: _Metadata | None = None
    thinking: dict[str, Any] | None = None
    # Scheduling hints for Anthropic's own fleet: meaningless here, harmless.
    service_tier: Any = None


def _invalid(message: str) -> MessagesError:
    return MessagesError(400, "invalid_request_error", message)


# -- msgspec's errors in Anthropic's words ---------------------------------------------

# The members with bounds: any error there says the whole range.
_RANGES = {
    "max_tokens": f"an integer from 1 to {_MAX_INTEGER}",
    "top_k": f"an integer from 0 to {_MAX_INTEGER}",
    "temperature": "a number from 0 to 1",
    "top_p": "a number from 0 to 1",
}
# Where a value is one of a few (a Literal, or a union's tag): what it may be.
_CHOICES = (
    (re.compile(r"messages\.\d+\.role"), "Input should be 'user' or 'assistant'"),
    (re.compile(r"messages\.\d+\.content\.\d+\.type"), "'{value}' blocks are not supported"),
    (re.compile(r".*\.content\.\d+\.type"), "Input should be 'text' or 'image'"),
    (re.compile(r".*\.source\.type"), "Input should be 'base64' or 'url'"),
    (
        re.compile(r".*\.source\.media_type"),
        "Input should be one of image/gif, image/jpeg, image/png, image/webp",
    ),
    (re.compile(r"system\.\d+\.type"), "Input should be 'text'"),
    (re.compile(r"tool_choice\.type"), "Input should be 'auto', 'any', 'tool' or 'none'"),
)
_KINDS = {
    "str": "a valid string",
    "array": "a valid list",
    "object": "an object",
    "bool": "a valid boolean",
    "int": "an integer",
    "float": "a number",
}
_AT_LEAST_ONE = {
    "str": "String should have at least 1 character",
    "array": "List should have at least 1 item",
}
_INDEX = re.compile(r"\[(\d+)\]")


def _reworded(error: msgspec.ValidationError, within: str = "") -> str:
    """msgspec's ``<what> - at `$.a[0].b``` as ``a.0.b: <what, as Anthropic says it>``
    (msgspec's own words where no rule below applies: still naming the member)."""
    what, _, where = str(error).partition(" - at `")
    inner = _INDEX.sub(r".\1", where.rstrip("`")).removeprefix("$").removeprefix(".")
    path = ".".join(p for p in (within, inner) if p)
    if match := re.fullmatch(r"Object missing required field `(.+)`", what):
        return f"{path + '.' if path else ''}{match[1]}: Field required"
    if match := re.fullmatch(r"Object contains unknown field `(.+)`", what):
        return f"{path or 'body'}.{match[1]}: Extra inputs are not permitted"
    if path in _RANGES:
        return f"{path}: Input should be {_RANGES[path]}"
    if match := re.fullmatch(r"Invalid (?:enum )?value (.+)", what):
        value = match[1].strip("'")
        for pattern, wording in _CHOICES:
            if pattern.fullmatch(path):
                return f"{path}: {wording.format(value=value)}"
    elif match := re.fullmatch(r"Expected `(str|array)` of length >= 1", what):
        return f"{path}: {_AT_LEAST_ONE[match[1]]}"
    elif match := re.fullmatch(r"Expected `str` matching regex '(.+)'", what):
        return f"{path}: String should match pattern '{match[1]}'"
    elif match := re.fullmatch(r"Expected `(.+)`, got `.+`", what):
        kinds = [_KINDS.get(k, k) for k in match[1].split(" | ") if k != "null"]
        return f"{path or 'body'}: Input should be {' or '.join(kinds)}"
    return f"{path or 'body'}: {what}"


_T = TypeVar("_T")


def _convert(value: Any, kind: type[_T], within: str = "") -> _T:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        raise _invalid(_reworded(error, within)) from None


# -- the translation -------------------------------------------------------------------


def _text(block: _Text, path: str) -> str:
    if block.citations:
        raise _invalid(f"{path}.citations: citations are not supported")
    return block.text


def _image(block: _Image) -> Json:
    source = block.source
    if isinstance(source, _Base64):
        url = f"data:{source.media_type};base64,{source.data}"
    else:
        url = source.url
    return {"type": "image_url", "image_url": {"url": url}}


def _system(value: str | list[_Text]) -> str:
    if isinstance(value, str):
        return value
    # Separate blocks are separate passages to whoever wrote them.
    return "\n\n".join(_text(block, f"system.{i}") for i, block in enumerate(value))


def _tool_result(block: _ToolResult, path: str, calls: set[str]) -> tuple[Json, list[Json]]:
    """The ``tool`` message for one result, and the images it carried."""
    call = block.tool_use_id
    if call not in calls:
        # As Anthropic refuses it: a chat template would render a result of nothing.
        raise _invalid(
            f"{path}.tool_use_id: no tool_use block with id '{call}' in the previous message"
        )
    images: list[Json] = []
    if isinstance(block.content, str):
        text = block.content
    else:
        texts = []
        for i, part in enumerate(block.content):
            if isinstance(part, _Text):
                texts.append(_text(part, f"{path}.content.{i}"))
            else:
                images.append(_image(part))
        text = "\n\n".join(texts)
    if block.is_error:
        # Chat completions has no failed-tool flag; the model must still learn of it.
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call, "content": text}, images


def _user(content: str | list[Any], path: str, calls: set[str]) -> list[Json]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[Json] = []
    parts: list[Json] = []
    for i, block in enumerate(content):
        where = f"{path}.{i}"
        if isinstance(block, _Text):
            parts.append({"type": "text", "text": _text(block, where)})
        elif isinstance(block, _Image):
            parts.append(_image(block))
        elif isinstance(block, _ToolResult):
            message, images = _tool_result(block, where, calls)
            tools.append(message)
            parts.extend(images)
        else:
            raise _invalid(f"{where}.type: tool_use blocks belong in assistant messages")
    messages = list(tools)
    if parts:
        # A lone text part as a plain string: every chat template takes that.
        single = len(parts) == 1 and parts[0]["type"] == "text"
        messages.append({"role": "user", "content": parts[0]["text"] if single else parts})
    return messages


def _arguments(value: dict[str, Any]) -> str:
    if set(value) == {RAW_ARGUMENTS}:
        raw = value[RAW_ARGUMENTS]
        if isinstance(raw, str):
            return raw
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _assistant(content: str | list[Any], path: str) -> Json:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[Json] = []
    for i, block in enumerate(content):
        where = f"{path}.{i}"
        if isinstance(block, _Text):
            texts.append(_text(block, where))
        elif isinstance(block, _ToolUse):
            function = {"name": block.name, "arguments": _arguments(block.input)}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            kind = "image" if isinstance(block, _Image) else "tool_result"
            raise _invalid(f"{where}.type: {kind} blocks belong in user messages")
    message: Json = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tools(value: list[dict[str, Any]]) -> list[Json]:
    tools = []
    for i, item in enumerate(value):
        path = f"tools.{i}"
        kind = item.get("type", "custom")
        if kind != "custom":
            raise _invalid(f"{path}.type: server tool '{kind}' is not supported")
        tool = _convert(item, _CustomTool, path)
        if tool.input_schema.get("type") != "object":
            raise _invalid(f"{path}.input_schema.type: Input should be 'object'")
        function: Json = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not msgspec.UNSET:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(choice: _Auto | _Any | _Tool | _None, names: set[str], chat: Json) -> None:
    if isinstance(choice, _None):
        chat["tool_choice"] = "none"
        return
    if isinstance(choice, _Tool):
        if choice.name not in names:
            raise _invalid(f"tool_choice.name: no tool named '{choice.name}' in tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        chat["tool_choice"] = "auto" if isinstance(choice, _Auto) else "required"
    if not names:
        raise _invalid("tool_choice: requires tools")
    if choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False


def to_chat(body: Json) -> Json:
    """A Messages request as a chat completions request.

    Raises :class:`MessagesError` (400, ``invalid_request_error``) naming the first
    member that is missing, of the wrong type or out of range, or not translatable.
    """
    request = _convert(body, _Request)
    chat: Json = {"model": request.model, "max_tokens": request.max_tokens}
    messages: list[Json] = []
    if request.system is not None:
        system = _system(request.system)
        if system:
            messages.append({"role": "system", "content": system})
    calls: set[str] = set()  # The tool calls a user message may answer.
    for i, message in enumerate(request.messages):
        path = f"messages.{i}.content"
        if message.role == "user":
            messages.extend(_user(message.content, path, calls))
            calls = set()
        else:
            messages.append(_assistant(message.content, path))
            calls = {call["id"] for call in messages[-1].get("tool_calls", ())}
    chat["messages"] = messages

    names: set[str] = set()
    if request.tools is not None:
        tools = _tools(request.tools)
        names = {tool["function"]["name"] for tool in tools}
        if len(names) != len(tools):
            raise _invalid("tools: Tool names must be unique")
        if tools:
            chat["tools"] = tools
    if request.tool_choice is not None:
        _tool_choice(request.tool_choice, names, chat)
    if request.stop_sequences:
        chat["stop"] = list(request.stop_sequences)
    if request.temperature is not None:
        chat["temperature"] = request.temperature
    if request.top_p is not None:
        chat["top_p"] = request.top_p
    if request.top_k is not None:
        chat["top_k"] = request.top_k
    if request.stream:
        chat["stream"] = True
        # Chat completions streams report usage only when asked; message_delta needs it.
        chat["stream_options"] = {"include_usage": True}
    if request.metadata is not None and request.metadata.user_id is not None:
        chat["user"] = request.metadata.user_id
    if request.thinking is not None and request.thinking.get("type") != "disabled":
        raise _invalid("thinking: extended thinking is not supported by this gateway")
    return chat
