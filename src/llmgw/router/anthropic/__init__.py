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

from llmgw.router.anthropic.request import to_chat
from llmgw.router.anthropic.response import from_chat
from llmgw.router.anthropic.stream import StreamTranslator
from llmgw.router.anthropic.wire import (
    RAW_ARGUMENTS,
    MessagesError,
    encode,
    error_body,
    error_event,
    error_from_chat,
    error_type,
)

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
