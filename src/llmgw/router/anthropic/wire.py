"""The shapes both directions of the translation share: Anthropic's error
bodies and types, its stream events' encoding, and the stop reasons chat completions'
finish reasons become."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "FINISH",
    "RAW_ARGUMENTS",
    "Event",
    "Json",
    "MessagesError",
    "encode",
    "error_body",
    "error_event",
    "error_from_chat",
    "error_message",
    "error_type",
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

FINISH = {
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
        message = error_message(error)
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


def error_message(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) and message else "engine error"
