"""The admin API's request and reply plumbing: routes, parsed requests, JSON replies, errors.

Every admin route is a :class:`Route`: the handler plus what it accepts and returns
(query parameters, request body, responses by status). The app dispatches on the
same table the OpenAPI document is generated from (:mod:`llmgw.admin.openapi`), so
the document cannot describe a route that does not exist, or miss one that does.

Handlers take a :class:`Request` and return a :class:`Reply`; a refusal is an
:class:`ApiError`, which the app turns into the one error shape of the API::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "band",
               "code": "invalid_value"}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any
from urllib.parse import parse_qsl

import attrs
import trio

from llmgw.http.asgi import BodyTooLarge, ClientLeft, Receive, Scope, read_body

__all__ = [
    "MAX_BODY_BYTES",
    "ApiError",
    "Body",
    "ErrorBody",
    "ErrorDetail",
    "Out",
    "Param",
    "Reply",
    "Request",
    "Route",
    "error_json",
    "json_bytes",
    "json_reply",
]

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
    421: "invalid_request_error",
    413: "invalid_request_error",
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


class ApiError(Exception):
    """A request refused: becomes an error reply with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        param: str | None = None,
        type_: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_
        self.headers = headers

    def reply(self) -> Reply:
        body = error_json(self.status, self.message, self.code, type_=self.type, param=self.param)
        return Reply(self.status, body, headers=self.headers)


@attrs.frozen
class Reply:
    """A finished response: status, serialized body (None: no body) and extra headers."""

    status: int
    body: bytes | None
    content_type: bytes = b"application/json"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    # What `body` encodes, when a JSON reply was built from data: an in-process caller
    # (AdminApp.call) takes it instead of decoding the bytes again. Not to be mutated.
    data: Any = attrs.field(default=None, eq=False, repr=False)

    def start_headers(self) -> list[tuple[bytes, bytes]]:
        headers = list(self.headers)
        if self.body is not None:
            headers[:0] = [
                (b"content-type", self.content_type),
                (b"content-length", str(len(self.body)).encode()),
            ]
        elif self.status != 204:  # a 204 carries no Content-Length (RFC 9110 8.6)
            headers.insert(0, (b"content-length", b"0"))
        return headers


def json_reply(status: int, data: Any, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    return Reply(status, json_bytes(data), headers=headers, data=data)


def _no_constants(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON.
    raise ValueError(f"{name} is not valid JSON")


class Request:
    """One admin request: path parameters, the query string and a bounded body."""

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        *,
        max_body: int = MAX_BODY_BYTES,
        body_timeout: float | None = None,
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.path_params: dict[str, str] = {}
        self._query: dict[str, str] | None = None

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    def header(self, name: bytes) -> str | None:
        """The first value of request header `name` (lower case), as latin-1 text."""
        for key, value in self.scope.get("headers", ()):
            if bytes(key).lower() == name:
                return bytes(value).decode("latin-1")
        return None

    @property
    def query(self) -> Mapping[str, str]:
        """The query parameters; 400 when one is given twice or cannot be decoded."""
        if self._query is None:
            raw = bytes(self.scope.get("query_string", b""))
            try:
                pairs = parse_qsl(
                    raw.decode("ascii"), keep_blank_values=True, errors="strict", encoding="utf-8"
                )
            except (UnicodeDecodeError, ValueError):
                raise ApiError(
                    400, "the query string is not valid UTF-8", "invalid_query"
                ) from None
            query: dict[str, str] = {}
            for name, value in pairs:
                if name in query:
                    raise ApiError(
                        400, f"query parameter {name!r} is given twice", "invalid_query", param=name
                    )
                query[name] = value
            self._query = query
        return self._query

    def check_query(self, known: Collection[str]) -> None:
        """400 naming the first query parameter the route does not take."""
        for name in self.query:
            if name not in known:
                takes = f"; it takes {', '.join(sorted(known))}" if known else ""
                raise ApiError(
                    400,
                    f"unknown query parameter {name!r}{takes}",
                    "unknown_parameter",
                    param=name,
                )

    async def body(self) -> bytes:
        """The whole body; 413 past `max_body` (refused unread when Content-Length says so)."""
        # The listener bounds each wait for a chunk; this bounds the whole body, so a
        # client sending 1 byte/s cannot hold a request (and a login) open for ever.
        deadline = math.inf if self.body_timeout is None else self.body_timeout
        try:
            with trio.move_on_after(deadline):
                return await read_body(self.scope, self.receive, self.max_body)
            raise ApiError(
                408,
                f"the request body did not arrive within {self.body_timeout:g}s"
                " (router.timeouts.client_body)",
                "body_timeout",
            )
        except ClientLeft:
            raise ApiError(
                400, "the client went away before sending its body", "disconnected"
            ) from None
        except BodyTooLarge:
            raise self._too_large() from None

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"request body too large: the admin API takes at most {self.max_body} bytes",
            "body_too_large",
        )

    async def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; 400 when it is empty, malformed or not an object."""
        raw = await self.body()
        if not raw.strip():
            raise ApiError(400, "the request body must be a JSON object", "invalid_json")
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}", "invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(
                400,
                f"the request body must be a JSON object, got {type(data).__name__}",
                "invalid_json",
            )
        return data


Handler = Callable[[Request], Awaitable[Reply]]


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
        return _segments(self.path)

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(s[1:-1] for s in self.segments if s.startswith("{") and s.endswith("}"))

    def match(self, path: str) -> dict[str, str] | None:
        """The ``{name}`` values if `path` fits this route's template."""
        template, got = self.segments, _segments(path)
        if self.greedy and len(got) > len(template):
            got = (*got[: len(template) - 1], "/".join(got[len(template) - 1 :]))
        if len(template) != len(got):
            return None
        params: dict[str, str] = {}
        for want, have in zip(template, got, strict=True):
            if want.startswith("{") and want.endswith("}"):
                if not have:
                    return None
                params[want[1:-1]] = have
            elif want != have:
                return None
        return params


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/"))
