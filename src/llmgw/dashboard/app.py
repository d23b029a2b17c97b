"""The web dashboard: server-rendered pages over the admin API, with a little JavaScript.

Every page reads, and every action changes, through :meth:`AdminApp.call`, the
admin API made in-process: the dashboard shows exactly what the API answers and
refuses what it refuses, with the same messages. Pages are plain HTML (read-only
views work without JavaScript); ``static/dashboard.js`` refreshes the live parts
of a page every few seconds in place, leaving scroll position and form input alone.

The same app serves two places (DESIGN §8): the admin listener at ``/`` (a login
only when the listener is off loopback) and the client port at ``/admin`` (always
behind a login with an admin key). A login is a session in the store: the cookie
holds its token, HttpOnly and SameSite=Strict (Secure over TLS). Forms carry a CSRF
token (:mod:`llmgw.dashboard.web`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import attrs
import jinja2
import trio

from llmgw.admin.http import Request
from llmgw.dashboard import charts, panels
from llmgw.dashboard.traffic import TrafficRing
from llmgw.dashboard.web import (
    CSRF_COOKIE,
    MAX_FORM_BYTES,
    PAGE_HEADERS,
    SESSION_COOKIE,
    FormError,
    Page,
    cookie_header,
    cookie_values,
    new_token,
    read_form,
    same_origin,
    tokens_match,
)
from llmgw.http.asgi import Receive, Scope, Send, answer_non_http
from llmgw.store.base import Session, StoreError

if TYPE_CHECKING:
    from llmgw.admin.api import AdminApp

__all__ = ["DashboardApp"]

log = logging.getLogger("llmgw.dashboard")

#: Failed logins a client address may make per LOGIN_WINDOW seconds, then 429.
LOGIN_FAILURES = 5
LOGIN_WINDOW = 60.0
#: Client addresses whose failures are remembered before the quiet ones are forgotten.
MAX_LOGIN_CLIENTS = 4096

#: How often the pages refresh their live parts (seconds).
REFRESH_SECONDS = 5.0

NAV = (
    ("overview", "/", "Overview"),
    ("fleet", "/fleet", "Fleet"),
    ("models", "/models", "Models"),
    ("traffic", "/traffic", "Traffic"),
    ("endpoints", "/endpoints", "Endpoints"),
    ("usage", "/usage", "Usage"),
    ("keys", "/keys", "Keys"),
)

STATIC = {
    "dashboard.css": b"text/css; charset=utf-8",
    "dashboard.js": b"text/javascript; charset=utf-8",
}

#: Usage periods the usage page offers (label -> seconds).
PERIODS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}

# What a finished action says on the page it leads back to (`?done=`); fixed texts,
# so a link cannot put words in the dashboard's mouth.
NOTICES = {
    "drain": "Node {id} is draining: its replicas move elsewhere, make before break.",
    "scale": "Model {id}: desired replicas set to {n}.",
    "revoke": "Key {id} is revoked.",
    "logout": "Logged out.",
}

# Problems first: an operator opens the fleet page when something is wrong.
NODE_ORDER = {"lost": 0, "unreachable": 1, "ready": 2}
#: Nodes per fleet page: a thousand-node fleet is twenty pages, not one 10 MB page.
NODES_PER_PAGE = 50


@attrs.frozen
class View:
    """What one request renders with: the page's own data plus the common frame."""

    req: Request
    csrf: str
    session: Session | None
    form: Mapping[str, str] = attrs.field(factory=dict)  # a POST's fields


Handler = Callable[["DashboardApp", View], Awaitable[Page]]


class DashboardApp:
    """The dashboard as an ASGI app mounted at `prefix` ("" or e.g. "/admin")."""

    def __init__(
        self,
        admin: AdminApp,
        *,
        prefix: str = "",
        login_required: bool = False,
        traffic: TrafficRing | None = None,
        session_ttl: float = 8 * 3600.0,
    ) -> None:
        if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
            raise ValueError(f"prefix must be '' or start, not end, with '/': {prefix!r}")
        self.admin = admin
        self.prefix = prefix
        self.login_required = login_required
        self.traffic = traffic
        self.session_ttl = session_ttl
        self._failures: dict[str, list[float]] = {}  # client address -> failed logins
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("llmgw.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            ago=panels.fmt_ago,
            num=panels.fmt_num,
            pct=lambda v: charts.fmt(v, "%"),
            secs=lambda v: charts.fmt(v, "s"),
            when=panels.fmt_when,
        )
        self.env.globals.update(bar=charts.bar, nav=NAV, prefix=prefix, url=self.url)
        self.pages: dict[str, Handler] = {
            "/": DashboardApp.overview,
            "/fleet": DashboardApp.fleet,
            "/models": DashboardApp.models,
            "/traffic": DashboardApp.traffic_page,
            "/endpoints": DashboardApp.endpoints,
            "/usage": DashboardApp.usage,
            "/keys": DashboardApp.keys,
        }
        self.actions: dict[str, Handler] = {
            "/nodes/drain": DashboardApp.drain,
            "/models/replicas": DashboardApp.scale,
            "/keys/create": DashboardApp.create_key,
            "/keys/revoke": DashboardApp.revoke_key,
            "/logout": DashboardApp.logout,
        }

    def url(self, path: str, **query: Any) -> str:
        """A dashboard URL under this app's prefix."""
        base = (self.prefix + path) if path != "/" or not self.prefix else self.prefix + "/"
        shown = {k: v for k, v in query.items() if v is not None}
        return f"{base}?{urlencode(shown)}" if shown else base

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await answer_non_http(scope, receive, send)
            return
        req = Request(scope, receive, max_body=MAX_FORM_BYTES, body_timeout=self.admin.body_timeout)
        page = await self.handle(req)
        headers = [
            (b"content-type", page.content_type),
            (b"content-length", str(len(page.body)).encode()),
            *PAGE_HEADERS,
            *page.headers,
        ]
        await send({"type": "http.response.start", "status": page.status, "headers": headers})
        await send({"type": "http.response.body", "body": page.body})

    async def handle(self, req: Request) -> Page:
        path = req.path[len(self.prefix) :] if req.path.startswith(self.prefix) else req.path
        path = path or "/"
        if self.prefix and path == "/" and not req.path.endswith("/"):
            return redirect(self.url("/"))
        if path.startswith("/static/") and req.method in ("GET", "HEAD"):
            return static(path.removeprefix("/static/"))
        csrf_values = cookie_values(req, CSRF_COOKIE)
        csrf = csrf_values[0] if csrf_values else new_token()
        cookies: tuple[tuple[bytes, bytes], ...] = ()
        if not csrf_values:
            cookies = (self._cookie(req, CSRF_COOKIE, csrf),)
        try:
            page = await self._route(req, path, csrf)
        except FormError as exc:
            page = self.message_page(exc.status, "Cannot do that", str(exc))
        except StoreError as exc:
            log.warning("dashboard %s %s: store error: %s", req.method, req.path, exc)
            page = self.message_page(503, "The store failed", str(exc))
        except Exception:
            log.exception("dashboard %s %s failed", req.method, req.path)
            page = self.message_page(500, "Internal error", "logged by the server")
        if page.deferred is not None:
            # Off the trio thread, so a big page does not hold up the proxied requests.
            try:
                body = await trio.to_thread.run_sync(page.deferred)
            except Exception:
                log.exception("dashboard %s %s: rendering failed", req.method, req.path)
                failed = self.message_page(500, "Internal error", "logged by the server")
                assert failed.deferred is not None
                page, body = failed, failed.deferred()
            page = attrs.evolve(page, body=body, deferred=None)
        return attrs.evolve(page, headers=page.headers + cookies)

    async def _route(self, req: Request, path: str, csrf: str) -> Page:
        if path == "/login":
            if req.method == "POST":
                return await self.login(req, csrf)
            return self.login_form(req, csrf)
        session = await self.session(req) if self.login_required else None
        if self.login_required and session is None:
            if req.method in ("GET", "HEAD"):
                return redirect(self.url("/login", next=path if path != "/" else None))
            return self.message_page(401, "Log in first", "this action needs a login")
        view = View(req, csrf, session)
        if req.method in ("GET", "HEAD"):
            page_handler = self.pages.get(path)
            if page_handler is None:
                return self.message_page(404, "Not found", f"no dashboard page {path}")
            return await page_handler(self, view)
        if req.method == "POST":
            action = self.actions.get(path)
            if action is None:
                return self.message_page(404, "Not found", f"no dashboard action {path}")
            form = await read_form(req)
            self._check_csrf(req, form, csrf)
            return await action(self, attrs.evolve(view, form=form))
        return Page(405, b"method not allowed", b"text/plain", ((b"allow", b"GET, POST"),))

    def _check_csrf(self, req: Request, form: Mapping[str, str], csrf: str) -> None:
        if not same_origin(req):
            raise FormError(403, "refused: the request comes from another site")
        if not cookie_values(req, CSRF_COOKIE) or not tokens_match(form.get("csrf"), csrf):
            raise FormError(
                403, "refused: missing or wrong CSRF token (reload the page and try again)"
            )

    def _cookie(self, req: Request, name: str, value: str, max_age: int | None = None) -> Any:
        # Secure over TLS, ours or a proxy's in front (trusting the proxy's header is
        # harmless here: Secure only keeps the cookie off plain HTTP).
        forwarded = (req.header(b"x-forwarded-proto") or "").split(",")[0].strip().lower()
        return cookie_header(
            name,
            value,
            path=self.prefix or "/",
            secure=req.scope.get("scheme") == "https" or forwarded == "https",
            max_age=max_age,
        )

    # -- login -----------------------------------------------------------------------

    async def session(self, req: Request) -> Session | None:
        store = self.admin.store
        if store is None:
            return None
        for token in cookie_values(req, SESSION_COOKIE):
            session = await store.get_session(token)
            if session is not None and session.key.admin:
                return session
        return None

    def login_form(
        self,
        req: Request,
        csrf: str,
        *,
        error: str | None = None,
        status: int = 200,
        next_after: str | None = None,
    ) -> Page:
        if not self.login_required:
            return redirect(self.url("/"))
        problem = None
        if self.admin.store is None:
            problem = (
                "The dashboard here needs a store for its admin keys and sessions "
                "(store.url); without one use it on the admin listener."
            )
        nxt = req.query.get("next") if req.method == "GET" else next_after
        return self.render(
            "login.html",
            status=status,
            csrf=csrf,
            session=None,
            active="login",
            error=error or problem,
            next=_local(nxt),
        )

    async def login(self, req: Request, csrf: str) -> Page:
        form = await read_form(req)
        self._check_csrf(req, form, csrf)
        store = self.admin.store
        if not self.login_required or store is None:
            return self.login_form(req, csrf)
        # The login is on the public client port and needs no key: failures per client
        # address are limited, so secrets cannot be guessed at the listener's pace.
        client = str((req.scope.get("client") or ("?",))[0])
        now = trio.current_time()
        if len(self._failures) > MAX_LOGIN_CLIENTS:  # bounded: forget the quiet ones
            self._failures = {
                c: ts for c, ts in self._failures.items() if ts and now - ts[-1] < LOGIN_WINDOW
            }
        failures = [t for t in self._failures.get(client, ()) if now - t < LOGIN_WINDOW]
        self._failures[client] = failures
        if len(failures) >= LOGIN_FAILURES:
            wait = max(1, int(LOGIN_WINDOW - (now - failures[0])) + 1)
            page = self.message_page(429, "Too many failed logins", f"try again in {wait}s")
            return attrs.evolve(page, headers=((b"retry-after", str(wait).encode()),))
        secret = form.get("key", "").strip()
        record = await store.lookup_key(secret) if secret else None
        if record is None:
            failures.append(now)
            return self.login_form(
                req,
                csrf,
                error="unknown, revoked or expired API key",
                status=401,
                next_after=form.get("next"),
            )
        if not record.admin:
            return self.login_form(
                req,
                csrf,
                error=f"key {record.name} is not an admin key",
                status=403,
                next_after=form.get("next"),
            )
        token = await store.create_session(record.id, self.session_ttl)
        log.info("dashboard login with key %s (%s)", record.id, record.name)
        cookie = self._cookie(req, SESSION_COOKIE, token, max_age=int(self.session_ttl))
        return redirect(self.url(_local(form.get("next")) or "/"), cookie)

    async def logout(self, view: View) -> Page:
        store = self.admin.store
        if store is not None:
            for token in cookie_values(view.req, SESSION_COOKIE):
                await store.delete_session(token)
        cookie = self._cookie(view.req, SESSION_COOKIE, "", max_age=0)
        target = "/login" if self.login_required else "/"
        return redirect(self.url(target, done="logout"), cookie)

    # -- rendering -----------------------------------------------------------------------

    def render(self, template: str, *, status: int = 200, **context: Any) -> Page:
        req: Request | None = context.pop("req", None)
        done = req.query.get("done") if req is not None and req.method == "GET" else None
        notice = None
        if done in NOTICES and req is not None:
            notice = NOTICES[done].format(id=req.query.get("id", "?"), n=req.query.get("n", "?"))
        context.setdefault("notice", notice)
        # The URL the page refreshes from: itself, or its page after a form's POST.
        if req is not None and req.method == "GET":
            query = bytes(req.scope.get("query_string", b"")).decode("latin-1")
            self_url = req.path + (f"?{query}" if query else "")
        else:
            paths = {key: path for key, path, _ in NAV}
            self_url = self.url(paths.get(context.get("active", ""), "/"))
        context.setdefault("self_url", self_url)
        context.setdefault("error", None)
        context.setdefault("refresh", REFRESH_SECONDS)
        context.setdefault("rendered", panels.fmt_when(time.time()))
        context.setdefault("control", self.admin.controller is not None)
        context.setdefault("logout", self.login_required)
        compiled = self.env.get_template(template)
        # Rendered in a worker thread by `handle`: the context is plain data (decoded
        # API answers), nothing the trio thread owns.
        return Page(status, b"", deferred=lambda: compiled.render(**context).encode())

    def frame(self, view: View, active: str) -> dict[str, Any]:
        return {"req": view.req, "csrf": view.csrf, "session": view.session, "active": active}

    def message_page(self, status: int, title: str, message: str) -> Page:
        return self.render(
            "message.html",
            status=status,
            title=title,
            message=message,
            csrf="",
            session=None,
            active="",
            logout=False,
        )

    async def api(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        return await self.admin.call(method, path, **kw)

    async def get(self, path: str, query: str = "") -> tuple[Any, str | None]:
        """The data of a GET, or None and the API's error message."""
        status, data = await self.api("GET", path, query=query)
        if status == 200:
            return data, None
        return None, _message(data)

    # -- pages -------------------------------------------------------------------------

    async def overview(self, view: View) -> Page:
        control = self.admin.controller is not None
        nodes = (await self.get("/api/v1/nodes"))[0] if control else None
        models, _ = await self.get("/api/v1/models")
        placement = (await self.get("/api/v1/placement"))[0] if control else None
        endpoints, _ = await self.get("/api/v1/endpoints")
        failures = panels.last_failures(nodes["nodes"]) if nodes else {}
        admission, _ = await self.get("/api/v1/admission")
        summary = self.traffic.summary(60.0) if self.traffic is not None else None
        return self.render(
            "overview.html",
            **self.frame(view, "overview"),
            nodes=panels.fleet_summary(nodes["nodes"]) if nodes else None,
            models=models["models"] if models else [],
            placement=placement["models"] if placement else [],
            failures=failures,
            endpoints=panels.endpoint_summary(endpoints["endpoints"]),
            admission=admission,
            summary=summary,
        )

    async def fleet(self, view: View) -> Page:
        if self.admin.controller is None:
            return self._router_only(view, "fleet")
        data, _ = await self.get("/api/v1/nodes")
        nodes = sorted(
            data["nodes"],
            key=lambda n: (NODE_ORDER.get(n["state"], 9), not n["cordoned"], n["id"]),
        )
        pages = max(1, -(-len(nodes) // NODES_PER_PAGE))
        text = view.req.query.get("page", "1")
        number = int(text) if text.isdigit() else 0
        if not 1 <= number <= pages:
            return self.message_page(
                400, "No such page", f"page: must be a whole number in [1, {pages}], got {text!r}"
            )
        first = (number - 1) * NODES_PER_PAGE
        return self.render(
            "fleet.html",
            **self.frame(view, "fleet"),
            nodes=nodes[first : first + NODES_PER_PAGE],
            summary=panels.fleet_summary(nodes),
            page=number,
            pages=pages,
            first=first,
        )

    async def models(self, view: View, error: str | None = None, status: int = 200) -> Page:
        models, _ = await self.get("/api/v1/models")
        control = self.admin.controller is not None
        placement = (await self.get("/api/v1/placement"))[0] if control else None
        replicas = (await self.get("/api/v1/replicas"))[0] if control else None
        nodes = (await self.get("/api/v1/nodes"))[0] if control else None
        by_model: dict[str, list[Any]] = {}
        for r in replicas["replicas"] if replicas else []:
            by_model.setdefault(r["model"], []).append(r)
        explain = {p["model"]: p for p in placement["models"]} if placement else {}
        return self.render(
            "models.html",
            status=status,
            **self.frame(view, "models"),
            models=models["models"],
            replicas=by_model,
            explain=explain,
            failures=panels.last_failures(nodes["nodes"]) if nodes else {},
            can_change=self.admin.models is not None and self.admin.store is not None,
            error=error,
        )

    async def traffic_page(self, view: View) -> Page:
        if self.traffic is None:
            return self.render(
                "traffic.html", **self.frame(view, "traffic"), charts=None, summary=None
            )
        series = self.traffic.series()
        return self.render(
            "traffic.html",
            **self.frame(view, "traffic"),
            charts=panels.traffic_charts(series, self._ceilings()),
            summary=self.traffic.summary(60.0),
        )

    def _ceilings(self) -> list[tuple[str, float]]:
        bands = self.admin.router.config.router.admission.bands
        return [(b.name, b.saturation_ceiling) for b in bands]

    async def endpoints(self, view: View) -> Page:
        data, _ = await self.get("/api/v1/endpoints")
        admission, _ = await self.get("/api/v1/admission")
        return self.render(
            "endpoints.html",
            **self.frame(view, "endpoints"),
            endpoints=data["endpoints"],
            admission=admission,
        )

    async def usage(self, view: View) -> Page:
        query = view.req.query
        period = query.get("period", "24h")
        group_by = query.get("by", "key")
        error = None
        if period not in PERIODS:
            error, period = f"period: must be one of {', '.join(PERIODS)}", "24h"
        if group_by not in ("key", "model"):
            error, group_by = "by: must be 'key' or 'model'", "key"
        since = time.time() - PERIODS[period]
        data, problem = await self.get(
            "/api/v1/usage", urlencode({"group_by": group_by, "since": f"{since:.0f}"})
        )
        rows = data["usage"] if data else []
        return self.render(
            "usage.html",
            status=400 if error else 200,
            **self.frame(view, "usage"),
            rows=rows,
            period=period,
            periods=list(PERIODS),
            by=group_by,
            problem=problem,
            error=error,
            totals=panels.usage_totals(rows),
        )

    async def keys(
        self,
        view: View,
        *,
        created: Any = None,
        error: str | None = None,
        status: int = 200,
        form: Mapping[str, str] | None = None,
    ) -> Page:
        data, problem = await self.get("/api/v1/keys")
        bands = [b.name for b in self.admin.router.config.router.admission.bands]
        return self.render(
            "keys.html",
            status=status,
            **self.frame(view, "keys"),
            keys=data["keys"] if data else [],
            problem=problem,
            created=created,
            bands=bands,
            error=error,
            form=form or {},
        )

    def _router_only(self, view: View, active: str) -> Page:
        return self.render(
            "message.html",
            **self.frame(view, active),
            title="No control plane",
            message="This server runs in router-only mode: there is no fleet to show. "
            "The Endpoints page shows the engines it routes to.",
        )

    # -- actions -------------------------------------------------------------------------

    async def drain(self, view: View) -> Page:
        node = view.form.get("node", "")
        status, data = await self.api("POST", f"/api/v1/nodes/{quote(node, safe='')}/drain")
        if status != 202:
            return self.message_page(status, "Cannot drain", _message(data))
        return redirect(self.url("/fleet", done="drain", id=node))

    async def scale(self, view: View) -> Page:
        form = view.form
        name = form.get("model", "")
        text = form.get("replicas", "").strip()
        try:
            replicas = int(text)
        except ValueError:
            return await self.models(
                view, error=f"replicas: must be a whole number, got {text!r}", status=400
            )
        status, data = await self.api(
            "PATCH", f"/api/v1/models/{quote(name, safe='')}", body={"replicas": replicas}
        )
        if status != 200:
            return await self.models(view, error=_message(data), status=status)
        return redirect(self.url("/models", done="scale", id=name, n=replicas))

    async def create_key(self, view: View) -> Page:
        form = view.form
        try:
            body = panels.key_request(form)
        except ValueError as exc:
            return await self.keys(view, error=str(exc), status=400, form=form)
        status, data = await self.api("POST", "/api/v1/keys", body=body)
        if status != 201:
            return await self.keys(view, error=_message(data), status=status, form=form)
        return await self.keys(view, created=data)

    async def revoke_key(self, view: View) -> Page:
        key_id = view.form.get("id", "")
        status, data = await self.api("DELETE", f"/api/v1/keys/{quote(key_id, safe='')}")
        if status != 200:
            return await self.keys(view, error=_message(data), status=status)
        return redirect(self.url("/keys", done="revoke", id=key_id))


# -- helpers ---------------------------------------------------------------------------


def _message(data: Any) -> str:
    try:
        return str(data["error"]["message"])
    except (TypeError, KeyError):
        return "the admin API refused without a message"


def _local(target: str | None) -> str | None:
    """A dashboard-relative path to go back to after login; anything else is dropped
    (no open redirect to another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    # It becomes a Location header: a CR or LF would start a header of the sender's
    # choosing (Set-Cookie), so any control character drops it.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    return target


def redirect(location: str, *headers: tuple[bytes, bytes]) -> Page:
    # Never a header value with CR, LF or NUL in it, whatever a caller let through.
    if any(c in location for c in "\r\n\0"):
        raise ValueError(f"refusing a Location with a control character: {location!r}")
    return Page(303, b"", headers=((b"location", location.encode("latin-1")), *headers))


def static(name: str) -> Page:
    if name not in STATIC:
        return Page(404, b"no such file", b"text/plain")
    return Page(200, _asset(name), STATIC[name])


@functools.cache
def _asset(name: str) -> bytes:
    """A static file, read once (every page load asks for the stylesheet and script)."""
    return resources.files("llmgw.dashboard").joinpath("static", name).read_bytes()
