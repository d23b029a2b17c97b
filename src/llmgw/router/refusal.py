"""A request llmgw refuses itself, in OpenAI's error shape."""

from __future__ import annotations

from llmgw.router.auth import AuthError
from llmgw.router.proxy import BufferFull

__all__ = ["HttpError", "auth_error", "buffer_full_error"]


class HttpError(Exception):
    """A request refused with an OpenAI-shaped error."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or []


def auth_error(exc: AuthError) -> HttpError:
    """The authenticator's refusal as the client's error (its status, type and retry)."""
    retry = [(b"retry-after", str(int(exc.retry_after)).encode())] if exc.retry_after else []
    kind = {401: "authentication_error", 403: "permission_error", 503: "server_error"}.get(
        exc.status, "rate_limit_exceeded"
    )
    return HttpError(exc.status, str(exc), type_=kind, code=exc.code, headers=retry)


def buffer_full_error(exc: BufferFull) -> HttpError:
    """The buffered-answer budget spent: memory, not the replica (another's answer would
    not fit either), so the client is told to come back, and nothing is retried."""
    return HttpError(
        503,
        str(exc),
        type_="server_error",
        code="response_buffer_full",
        headers=[(b"retry-after", b"1")],
    )
