"""The operator surface as one quart-trio application: the admin API's blueprint, the
dashboard's, and the guards in front of both.

:func:`build_app` assembles what a listener serves: the admin listener gets the API
(``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/...``) and the dashboard beside
it; the client port gets the dashboard alone, :func:`mount`\\ ed under ``/admin``.
Before any route runs:

* **Host** (the admin listener; the names are llmgw.admin.hosts's): a page at
  attacker.example that resolves to 127.0.0.1 reaches a keyless loopback listener,
  but its requests still carry its own Host: anything else is 421.
* **Cross-site changes**: a page the operator has open elsewhere can make the browser
  send requests here; a POST, PATCH or DELETE the browser says comes from another
  site is 403 (``Sec-Fetch-Site``, else ``Origin`` against ``Host``), and so is any
  method under ``/api/v1/debug`` (its reads cost the server: stacks, snapshots).
* **Admin auth** (:attr:`~llmgw.admin.api.AdminApp.admin_auth`): ``/api/v1/`` needs an admin key.

Bodies are bounded by Quart itself (``MAX_CONTENT_LENGTH``: 413; ``BODY_TIMEOUT``:
408 for the whole body, so a client sending a byte a second cannot hold a request
open). Every error is the API's error shape on API paths and a dashboard page
elsewhere, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from llmgw.admin.contract import ApiError
from llmgw.http.asgi import App, Receive, Scope, Send
from llmgw.store.base import StoreError

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = [
    "LOOPBACK_HOSTS",
    "TRUSTED",
    "asgi",
    "build_app",
    "host_name",
    "mount",
    "same_origin",
]

log = logging.getLogger("llmgw.admin")

#: Names every admin listener answers to (an SSH tunnel's end, curl on the machine).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})

#: A scope key no client can set: the request was made in-process by the dashboard,
#: which authenticated its user itself (:meth:`llmgw.admin.api.AdminApp.call`).
TRUSTED = "llmgw.trusted"

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: Paths refused cross-site whatever the method (llmgw.admin.debug).
CROSS_SITE_CHECKED = "/api/v1/debug"

# Werkzeug's refusals, as the API's codes.
_HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "body_too_large",
    415: "unsupported_media_type",
}


def host_name(value: str | None) -> str:
    """The host part of a Host header, lower case, without port or IPv6 brackets."""
    host = (value or "").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def same_origin(headers: Mapping[str, str] | Any) -> bool:
    """False when the browser says the request comes from another site.

    ``Sec-Fetch-Site`` is the browser's own word (a page cannot set it) and wins. Only
    without it (older browsers) is ``Origin`` compared with the host, which a reverse
    proxy may have rewritten: its ``X-Forwarded-Host`` counts too."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site.strip().lower() in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None or origin.strip() == "null":
        return origin is None
    netloc = urlsplit(origin.strip()).netloc.lower()
    hosts = (headers.get("host"), headers.get("x-forwarded-host"))
    return any(h is not None and netloc == h.split(",")[0].strip().lower() for h in hosts)


def _always_checked(path: str) -> bool:
    return path == CROSS_SITE_CHECKED or path.startswith(CROSS_SITE_CHECKED + "/")


class Pages(Protocol):
    """What the app asks of the dashboard it serves (llmgw.dashboard.app.DashboardApp,
    which builds on this module)."""

    def install(self, app: QuartTrio) -> None:
        """Register its routes, templates and page headers on `app`."""
        ...

    def error_page(self, error: ApiError) -> Awaitable[Response]:
        """A refusal, as a page."""
        ...


def build_app(
    admin: AdminContext, *, api: bool = True, dashboard: Pages | None = None
) -> QuartTrio:
    """The application one listener serves: the admin API (`api`), the dashboard, or
    both. The API's Host allowlist (``admin.hosts``) guards the whole app with it."""
    app = QuartTrio("llmgw.admin", static_folder=None)
    app.config.update(
        MAX_CONTENT_LENGTH=admin.max_body_bytes,
        # Quart's own default (60 s) when the server sets none.
        BODY_TIMEOUT=60.0 if admin.body_timeout is None else admin.body_timeout,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    # "/api/v1/nodes/" is "/api/v1/nodes", as an operator typing it means.
    app.url_map.strict_slashes = False
    hosts = admin.hosts if api else None

    async def answer(error: ApiError) -> Response:
        if dashboard is not None and not (api and admin.owns(request.path)):
            return await dashboard.error_page(error)
        return error.response()

    @app.before_request
    async def guard() -> None:
        if request.scope.get(TRUSTED):
            return
        if hosts is not None and host_name(request.headers.get("host")) not in hosts:
            raise ApiError(
                421,
                "this listener does not serve that Host (admin_hosts adds names)",
                "misdirected",
            )
        if (
            request.method not in SAFE_METHODS or _always_checked(request.path)
        ) and not same_origin(request.headers):
            raise ApiError(403, "refused: the request comes from another site", "cross_site")
        if api and admin.admin_auth and admin.protected(request.path):
            await admin.authorize()

    @app.errorhandler(ApiError)
    async def refused(error: ApiError) -> Any:
        return await answer(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Any:
        status = error.code or 500
        headers: dict[str, str] = {}
        if isinstance(error, MethodNotAllowed):
            allowed = ", ".join(sorted(error.valid_methods or ()))  # werkzeug's is a set
            headers["allow"] = allowed
            message = f"method {request.method} not allowed on {request.path} (allowed: {allowed})"
        elif status == 404:
            message = f"no route {request.method} {request.path}"
        elif status == 408:
            message = (
                f"the request body did not arrive within {app.config['BODY_TIMEOUT']:g}s"
                " (router.timeouts.client_body)"
            )
        elif status == 413:
            message = f"request body too large: at most {admin.max_body_bytes} bytes"
        else:
            message = error.description or error.name
        code = _HTTP_CODES.get(status, "invalid_request")
        return await answer(ApiError(status, message, code, headers=headers))

    @app.errorhandler(StoreError)
    async def store_failed(error: StoreError) -> Any:
        log.warning("admin %s %s: store error: %s", request.method, request.path, error)
        return await answer(ApiError(503, f"the store failed: {error}", "store_unavailable"))

    @app.errorhandler(Exception)
    async def failed(error: Exception) -> Any:
        log.error("admin %s %s failed", request.method, request.path, exc_info=error)
        return await answer(ApiError(500, "internal error (logged by the server)", "internal"))

    if api:
        app.register_blueprint(admin.blueprint())
    if dashboard is not None:
        dashboard.install(app)
    return app


def asgi(app: QuartTrio) -> App:
    """A Quart app as the ASGI callable llmgw's listeners take (Quart types its scopes
    more narrowly than they do)."""
    return cast(App, app)


def mount(app: QuartTrio, prefix: str) -> App:
    """`app` under `prefix` (its ``root_path``); the bare prefix redirects to ``prefix/``."""
    inner = asgi(app)
    location = (prefix + "/").encode("latin-1")

    async def mounted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == prefix:
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await inner({**scope, "root_path": scope.get("root_path", "") + prefix}, receive, send)

    return mounted
