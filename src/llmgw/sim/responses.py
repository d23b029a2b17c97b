"""The Responses API's shapes, as llmgw-sim answers them (vLLM's subset: text in, text
out), and the per-process store that makes ``previous_response_id`` work only on the
replica that made the response, as vLLM's does.

Pure: the server (:mod:`llmgw.sim.server`) generates the text; this module turns a
request body into chat messages, and the result into a response object or its
stream of typed events.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

__all__ = ["EventWriter", "ResponseStore", "input_messages", "response_object", "usage_of"]

#: Responses a simulator keeps (oldest forgotten first).
MAX_STORED = 1024


class ResponseStore:
    """Stored responses of one process: the object and the conversation it ends."""

    def __init__(self, limit: int = MAX_STORED) -> None:
        self.limit = limit
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = (response, conversation)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None


def input_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses request's ``instructions`` and ``input`` (a
    string, or a list of messages with string or ``input_text`` content); ValueError
    naming what is wrong."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ValueError("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise ValueError("'input' must be a string or a non-empty list of messages")
    for item in given:
        if not isinstance(item, dict) or item.get("role") not in ("user", "assistant", "system"):
            raise ValueError("each 'input' item must be a message with a role")
        content = item.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in parts):
                raise ValueError("'input' content parts must have text")
            content = "".join(parts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            raise ValueError("'input' message content must be a string or text parts")
        messages.append({"role": item["role"], "content": content})
    return messages


def response_object(
    rid: str,
    model: str,
    text: str | None,
    usage: Mapping[str, int] | None,
    *,
    previous: str | None,
    status: str = "completed",
) -> dict[str, Any]:
    """A Response: one assistant message of `text` (none while in progress)."""
    output = []
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": f"msg_{rid.removeprefix('resp_')}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "previous_response_id": previous,
        "usage": dict(usage) if usage is not None else None,
    }


def usage_of(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class EventWriter:
    """The SSE events of a streamed response, numbered as they are made."""

    def __init__(self, rid: str, model: str, previous: str | None) -> None:
        self.rid = rid
        self.model = model
        self.previous = previous
        self.sequence = 0
        self.item = f"msg_{rid.removeprefix('resp_')}"

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, **data, "sequence_number": self.sequence}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    def start(self) -> bytes:
        progress = response_object(
            self.rid, self.model, None, None, previous=self.previous, status="in_progress"
        )
        item = {"type": "message", "id": self.item, "role": "assistant", "status": "in_progress"}
        return b"".join(
            (
                self._event("response.created", response=progress),
                self._event("response.in_progress", response=progress),
                self._event(
                    "response.output_item.added", output_index=0, item={**item, "content": []}
                ),
                self._event(
                    "response.content_part.added",
                    item_id=self.item,
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                ),
            )
        )

    def delta(self, text: str) -> bytes:
        return self._event(
            "response.output_text.delta",
            item_id=self.item,
            output_index=0,
            content_index=0,
            delta=text,
        )

    def end(self, response: dict[str, Any]) -> bytes:
        message = response["output"][0]
        part = message["content"][0]
        return b"".join(
            (
                self._event(
                    "response.output_text.done",
                    item_id=self.item,
                    output_index=0,
                    content_index=0,
                    text=part["text"],
                ),
                self._event(
                    "response.content_part.done",
                    item_id=self.item,
                    output_index=0,
                    content_index=0,
                    part=part,
                ),
                self._event("response.output_item.done", output_index=0, item=message),
                self._event("response.completed", response=response),
            )
        )
