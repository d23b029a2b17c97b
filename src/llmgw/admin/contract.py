"""What each admin route accepts and answers, and the one error shape of the API.

Every admin route is a :class:`Route`: its handler plus its contract (query
parameters, request body, responses by status). The app registers its URL rules
from the same table the OpenAPI document is generated from (:mod:`llmgw.admin.openapi`),
so the document cannot describe a route that does not exist, or miss one that does.

A refusal is an :class:`ApiError`, which the app answers in the one error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "band",
               "code": "invalid_value"}}
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from quart import Response

__all__ = [
    "API_PREFIX",
    "MAX_BODY_BYTES",
    "ApiError",
    "Body",
    "ErrorBody",
    "ErrorDetail",
    "Out",
    "Param",
    "Route",
    "error_json",
    "json_bytes",
    "json_reply",
]

#: Where the API's routes are (the rest of the admin listener: metrics, health checks,
#: the dashboard).
API_PREFIX = "/api/v1/"

# Admin request bodies are small (a key, a model); anything larger is refused unread.
MAX_BODY_BYTES = 1 << 20

# The OpenAI-style `type` of an error, by HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


@attrs.frozen
class ErrorDetail:
    """What went wrong: `param` names the request key or parameter at fault, if one is."""

    message: str
    type: str
    param: str | None
    code: str


@attrs.frozen
class ErrorBody:
    """Every error the admin API answers (any 4xx or 5xx)."""

    error: ErrorDetail


def json_bytes(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def error_json(
    status: int, message: str, code: str, *, type_: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI-shaped error body."""
    kind = type_ or ERROR_TYPES.get(status, "invalid_request_error")
    detail = {"message": message, "type": kind, "param": param, "code": code}
    return json_bytes({"error": detail})


def json_reply(status: int, data: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json_bytes(data), status, headers=dict(headers or {}), content_type="application/json"
    )


class ApiError(Exception):
    """A request refused: answered as an error with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        param: str | None = None,
        type_: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_
        self.headers = dict(headers or {})

    def response(self) -> Response:
        body = error_json(self.status, self.message, self.code, type_=self.type, param=self.param)
        return Response(body, self.status, headers=self.headers, content_type="application/json")


#: A route's handler: its path parameters as keyword arguments; the request itself is
#: Quart's (``quart.request``), read through :mod:`llmgw.admin.inputs`.
Handler = Callable[..., Awaitable[Response]]


@attrs.frozen
class Param:
    """A query parameter, as the OpenAPI document describes it."""

    name: str
    schema: Mapping[str, Any]
    description: str
    required: bool = False


@attrs.frozen
class Body:
    """A JSON request body: an attrs class (its fields are the keys) or a JSON Schema."""

    schema: Any
    description: str
    style: str = "view"  # "config": sizes and durations as the configuration writes them


@attrs.frozen
class Out:
    """One response of a route: an attrs class (or JSON Schema) for its JSON body, or None."""

    description: str
    schema: Any = None
    media_type: str = "application/json"
    headers: Mapping[str, str] = attrs.field(factory=dict)  # name -> description
    # Other media types the answer may come as (a query parameter chooses): type -> schema.
    alternatives: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Route:
    """A route and its contract (what the OpenAPI document says about it)."""

    method: str
    path: str  # with {name} segments
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    responses: Mapping[int, Out]
    description: str = ""
    query: tuple[Param, ...] = ()
    body: Body | None = None
    # The last {param} takes the rest of the path, slashes included (model names).
    greedy: bool = False
    # Whether the store is used: it may be unreachable (503).
    uses_store: bool = False

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.strip("/").split("/"))

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(s[1:-1] for s in self.segments if s.startswith("{") and s.endswith("}"))

    @property
    def rule(self) -> str:
        """The path as a URL rule: ``{id}`` one segment, a greedy last one the rest."""
        parts = []
        last = len(self.segments) - 1
        for i, s in enumerate(self.segments):
            if s.startswith("{") and s.endswith("}"):
                s = f"<path:{s[1:-1]}>" if self.greedy and i == last else f"<{s[1:-1]}>"
            parts.append(s)
        return "/" + "/".join(parts)
