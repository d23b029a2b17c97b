"""The web dashboard: server-rendered pages over the admin API, with a little JavaScript.

Every page reads, and every action changes, through :meth:`llmgw.admin.api.AdminApp.call`, the
admin API made in-process: the dashboard shows exactly what the API answers and
refuses what it refuses, with the same messages. Pages are plain HTML (read-only
views work without JavaScript); ``static/dashboard.js`` refreshes the live parts
of a page every few seconds in place, leaving scroll position and form input alone.

The dashboard is a blueprint of the operator application (:mod:`llmgw.admin.web`),
installed in two places (DESIGN §8): on the admin listener at ``/`` beside the API
(a login only when the listener is off loopback) and on the client port under
``/admin`` (always behind a login with an admin key). A login is a session in the
store: the cookie holds its token, HttpOnly and SameSite=Strict; over TLS it is
Secure and ``__Host-``-prefixed, so no other origin can plant or read it.

CSRF is a double-submit token: a random ``llmgw_csrf`` cookie whose value every form
carries in a hidden ``csrf`` field. A cross-site page can neither read the cookie nor
make the browser send it, so it cannot forge a matching pair (and the app refuses
changes the browser says come from another site before any of this runs).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import attrs
import jinja2
import trio
from quart import Blueprint, Response, current_app, g, request
from quart_trio import QuartTrio

from llmgw.admin.contract import ApiError
from llmgw.admin.inputs import query
from llmgw.admin.web import asgi, build_app, mount
from llmgw.dashboard import charts, panels
from llmgw.dashboard.traffic import TrafficRing
from llmgw.http.asgi import Receive, Scope, Send
from llmgw.store.base import Session

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = ["DashboardApp"]

log = logging.getLogger("llmgw.dashboard")

SESSION_COOKIE = "llmgw_session"
CSRF_COOKIE = "llmgw_csrf"
# Dashboard forms are a handful of short fields.
MAX_FORM_BYTES = 64 * 1024

# Every page: no inline script or style (so an injected tag could do nothing), no
# framing, nothing cached (the keys page shows a secret once).
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

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

#: Usage periods the usage page offers (label -> seconds).
PERIODS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}

# What a finished action says on the page it leads back to (`?done=`); fixed texts,
# so a link cannot put words in the dashboard's mouth.
NOTICES = {
    "drain": "Node {id} is draining: its replicas move elsewhere, make before break.",
    "cordon": "Node {id} is cordoned: no new replicas go there; its replicas stay.",
    "uncordon": "Node {id} takes new replicas again.",
    "forget": "Node {id} is forgotten.",
    "scale": "Model {id}: desired replicas set to {n}.",
    "revoke": "Key {id} is revoked.",
    "logout": "Logged out.",
}

# Problems first: an operator opens the fleet page when something is wrong.
NODE_ORDER = {"lost": 0, "unreachable": 1, "ready": 2}
#: Nodes per fleet page: a thousand-node fleet is twenty pages, not one 10 MB page.
NODES_PER_PAGE = 50


class FormError(Exception):
    """A form the dashboard cannot take: answered with `status` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class View:
    """What one request renders with: the page's own data plus the common frame."""

    query: Mapping[str, str]
    csrf: str
    session: Session | None
    form: Mapping[str, str] = attrs.field(factory=dict)  # a POST's fields


Handler = Callable[["DashboardApp", View], Awaitable[Response]]


def _tls() -> bool:
    # Ours, or a proxy's in front (trusting its header is harmless: it only makes the
    # cookie stricter).
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.scheme == "https" or forwarded == "https"


def _cookie_name(name: str) -> str:
    # Over TLS, ``__Host-``: the browser keeps it only when Secure, for this host
    # alone and for path /, so a sibling subdomain or plain HTTP cannot overwrite it.
    return f"__Host-{name}" if _tls() else name


def tokens_match(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(str(a), str(b))


class DashboardApp:
    r"""The dashboard, as a blueprint :meth:`install`\ ed in an operator app, or as an
    ASGI app of its own mounted at `prefix` ("" or e.g. "/admin")."""

    def __init__(
        self,
        admin: AdminContext,
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
        self._asgi: Any = None
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
            "/nodes/cordon": DashboardApp.cordon,
            "/nodes/uncordon": DashboardApp.uncordon,
            "/nodes/forget": DashboardApp.forget,
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

    # -- as an application -------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The dashboard alone (no API beside it), under its prefix."""
        if self._asgi is None:
            app = build_app(self.admin, api=False, dashboard=self)
            self._asgi = mount(app, self.prefix) if self.prefix else asgi(app)
        await self._asgi(scope, receive, send)

    def install(self, app: QuartTrio) -> None:
        """Register the dashboard's blueprint, templates and page headers on `app`."""
        app.jinja_options = {
            **app.jinja_options,
            "undefined": jinja2.StrictUndefined,
            "trim_blocks": True,
            "lstrip_blocks": True,
        }
        env = app.jinja_env
        env.filters.update(
            ago=panels.fmt_ago,
            num=panels.fmt_num,
            pct=lambda v: charts.fmt(v, "%"),
            secs=lambda v: charts.fmt(v, "s"),
            when=panels.fmt_when,
        )
        env.globals.update(bar=charts.bar, nav=NAV, prefix=self.prefix, url=self.url)
        bp = Blueprint(
            "dashboard",
            __name__,
            template_folder="templates",
            static_folder="static",
            static_url_path="/static",
        )
        for path, page in self.pages.items():
            bp.add_url_rule(
                path, endpoint=f"page{path}", view_func=self._viewer(page), methods=["GET"]
            )
        for path, action in self.actions.items():
            bp.add_url_rule(
                path, endpoint=f"do{path}", view_func=self._viewer(action), methods=["POST"]
            )
        bp.add_url_rule("/login", endpoint="login", view_func=self.login, methods=["GET", "POST"])
        bp.before_request(self._csrf_token)
        bp.register_error_handler(FormError, self._form_refused)
        bp.after_request(self._csrf_cookie)
        app.register_blueprint(bp)
        app.after_request(self._page_headers)

    async def _page_headers(self, response: Response) -> Response:
        # Pages and their assets; the API's JSON beside them is not a page.
        if request.blueprint == "dashboard" or response.mimetype == "text/html":
            for name, value in PAGE_HEADERS.items():
                response.headers.setdefault(name, value)
        return response

    async def _csrf_token(self) -> None:
        values = request.cookies.getlist(_cookie_name(CSRF_COOKIE))
        g.csrf_new = not values
        g.csrf = values[0] if values else secrets.token_urlsafe(32)

    async def _csrf_cookie(self, response: Response) -> Response:
        if g.get("csrf_new"):
            self._set_cookie(response, CSRF_COOKIE, g.csrf)
        return response

    def _set_cookie(
        self, response: Response, name: str, value: str, max_age: int | None = None
    ) -> None:
        tls = _tls()
        response.set_cookie(
            _cookie_name(name),
            value,
            max_age=max_age,
            path="/" if tls else (self.prefix or "/"),
            secure=tls,
            httponly=True,
            samesite="Strict",
        )

    def _viewer(self, handler: Handler) -> Callable[[], Awaitable[Response]]:
        async def view() -> Response:
            return await self._view(handler)

        view.__name__ = handler.__name__
        return view

    async def _form_refused(self, exc: FormError) -> Response:
        return await self.message_page(exc.status, "Cannot do that", str(exc))

    async def _view(self, handler: Handler) -> Response:
        session = await self.session() if self.login_required else None
        if self.login_required and session is None:
            if request.method == "GET":
                path = request.path
                return redirect(self.url("/login", next=path if path != "/" else None))
            return await self.message_page(401, "Log in first", "this action needs a login")
        view = View(query(), g.csrf, session)
        if request.method == "POST":
            view = attrs.evolve(view, form=await self.form())
        return await handler(self, view)

    async def form(self) -> dict[str, str]:
        """The POSTed form, its CSRF token checked (a repeated field keeps its last
        value; checkboxes send nothing when unticked)."""
        if request.mimetype != "application/x-www-form-urlencoded":
            raise FormError(415, "expected a form (application/x-www-form-urlencoded)")
        if (request.content_length or 0) > MAX_FORM_BYTES:
            raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
        fields = {k: v for k, v in (await request.form).items()}
        if not request.cookies.getlist(_cookie_name(CSRF_COOKIE)) or not tokens_match(
            fields.get("csrf"), g.csrf
        ):
            raise FormError(
                403, "refused: missing or wrong CSRF token (reload the page and try again)"
            )
        return fields

    def error_page(self, error: ApiError) -> Awaitable[Response]:
        """A refusal from the app's guards or routing, as a page."""
        titles = {404: "Not found", 405: "Not allowed", 503: "The store failed"}
        return self.message_page(
            error.status,
            titles.get(error.status, "Cannot do that"),
            error.message,
            headers=error.headers,
        )

    # -- login -----------------------------------------------------------------------

    async def session(self) -> Session | None:
        store = self.admin.store
        if store is None:
            return None
        for token in request.cookies.getlist(_cookie_name(SESSION_COOKIE)):
            session = await store.get_session(token)
            if session is not None and session.key.admin:
                return session
        return None

    async def login(self) -> Response:
        if request.method == "POST":
            return await self._login()
        return await self.login_form()

    async def login_form(
        self, *, error: str | None = None, status: int = 200, next_after: str | None = None
    ) -> Response:
        if not self.login_required:
            return redirect(self.url("/"))
        problem = None
        if self.admin.store is None:
            problem = (
                "The dashboard here needs a store for its admin keys and sessions "
                "(store.url); without one use it on the admin listener."
            )
        nxt = query().get("next") if request.method == "GET" else next_after
        return await self.render(
            "login.html",
            status=status,
            csrf=g.csrf,
            session=None,
            active="login",
            error=error or problem,
            next=_local(nxt),
        )

    async def _login(self) -> Response:
        form = await self.form()
        store = self.admin.store
        if not self.login_required or store is None:
            return await self.login_form()
        # The login is on the public client port and needs no key: failures per client
        # address are limited, so secrets cannot be guessed at the listener's pace.
        client = request.remote_addr or "?"
        now = trio.current_time()
        if len(self._failures) > MAX_LOGIN_CLIENTS:  # bounded: forget the quiet ones
            self._failures = {
                c: ts for c, ts in self._failures.items() if ts and now - ts[-1] < LOGIN_WINDOW
            }
        failures = [t for t in self._failures.get(client, ()) if now - t < LOGIN_WINDOW]
        self._failures[client] = failures
        if len(failures) >= LOGIN_FAILURES:
            wait = max(1, int(LOGIN_WINDOW - (now - failures[0])) + 1)
            return await self.message_page(
                429,
                "Too many failed logins",
                f"try again in {wait}s",
                headers={"retry-after": str(wait)},
            )
        secret = form.get("key", "").strip()
        record = await store.lookup_key(secret) if secret else None
        if record is None:
            failures.append(now)
            return await self.login_form(
                error="unknown, revoked or expired API key",
                status=401,
                next_after=form.get("next"),
            )
        if not record.admin:
            return await self.login_form(
                error=f"key {record.name} is not an admin key",
                status=403,
                next_after=form.get("next"),
            )
        token = await store.create_session(record.id, self.session_ttl)
        log.info("dashboard login with key %s (%s)", record.id, record.name)
        response = redirect(self.url(_local(form.get("next")) or "/"))
        self._set_cookie(response, SESSION_COOKIE, token, max_age=int(self.session_ttl))
        return response

    async def logout(self, view: View) -> Response:
        store = self.admin.store
        if store is not None:
            for token in request.cookies.getlist(_cookie_name(SESSION_COOKIE)):
                await store.delete_session(token)
        target = "/login" if self.login_required else "/"
        response = redirect(self.url(target, done="logout"))
        self._set_cookie(response, SESSION_COOKIE, "", max_age=0)
        return response

    # -- rendering -----------------------------------------------------------------------

    async def render(
        self,
        template: str,
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        **context: Any,
    ) -> Response:
        """`template` with `context` as a page. Rendered in a worker thread: a large
        fleet's page takes a noticeable while, and the proxied requests share this
        thread. The context is plain data (decoded API answers), nothing trio owns."""
        page = context.pop("page_query", None)
        done = page.get("done") if page is not None and request.method == "GET" else None
        notice = None
        if done in NOTICES and page is not None:
            notice = NOTICES[done].format(id=page.get("id", "?"), n=page.get("n", "?"))
        context.setdefault("notice", notice)
        # The URL the page refreshes from: itself, or its page after a form's POST.
        if request.method == "GET":
            raw = request.query_string.decode("latin-1")
            self_url = request.root_path + request.path + (f"?{raw}" if raw else "")
        else:
            paths = {key: path for key, path, _ in NAV}
            self_url = self.url(paths.get(context.get("active", ""), "/"))
        context.setdefault("self_url", self_url)
        context.setdefault("error", None)
        context.setdefault("refresh", REFRESH_SECONDS)
        context.setdefault("rendered", panels.fmt_when(time.time()))
        context.setdefault("control", self.admin.controller is not None)
        context.setdefault("logout", self.login_required)
        compiled = current_app.jinja_env.get_template(template)
        try:
            body = await trio.to_thread.run_sync(lambda: compiled.render(**context))
        except Exception:
            log.exception("dashboard %s %s: rendering failed", request.method, request.path)
            message = current_app.jinja_env.get_template("message.html")
            body = message.render(
                **{
                    **context,
                    "title": "Internal error",
                    "message": "logged by the server",
                    "session": None,
                    "active": "",
                    "logout": False,
                }
            )
            status = 500
        return Response(
            body, status, headers=dict(headers or {}), content_type="text/html; charset=utf-8"
        )

    def frame(self, view: View, active: str) -> dict[str, Any]:
        return {
            "page_query": view.query,
            "csrf": view.csrf,
            "session": view.session,
            "active": active,
        }

    def message_page(
        self, status: int, title: str, message: str, headers: Mapping[str, str] | None = None
    ) -> Awaitable[Response]:
        return self.render(
            "message.html",
            status=status,
            headers=headers,
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

    async def overview(self, view: View) -> Response:
        control = self.admin.controller is not None
        nodes = (await self.get("/api/v1/nodes"))[0] if control else None
        models, _ = await self.get("/api/v1/models")
        placement = (await self.get("/api/v1/placement"))[0] if control else None
        endpoints, _ = await self.get("/api/v1/endpoints")
        failures = panels.last_failures(nodes["nodes"]) if nodes else {}
        admission, _ = await self.get("/api/v1/admission")
        summary = self.traffic.summary(60.0) if self.traffic is not None else None
        return await self.render(
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

    async def fleet(self, view: View) -> Response:
        if self.admin.controller is None:
            return await self._router_only(view, "fleet")
        data, _ = await self.get("/api/v1/nodes")
        nodes = sorted(
            data["nodes"],
            key=lambda n: (NODE_ORDER.get(n["state"], 9), not n["cordoned"], n["id"]),
        )
        pages = max(1, -(-len(nodes) // NODES_PER_PAGE))
        text = view.query.get("page", "1")
        number = int(text) if text.isdigit() else 0
        if not 1 <= number <= pages:
            return await self.message_page(
                400, "No such page", f"page: must be a whole number in [1, {pages}], got {text!r}"
            )
        first = (number - 1) * NODES_PER_PAGE
        return await self.render(
            "fleet.html",
            **self.frame(view, "fleet"),
            nodes=nodes[first : first + NODES_PER_PAGE],
            summary=panels.fleet_summary(nodes),
            page=number,
            pages=pages,
            first=first,
        )

    async def models(self, view: View, error: str | None = None, status: int = 200) -> Response:
        models, _ = await self.get("/api/v1/models")
        control = self.admin.controller is not None
        placement = (await self.get("/api/v1/placement"))[0] if control else None
        replicas = (await self.get("/api/v1/replicas"))[0] if control else None
        nodes = (await self.get("/api/v1/nodes"))[0] if control else None
        by_model: dict[str, list[Any]] = {}
        for r in replicas["replicas"] if replicas else []:
            by_model.setdefault(r["model"], []).append(r)
        explain = {p["model"]: p for p in placement["models"]} if placement else {}
        return await self.render(
            "models.html",
            status=status,
            **self.frame(view, "models"),
            models=models["models"],
            replicas=by_model,
            explain=explain,
            failures=panels.last_failures(nodes["nodes"]) if nodes else {},
            can_change=self.admin.models is not None and self.admin.store is not None,
            default_profile=self.admin.router.config.router.default_profile,
            error=error,
        )

    async def traffic_page(self, view: View) -> Response:
        if self.traffic is None:
            return await self.render(
                "traffic.html", **self.frame(view, "traffic"), charts=None, summary=None
            )
        series = self.traffic.series()
        return await self.render(
            "traffic.html",
            **self.frame(view, "traffic"),
            charts=panels.traffic_charts(series, self._ceilings()),
            summary=self.traffic.summary(60.0),
        )

    def _ceilings(self) -> list[tuple[str, float]]:
        bands = self.admin.router.config.router.admission.bands
        return [(b.name, b.saturation_ceiling) for b in bands]

    async def endpoints(self, view: View) -> Response:
        data, _ = await self.get("/api/v1/endpoints")
        admission, _ = await self.get("/api/v1/admission")
        return await self.render(
            "endpoints.html",
            **self.frame(view, "endpoints"),
            endpoints=data["endpoints"],
            admission=admission,
        )

    async def usage(self, view: View) -> Response:
        query = view.query
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
        return await self.render(
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
    ) -> Response:
        data, problem = await self.get("/api/v1/keys")
        bands = [b.name for b in self.admin.router.config.router.admission.bands]
        return await self.render(
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

    async def _router_only(self, view: View, active: str) -> Response:
        return await self.render(
            "message.html",
            **self.frame(view, active),
            title="No control plane",
            message="This server runs in router-only mode: there is no fleet to show. "
            "The Endpoints page shows the engines it routes to.",
        )

    # -- actions -------------------------------------------------------------------------

    async def drain(self, view: View) -> Response:
        node = view.form.get("node", "")
        status, data = await self.api("POST", f"/api/v1/nodes/{quote(node, safe='')}/drain")
        if status != 202:
            return await self.message_page(status, "Cannot drain", _message(data))
        return redirect(self.url("/fleet", done="drain", id=node))

    async def cordon(self, view: View) -> Response:
        return await self._node_action(view, "cordon", "Cannot cordon")

    async def uncordon(self, view: View) -> Response:
        return await self._node_action(view, "uncordon", "Cannot uncordon")

    async def forget(self, view: View) -> Response:
        node = view.form.get("node", "")
        status, data = await self.api("DELETE", f"/api/v1/nodes/{quote(node, safe='')}")
        if status not in (200, 204):
            return await self.message_page(status, "Cannot forget", _message(data))
        return redirect(self.url("/fleet", done="forget", id=node))

    async def _node_action(self, view: View, verb: str, refused: str) -> Response:
        node = view.form.get("node", "")
        status, data = await self.api("POST", f"/api/v1/nodes/{quote(node, safe='')}/{verb}")
        if status != 200:
            return await self.message_page(status, refused, _message(data))
        return redirect(self.url("/fleet", done=verb, id=node))

    async def scale(self, view: View) -> Response:
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

    async def create_key(self, view: View) -> Response:
        form = view.form
        try:
            body = panels.key_request(form)
        except ValueError as exc:
            return await self.keys(view, error=str(exc), status=400, form=form)
        status, data = await self.api("POST", "/api/v1/keys", body=body)
        if status != 201:
            return await self.keys(view, error=_message(data), status=status, form=form)
        return await self.keys(view, created=data)

    async def revoke_key(self, view: View) -> Response:
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


def redirect(location: str) -> Response:
    # Never a header value with CR, LF or NUL in it, whatever a caller let through.
    if any(c in location for c in "\r\n\0"):
        raise ValueError(f"refusing a Location with a control character: {location!r}")
    return Response("", 303, headers={"location": location})
