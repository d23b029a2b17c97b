"""The browser side of HTTP for the dashboard: cookies, forms, CSRF and page headers.

CSRF is a double-submit token: a random ``llmgw_csrf`` cookie (HttpOnly,
SameSite=Strict) whose value every form carries in a hidden ``csrf`` field. A
cross-site page can neither read the cookie nor make the browser send it, so it
cannot forge a matching pair. A state-changing request must also not say it comes
from another site (``Sec-Fetch-Site``, or an ``Origin`` that is not this host).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlsplit

import attrs

from llmgw.admin.http import ApiError, Request

__all__ = [
    "CSRF_COOKIE",
    "MAX_FORM_BYTES",
    "PAGE_HEADERS",
    "SESSION_COOKIE",
    "FormError",
    "Page",
    "cookie_header",
    "cookie_values",
    "new_token",
    "read_form",
    "same_origin",
    "tokens_match",
]

SESSION_COOKIE = "llmgw_session"
CSRF_COOKIE = "llmgw_csrf"
# Dashboard forms are a handful of short fields.
MAX_FORM_BYTES = 64 * 1024

# Every page: no inline script or style (so an injected tag could do nothing), no
# framing, nothing cached (the keys page shows a secret once).
PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)


@attrs.frozen
class Page:
    """A dashboard response: its body, or the template and context to render it from
    (rendered off the trio thread: a large fleet's page takes a noticeable while)."""

    status: int
    body: bytes
    content_type: bytes = b"text/html; charset=utf-8"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    deferred: Callable[[], bytes] | None = None


class FormError(Exception):
    """A form the dashboard cannot read: answered with `status` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def new_token() -> str:
    return secrets.token_urlsafe(32)


def tokens_match(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(str(a), str(b))


def cookie_values(req: Request, name: str) -> list[str]:
    """Every value the request carries for cookie `name` (a browser sends two cookies
    of one name when their paths differ, e.g. ``/`` and ``/admin``)."""
    values: list[str] = []
    for key, raw in req.scope.get("headers", ()):
        if bytes(key).lower() != b"cookie":
            continue
        for part in bytes(raw).decode("latin-1").split(";"):
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(part.strip())
            except CookieError:
                continue  # one malformed cookie must not hide the others
            if name in jar:
                values.append(jar[name].value)
    return values


def cookie_header(
    name: str, value: str, *, path: str, secure: bool, max_age: int | None = None
) -> tuple[bytes, bytes]:
    """A ``set-cookie`` header: HttpOnly and SameSite=Strict always, Secure over TLS.
    ``max_age=0`` removes the cookie."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return b"set-cookie", "; ".join(parts).encode("latin-1")


def same_origin(req: Request) -> bool:
    """False when the browser says the request comes from another site.

    ``Sec-Fetch-Site`` is the browser's own word (a page cannot set it) and wins. Only
    without it (older browsers) is ``Origin`` compared with the host, which a reverse
    proxy may have rewritten: its ``X-Forwarded-Host`` counts too."""
    fetch_site = req.header(b"sec-fetch-site")
    if fetch_site is not None:
        return fetch_site.strip().lower() in ("same-origin", "none")
    origin = req.header(b"origin")
    if origin is None or origin.strip() == "null":
        return origin is None
    netloc = urlsplit(origin.strip()).netloc.lower()
    hosts = (req.header(b"host"), req.header(b"x-forwarded-host"))
    return any(h is not None and netloc == h.split(",")[0].strip().lower() for h in hosts)


async def read_form(req: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as a dict (a repeated field keeps
    its last value; checkboxes send nothing when unticked)."""
    content_type = (req.header(b"content-type") or "").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError(415, "expected a form (application/x-www-form-urlencoded)")
    try:
        raw = await req.body()  # at most req.max_body: the app reads with MAX_FORM_BYTES
    except ApiError as exc:
        raise FormError(exc.status, exc.message) from None
    try:
        pairs: Iterable[tuple[str, str]] = parse_qsl(
            raw.decode("ascii"), keep_blank_values=True, errors="strict"
        )
        return dict(pairs)
    except (UnicodeDecodeError, ValueError):
        raise FormError(400, "the form is not valid URL-encoded UTF-8") from None
