"""A chat completions stream as Messages stream events (:class:`StreamTranslator`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw.router.anthropic.response import bad_engine, message_id, stop_reason, tool_id, usage_of
from llmgw.router.anthropic.wire import Event, Json, error_event, error_message

__all__ = ["StreamTranslator"]


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
                raise bad_engine("a tool call without a name")
            self._start(events, {})
            self._close(events)
            reason, sequence = stop_reason(
                self._finish,
                self._choice,
                any(tool.index is not None for tool in self._tools.values()),
                self.stop_sequences,
            )
            usage = usage_of(self._usage)
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
            raise bad_engine("a stream chunk is not an object")
        if "error" in payload:
            self.done = True
            return [error_event(error_message(payload["error"]))]
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
        usage = usage_of(chunk.get("usage"))  # Known this early only with vLLM's
        usage["output_tokens"] = 0  # continuous_usage_stats; else zeros.
        message: Json = {
            "id": message_id(chunk.get("id")),
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
            raise bad_engine("a tool call's index is not an integer")
        tool = self._tools.get(position)
        if tool is None:
            tool = self._tools[position] = _Tool()
        elif tool.index is not None and tool.index != self._open:
            raise bad_engine(f"tool call {position} continued after the next block began")
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
            block = {"type": "tool_use", "id": tool_id(tool.id), "name": tool.name, "input": {}}
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
