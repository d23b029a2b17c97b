"""The admin listener's routes: `/metrics`, `/healthz`, `/readyz` and `/api/v1/...`.

`/metrics` renders inside the request, on the trio thread, so collectors read
trio-owned state without locks.

Every route is a :class:`~llmgw.admin.http.Route` in :attr:`AdminApp.routes`: the
handler with its contract, from which ``GET /api/v1/openapi.json`` is generated
(:mod:`llmgw.admin.openapi`). Routes are matched on their path first (``{name}``
segments match one path segment each, the model name the rest of the path), then
on the method: a path that exists answers 405 with ``allow`` for another method.
Path values are passed in ``scope["path_params"]`` and ``Request.path_params``.

The control-plane routes (nodes, replicas, placement) answer 404 with a clear
message when the server runs in router-only mode. Keys and usage live in the store:
without one those routes answer 409 saying so, as do changes to models.

**Admin auth.** With `admin_auth` (the server sets it when the admin listener is
bound to a non-loopback address) every ``/api/v1/`` route requires
``Authorization: Bearer <secret>`` of a usable key with ``admin`` set: 401 when it is
missing or not a usable key, 403 when the key is not an admin key. `/metrics`,
`/healthz` and `/readyz` stay open (scrapers and probes carry no keys).

Errors are always ``{"error": {"message", "type", "param", "code"}}``. Request bodies
are JSON objects of at most 1 MiB (413 beyond, unread when Content-Length says so).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw.admin import keys, models_api, openapi, usage
from llmgw.admin.http import (
    MAX_BODY_BYTES,
    ApiError,
    Body,
    ErrorBody,
    Out,
    Reply,
    Request,
    Route,
    json_bytes,
    json_reply,
)
from llmgw.admin.views import (
    AdmissionView,
    EndpointList,
    HealthView,
    NodeList,
    PlacementList,
    ReadyView,
    ReplicaList,
    from_dict,
    unstructure,
)
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig
from llmgw.control import views
from llmgw.dashboard.web import same_origin
from llmgw.http.asgi import Receive, Scope, Send, answer_non_http
from llmgw.router.core import Router
from llmgw.store.base import Store, StoreError

if TYPE_CHECKING:
    from llmgw.control.controller import Controller
    from llmgw.models import ModelRegistry

__all__ = ["API_PREFIX", "ROUTER_ONLY", "AdminApp"]

log = logging.getLogger("llmgw.admin")

ROUTER_ONLY = "no control plane: this server runs in router-only mode"
API_PREFIX = "/api/v1/"

NO_AUTH_STORE = (
    "admin_auth needs a store to look admin keys up in: configure store.url, or bind the "
    "admin listener to a loopback address"
)


def _errors(*statuses: int, **descriptions: str) -> dict[int, Out]:
    return {s: Out(descriptions.get(f"e{s}", _ERROR_TEXT[s]), ErrorBody) for s in statuses}


_ERROR_TEXT = {
    400: "invalid request: the message names the parameter or key at fault",
    404: "not found",
    409: "refused: the message says why (e.g. no store is configured)",
    503: "the store cannot be reached",
}


class AdminApp:
    """The admin ASGI app. `controller` is None in router-only mode; `store` and
    `models` are None when no store is configured or the caller wires none."""

    def __init__(
        self,
        router: Router,
        *,
        controller: Controller | None = None,
        store: Store | None = None,
        models: ModelRegistry | None = None,
        admin_auth: bool = False,
        ready: Callable[[], bool] = lambda: True,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout: float | None = None,
        hosts: frozenset[str] | None = None,
    ) -> None:
        if admin_auth and store is None:
            raise ValueError(NO_AUTH_STORE)
        self.router = router
        self.controller = controller
        self.store = store
        self.models = models
        self.admin_auth = admin_auth
        self.ready = ready
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.hosts = hosts
        self.routes: list[Route] = self._routes()
        self._openapi: bytes | None = None

    def catalog(self) -> Catalog:
        """The live catalog: the registry's when one is wired, else the router's."""
        return self.models.catalog if self.models is not None else self.router.catalog

    # -- the route table ------------------------------------------------------------

    def _routes(self) -> list[Route]:
        fleet = "fleet"
        no_fleet = {404: Out(ROUTER_ONLY + " (code no_control_plane)", ErrorBody)}
        key_errors = _errors(409, 503, e409="no store is configured (store.url)")
        model_name = "a model's name (an alias also works for GET); percent-encode a '/'"
        return [
            Route(
                "GET",
                "/metrics",
                self.metrics,
                "metrics",
                "Prometheus metrics",
                "health",
                {200: Out("Prometheus text exposition format", {"type": "string"}, "text/plain")},
            ),
            Route(
                "GET",
                "/healthz",
                self.healthz,
                "healthz",
                "Liveness: the process answers",
                "health",
                {200: Out("alive", HealthView)},
            ),
            Route(
                "GET",
                "/readyz",
                self.readyz,
                "readyz",
                "Readiness: the router can serve (an endpoint has been scraped)",
                "health",
                {200: Out("ready", ReadyView), 503: Out("not ready", ReadyView)},
            ),
            Route(
                "GET",
                "/api/v1/openapi.json",
                self.openapi,
                "getOpenAPI",
                "This document",
                "meta",
                {200: Out("the OpenAPI document of this admin API", {"type": "object"})},
            ),
            Route(
                "GET",
                "/api/v1/endpoints",
                self.endpoints,
                "listEndpoints",
                "Endpoints with their live numbers and scores",
                "routing",
                {200: Out("every endpoint the router knows", EndpointList)},
            ),
            Route(
                "GET",
                "/api/v1/admission",
                self.admission,
                "getAdmission",
                "Admission queues per pool and band",
                "routing",
                {200: Out("live queues, counters and saturation", AdmissionView)},
            ),
            Route(
                "GET",
                "/api/v1/nodes",
                self.nodes,
                "listNodes",
                "Nodes with their GPUs, engines and shards",
                fleet,
                {200: Out("every node, by id", NodeList), **no_fleet},
            ),
            Route(
                "GET",
                "/api/v1/nodes/{id}",
                self.node,
                "getNode",
                "One node",
                fleet,
                {
                    200: Out("the node", views.NodeDetail),
                    404: Out("no such node, or router-only mode", ErrorBody),
                },
            ),
            Route(
                "POST",
                "/api/v1/nodes/{id}/drain",
                self.drain_node,
                "drainNode",
                "Cordon a node and move its replicas elsewhere, make before break",
                fleet,
                {
                    202: Out("draining: the node as it is now", views.NodeDetail),
                    404: Out("no such node, or router-only mode", ErrorBody),
                },
            ),
            Route(
                "GET",
                "/api/v1/replicas",
                self.replicas,
                "listReplicas",
                "Replicas, and per model desired against actual",
                fleet,
                {200: Out("every replica", ReplicaList), **no_fleet},
            ),
            Route(
                "GET",
                "/api/v1/placement",
                self.placement,
                "getPlacement",
                "Why replicas could not be placed",
                fleet,
                {200: Out("models missing replicas, with reasons", PlacementList), **no_fleet},
            ),
            Route(
                "GET",
                "/api/v1/keys",
                partial(keys.list_keys, self),
                "listKeys",
                "API keys (never their secrets)",
                "keys",
                {200: Out("every key, oldest first", keys.KeyList), **key_errors},
                uses_store=True,
            ),
            Route(
                "POST",
                "/api/v1/keys",
                partial(keys.create_key, self),
                "createKey",
                "Create an API key; the answer shows its secret, this once",
                "keys",
                {
                    201: Out(
                        "created: the key and its secret",
                        keys.NewKeyView,
                        headers={"location": "the key's URL"},
                    ),
                    **_errors(400),
                    **key_errors,
                },
                body=Body(keys.KeyCreate, "the key to create"),
                uses_store=True,
            ),
            Route(
                "DELETE",
                "/api/v1/keys/{id}",
                partial(keys.revoke_key, self),
                "revokeKey",
                "Revoke an API key (it stays listed, revoked)",
                "keys",
                {
                    200: Out("revoked: the key", keys.KeyView),
                    404: Out("no such key", ErrorBody),
                    409: Out(
                        "no store is configured, or it is the last admin key the admin API needs",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                uses_store=True,
            ),
            Route(
                "GET",
                "/api/v1/usage",
                partial(usage.usage, self),
                "getUsage",
                "Usage per API key or model, over a window, optionally per time bucket",
                "usage",
                {200: Out("totals", usage.UsageReport), **_errors(400), **key_errors},
                query=usage.QUERY,
                uses_store=True,
            ),
            Route(
                "GET",
                "/api/v1/models",
                partial(models_api.list_models, self),
                "listModels",
                "The live model catalog, with replica and routing status",
                "models",
                {200: Out("every model", "ModelList")},
            ),
            Route(
                "POST",
                "/api/v1/models",
                partial(models_api.create_model, self),
                "createModel",
                "Add a model at runtime (validated, stored, then live)",
                "models",
                {
                    201: Out("added", "Model", headers={"location": "the model's URL"}),
                    **_errors(400),
                    409: Out(
                        "no store is configured, or the model exists (or the configuration "
                        "file defines it)",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                body=Body(ModelConfig, "a catalog entry, as the configuration writes it", "config"),
                uses_store=True,
            ),
            Route(
                "GET",
                "/api/v1/models/{name}",
                partial(models_api.get_model, self),
                "getModel",
                "One model, by name or alias",
                "models",
                {200: Out("the model", "Model"), 404: Out("no such model", ErrorBody)},
                greedy=True,
                description=model_name,
            ),
            Route(
                "PATCH",
                "/api/v1/models/{name}",
                partial(models_api.patch_model, self),
                "patchModel",
                "Change a runtime model: the keys given replace the model's",
                "models",
                {
                    200: Out("changed", "Model"),
                    **_errors(400),
                    404: Out("no runtime model by that name", ErrorBody),
                    409: Out(
                        "no store is configured, or the configuration file defines the model",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                body=Body("ModelPatch", "the keys to change (any of a catalog entry's)"),
                greedy=True,
                description=model_name,
                uses_store=True,
            ),
            Route(
                "DELETE",
                "/api/v1/models/{name}",
                partial(models_api.delete_model, self),
                "deleteModel",
                "Remove a runtime model",
                "models",
                {
                    204: Out("removed"),
                    404: Out("no runtime model by that name", ErrorBody),
                    409: Out(
                        "no store is configured, the configuration file defines the model, "
                        "or another model falls back to it",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                greedy=True,
                description=model_name,
                uses_store=True,
            ),
        ]

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route for a request and its path parameters; 404 when no route has the
        path, 405 (with ``allow``) when none has it with this method."""
        path = path.rstrip("/") or "/"
        allowed: list[str] = []
        for route in self.routes:
            params = route.match(path)
            if params is None:
                continue
            if route.method == method:
                return route, params
            if route.method not in allowed:
                allowed.append(route.method)
        if not allowed:
            raise ApiError(404, f"no route {method} {path}", "not_found")
        allow = ", ".join(allowed)
        raise ApiError(
            405,
            f"method {method} not allowed on {path} (allowed: {allow})",
            "method_not_allowed",
            headers=((b"allow", allow.encode()),),
        )

    # -- dispatch ---------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await answer_non_http(scope, receive, send)
            return
        req = Request(scope, receive, max_body=self.max_body_bytes, body_timeout=self.body_timeout)
        reply = await self.handle(req)
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": reply.start_headers(),
            }
        )
        await send({"type": "http.response.body", "body": reply.body or b""})

    async def handle(self, req: Request) -> Reply:
        """The reply to one request: a refusal as an error reply, never an exception."""
        # DNS rebinding: a page at attacker.example resolving to 127.0.0.1 reaches a
        # keyless loopback listener, but its requests still carry its own Host.
        if self.hosts is not None and _host(req.header(b"host")) not in self.hosts:
            return ApiError(421, "this listener does not serve that Host", "misdirected").reply()
        # A page the operator has open elsewhere can make the browser send requests
        # here (loopback needs no key); the browser says where they come from.
        if req.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(req):
            return ApiError(
                403, "refused: the request comes from another site", "cross_site"
            ).reply()
        if self.admin_auth and self.protected(req.path):
            try:
                await self.authorize(req)
            except ApiError as exc:
                return exc.reply()
            except StoreError as exc:
                log.warning("admin %s %s: store error: %s", req.method, req.path, exc)
                return ApiError(503, f"the store failed: {exc}", "store_unavailable").reply()
        return await self.dispatch(req)

    async def call(
        self, method: str, path: str, *, query: str = "", body: Any = None
    ) -> tuple[int, Any]:
        """One API request made in-process, past admin auth (the caller authenticated
        its user itself): the status and the decoded JSON answer (None without a body).
        The dashboard reads and changes everything through this, so it shows and does
        exactly what the API does."""
        raw = b"" if body is None else json_bytes(body)
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        scope: Scope = {
            "type": "http",
            "method": method,
            "path": path,
            "query_string": query.encode("ascii"),
            "headers": [(b"content-type", b"application/json")],
        }
        reply = await self.dispatch(Request(scope, receive, max_body=self.max_body_bytes))
        if reply.data is not None:
            return reply.status, reply.data
        return reply.status, json.loads(reply.body) if reply.body else None

    async def dispatch(self, req: Request) -> Reply:
        """The reply of the route `req` asks for, without admin auth."""
        try:
            route, params = self.resolve(req.method, req.path)
            req.path_params = params
            req.scope["path_params"] = params
            if route.path.startswith(API_PREFIX):
                req.check_query({p.name for p in route.query})
            return await route.handler(req)
        except ApiError as exc:
            return exc.reply()
        except StoreError as exc:
            log.warning("admin %s %s: store error: %s", req.method, req.path, exc)
            return ApiError(503, f"the store failed: {exc}", "store_unavailable").reply()
        except Exception:
            log.exception("admin %s %s failed", req.method, req.path)
            return ApiError(500, "internal error (logged by the server)", "internal").reply()

    @staticmethod
    def owns(path: str) -> bool:
        """Whether `path` is this app's (the rest of the admin listener is the dashboard's)."""
        return path in ("/metrics", "/healthz", "/readyz") or AdminApp.protected(path)

    @staticmethod
    def protected(path: str) -> bool:
        return path.startswith(API_PREFIX) or path.rstrip("/") == API_PREFIX.rstrip("/")

    async def authorize(self, req: Request) -> None:
        """401 without a usable key's secret, 403 when the key is not an admin key."""
        assert self.store is not None  # the constructor insists
        challenge = ((b"www-authenticate", b'Bearer realm="llmgw-admin"'),)
        value = req.header(b"authorization")
        if value is None:
            raise ApiError(
                401,
                "the admin API needs an admin key: send Authorization: Bearer <secret>",
                "missing_api_key",
                headers=challenge,
            )
        scheme, _, secret = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(
                401,
                "expected Authorization: Bearer <secret>",
                "invalid_authorization",
                headers=challenge,
            )
        record = await self.store.lookup_key(secret.strip())
        if record is None:
            raise ApiError(
                401,
                "unknown, revoked or expired API key",
                "invalid_api_key",
                headers=(
                    (b"www-authenticate", b'Bearer realm="llmgw-admin", error="invalid_token"'),
                ),
            )
        if not record.admin:
            raise ApiError(
                403, f"key {record.id} ({record.name}) is not an admin key", "not_admin_key"
            )

    # -- health and routing ---------------------------------------------------------------

    async def metrics(self, req: Request) -> Reply:
        body = generate_latest(self.router.metrics.registry)
        return Reply(200, body, content_type=CONTENT_TYPE_LATEST.encode())

    async def healthz(self, req: Request) -> Reply:
        return json_reply(200, unstructure(HealthView("ok")))

    async def readyz(self, req: Request) -> Reply:
        """Ready when the router can serve: at least one endpoint has been scraped."""
        serving = [s for s in self.router.endpoints.all() if s.sample is not None]
        ok = self.ready() and bool(serving)
        view = ReadyView("ready" if ok else "not ready", len(serving))
        return json_reply(200 if ok else 503, unstructure(view))

    async def openapi(self, req: Request) -> Reply:
        if self._openapi is None:
            self._openapi = json_bytes(self.openapi_document())
        return Reply(200, self._openapi)

    def openapi_document(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document of this app, as configured (auth, bands)."""
        return openapi.document(self)

    async def endpoints(self, req: Request) -> Reply:
        view = from_dict({"endpoints": self.router.endpoint_views()}, EndpointList)
        return json_reply(200, unstructure(view))

    async def admission(self, req: Request) -> Reply:
        """Live queues per pool and band, and each pool's saturation."""
        view = from_dict(self.router.admission_view(), AdmissionView)
        return json_reply(200, unstructure(view))

    # -- the control plane ------------------------------------------------------------

    def _controller(self) -> Controller:
        if self.controller is None:
            raise ApiError(404, ROUTER_ONLY, "no_control_plane")
        return self.controller

    async def nodes(self, req: Request) -> Reply:
        """Every node with its GPUs, engines and shards."""
        return json_reply(200, views.nodes_json(self._controller()))

    async def node(self, req: Request) -> Reply:
        """One node, by id."""
        controller = self._controller()
        node_id = req.path_params["id"]
        body = views.node_json(controller, node_id)
        if body is None:
            raise ApiError(404, f"no node {node_id!r}", "node_not_found")
        return json_reply(200, body)

    async def replicas(self, req: Request) -> Reply:
        """Every replica, and per model desired against actual counts."""
        return json_reply(200, views.replicas_json(self._controller()))

    async def placement(self, req: Request) -> Reply:
        """Why replicas of each model that misses some could not be placed."""
        return json_reply(200, views.placement_json(self._controller()))

    async def drain_node(self, req: Request) -> Reply:
        """Cordon the node and move its replicas elsewhere, make before break."""
        controller = self._controller()
        node_id = req.path_params["id"]
        if controller.inventory.get(node_id) is None:
            raise ApiError(404, f"no node {node_id!r}", "node_not_found")
        controller.drain_node(node_id)
        return json_reply(202, views.node_json(controller, node_id))


#: The names a loopback listener answers to (with its bound addresses).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _host(value: str | None) -> str:
    """The host part of a Host header, lower case, without port or IPv6 brackets."""
    host = (value or "").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host
