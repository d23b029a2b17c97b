"""The admin listener's routes: `/metrics`, `/healthz`, `/readyz` and `/api/v1/...`.

Handlers live in one module per resource: :mod:`llmgw.admin.health` (health and
routing), :mod:`~llmgw.admin.fleet_api` (the control plane), :mod:`~llmgw.admin.keys`,
:mod:`~llmgw.admin.usage`, :mod:`~llmgw.admin.models_api`, :mod:`~llmgw.admin.debug`.

Every route is a :class:`~llmgw.admin.contract.Route` in :attr:`AdminApp.routes`:
the handler with its contract, from which both the app's URL rules
(:meth:`AdminApp.blueprint`) and ``GET /api/v1/openapi.json``
(:mod:`llmgw.admin.openapi`) are made. ``{name}`` segments match one path segment
each, the model name the rest of the path; a path that exists answers 405 with
``allow`` for another method. Path values reach handlers as keyword arguments.

The control-plane routes (nodes, replicas, placement) answer 404 with a clear
message when the server runs in router-only mode. Keys and usage live in the store:
without one those routes answer 409 saying so, as do changes to models.

**Admin auth.** With `admin_auth` (the server sets it when the admin listener is
bound to a non-loopback address) every ``/api/v1/`` route requires
``Authorization: Bearer <secret>`` of a usable key with ``admin`` set: 401 when it is
missing or not a usable key, 403 when the key is not an admin key. `/metrics`,
`/healthz` and `/readyz` stay open (scrapers and probes carry no keys).

Errors are always ``{"error": {"message", "type", "param", "code"}}``. Request bodies
are JSON objects sent as ``application/json`` (415 otherwise) of at most 1 MiB (413
beyond, unread when Content-Length says so).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from quart import Blueprint, Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import MethodNotAllowed, NotFound

from llmgw.admin import (
    debug,
    endpoints_api,
    fleet_api,
    health,
    keys,
    models_api,
    openapi,
    usage,
)
from llmgw.admin.context import Traffic
from llmgw.admin.contract import (
    API_PREFIX,
    MAX_BODY_BYTES,
    ApiError,
    Body,
    ErrorBody,
    Out,
    Route,
    json_bytes,
)
from llmgw.admin.fleet_api import ROUTER_ONLY
from llmgw.admin.inputs import check_query
from llmgw.admin.views import (
    AdmissionView,
    EndpointList,
    EndpointView,
    HealthView,
    NodeList,
    PlacementList,
    ReadyView,
    ReplicaList,
)
from llmgw.admin.web import TRUSTED, asgi, build_app
from llmgw.catalog.rules import Catalog
from llmgw.config import EndpointConfig
from llmgw.control import views
from llmgw.domain.catalog import ModelConfig
from llmgw.http.asgi import Receive, Scope, Send
from llmgw.router.core import Router
from llmgw.store.base import Store

if TYPE_CHECKING:
    from llmgw.catalog.live import ModelRegistry
    from llmgw.control.controller import Controller
    from llmgw.endpoint_sources import EndpointSources

__all__ = ["API_PREFIX", "ROUTER_ONLY", "AdminApp"]

log = logging.getLogger("llmgw.admin")

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
    `models` are None when no store is configured or the caller wires none, and
    `endpoint_sources` when the caller wires none (endpoints cannot be changed then)."""

    def __init__(
        self,
        router: Router,
        *,
        controller: Controller | None = None,
        store: Store | None = None,
        models: ModelRegistry | None = None,
        endpoint_sources: EndpointSources | None = None,
        admin_auth: bool = False,
        ready: Callable[[], bool] = lambda: True,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout: float | None = None,
        hosts: frozenset[str] | None = None,
        max_profile_seconds: int = debug.MAX_PROFILE_SECONDS,
        traffic: Traffic | None = None,
    ) -> None:
        if admin_auth and store is None:
            raise ValueError(NO_AUTH_STORE)
        self.router = router
        # The traffic views: the router's, or its workers' merged (llmgw.workers).
        self.traffic: Traffic = traffic or router
        self.controller = controller
        self.store = store
        self.models = models
        self.endpoint_sources = endpoint_sources
        self.admin_auth = admin_auth
        self.ready = ready
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.hosts = hosts
        self.max_profile_seconds = max_profile_seconds
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
                partial(health.metrics, self),
                "metrics",
                "Prometheus metrics",
                "health",
                {200: Out("Prometheus text exposition format", {"type": "string"}, "text/plain")},
            ),
            Route(
                "GET",
                "/healthz",
                partial(health.healthz, self),
                "healthz",
                "Liveness: the process answers",
                "health",
                {200: Out("alive", HealthView)},
            ),
            Route(
                "GET",
                "/readyz",
                partial(health.readyz, self),
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
                partial(health.endpoints, self),
                "listEndpoints",
                "Endpoints with their live numbers and scores",
                "routing",
                {200: Out("every endpoint the router knows", EndpointList)},
            ),
            Route(
                "POST",
                "/api/v1/endpoints",
                partial(endpoints_api.create_endpoint, self),
                "createEndpoint",
                "Add an endpoint at runtime (checked, stored, then routed to)",
                "routing",
                {
                    201: Out(
                        "added: the endpoint as the router sees it",
                        EndpointView,
                        headers={"location": "the endpoint's URL"},
                    ),
                    **_errors(400),
                    409: Out(
                        "no store is configured, or an endpoint has that id (the "
                        "configuration file's, the discovery file's, a runtime one or a "
                        "control-plane replica; code endpoint_exists)",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                body=Body(
                    EndpointConfig,
                    "an endpoint, as the configuration file's [[endpoints]] writes it",
                    "config",
                ),
                uses_store=True,
            ),
            Route(
                "DELETE",
                "/api/v1/endpoints/{id}",
                partial(endpoints_api.delete_endpoint, self),
                "deleteEndpoint",
                "Remove a runtime endpoint: it drains (requests in flight finish), then goes",
                "routing",
                {
                    204: Out("removed from the store; draining"),
                    404: Out("no runtime endpoint by that id", ErrorBody),
                    409: Out(
                        "no store is configured, or the configuration file or the discovery "
                        "file gives the endpoint (code endpoint_in_config, "
                        "endpoint_discovered): edit that file",
                        ErrorBody,
                    ),
                    **_errors(503),
                },
                greedy=True,
                description="the endpoint's id; percent-encode a '/'",
                uses_store=True,
            ),
            Route(
                "GET",
                "/api/v1/admission",
                partial(health.admission, self),
                "getAdmission",
                "Admission queues per pool and band",
                "routing",
                {200: Out("live queues, counters and saturation", AdmissionView)},
            ),
            Route(
                "GET",
                "/api/v1/nodes",
                partial(fleet_api.nodes, self),
                "listNodes",
                "Nodes with their GPUs, engines and shards",
                fleet,
                {200: Out("every node, by id", NodeList), **no_fleet},
            ),
            Route(
                "GET",
                "/api/v1/nodes/{id}",
                partial(fleet_api.node, self),
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
                partial(fleet_api.drain_node, self),
                "drainNode",
                "Cordon a node and move its replicas elsewhere, make before break",
                fleet,
                {
                    202: Out("draining: the node as it is now", views.NodeDetail),
                    404: Out("no such node, or router-only mode", ErrorBody),
                },
            ),
            Route(
                "POST",
                "/api/v1/nodes/{id}/cordon",
                partial(fleet_api.cordon_node, self),
                "cordonNode",
                "Cordon a node: no new shards, its replicas stay (ends a drain)",
                fleet,
                {
                    200: Out("cordoned: the node as it is now", views.NodeDetail),
                    404: Out("no such node, or router-only mode", ErrorBody),
                    503: Out("cordoned now, but the store failed to keep it", ErrorBody),
                },
            ),
            Route(
                "POST",
                "/api/v1/nodes/{id}/uncordon",
                partial(fleet_api.uncordon_node, self),
                "uncordonNode",
                "Undo a cordon or drain: the node takes new shards again",
                fleet,
                {
                    200: Out("uncordoned: the node as it is now", views.NodeDetail),
                    404: Out("no such node, or router-only mode", ErrorBody),
                    503: Out("uncordoned now, but the store failed to keep it", ErrorBody),
                },
            ),
            Route(
                "DELETE",
                "/api/v1/nodes/{id}",
                partial(fleet_api.forget_node, self),
                "forgetNode",
                "Forget a lost or unreachable node (and its cordon)",
                fleet,
                {
                    200: Out("forgotten: the node as it was", views.NodeDetail),
                    204: Out(
                        "not registered since the server started: its stored cordon is dropped"
                    ),
                    404: Out("no such node, or router-only mode", ErrorBody),
                    409: Out(
                        "refused: its agent is connected, or replicas are still placed on it",
                        ErrorBody,
                    ),
                    503: Out("forgotten now, but the store failed to drop its cordon", ErrorBody),
                },
            ),
            Route(
                "GET",
                "/api/v1/replicas",
                partial(fleet_api.replicas, self),
                "listReplicas",
                "Replicas, and per model desired against actual",
                fleet,
                {200: Out("every replica", ReplicaList), **no_fleet},
            ),
            Route(
                "GET",
                "/api/v1/placement",
                partial(fleet_api.placement, self),
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
                    409: Out(
                        "no store is configured, or a key that is not revoked has that name "
                        "(code duplicate_name)",
                        ErrorBody,
                    ),
                    **_errors(503),
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
                        "no store is configured, the model exists (or the configuration "
                        "file defines it), or it has deployment profiles and no control "
                        "plane runs (code no_control_plane)",
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
                        "no store is configured, the configuration file defines the model, or "
                        "the change gives it deployment profiles and no control plane runs "
                        "(code no_control_plane)",
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
            *self._debug_routes(),
        ]

    def _debug_routes(self) -> list[Route]:
        tag = "debug"
        text = {"type": "string"}
        return [
            Route(
                "GET",
                "/api/v1/debug",
                partial(debug.status, self),
                "getDebugStatus",
                "Which debugging aids are on (none until asked for)",
                tag,
                {200: Out("the profiler and tracemalloc, on or off", debug.DebugStatus)},
            ),
            Route(
                "GET",
                "/api/v1/debug/tasks",
                partial(debug.tasks, self),
                "getTaskTree",
                "The trio task tree, with where each task is suspended",
                tag,
                {200: Out("every task, from the root", debug.TaskTree)},
            ),
            Route(
                "GET",
                "/api/v1/debug/threads",
                partial(debug.threads, self),
                "getThreadStacks",
                "Every thread's Python stack",
                tag,
                {200: Out("every thread running Python code", debug.ThreadList)},
            ),
            Route(
                "POST",
                "/api/v1/debug/profile",
                partial(debug.profile, self),
                "takeProfile",
                "Sample the event-loop thread for some seconds (pyinstrument) and answer the "
                "profile",
                tag,
                {
                    200: Out(
                        "the profile, as `format` asks",
                        text,
                        debug.PROFILE_FORMATS["text"],
                        alternatives={
                            debug.PROFILE_FORMATS["speedscope"]: {"type": "object"},
                            debug.PROFILE_FORMATS["html"]: text,
                        },
                    ),
                    **_errors(400),
                    409: Out("a profile is running (one at a time)", ErrorBody),
                    501: Out("the profiler is not installed (llmgw[profiling])", ErrorBody),
                },
                query=debug.profile_query(self.max_profile_seconds),
            ),
            Route(
                "POST",
                "/api/v1/debug/heap",
                partial(debug.heap_start, self),
                "startHeapTracing",
                "Start tracemalloc (when off) and answer the lines holding the most live memory",
                tag,
                {
                    200: Out("the top lines by live size", debug.HeapSummary),
                    **_errors(400),
                    409: Out("tracing was stopped while the summary was made", ErrorBody),
                },
                query=debug.HEAP_QUERY,
            ),
            Route(
                "GET",
                "/api/v1/debug/heap",
                partial(debug.heap, self),
                "getHeap",
                "The lines holding the most live memory, while tracemalloc traces (POST starts it)",
                tag,
                {
                    200: Out("the top lines by live size", debug.HeapSummary),
                    **_errors(400),
                    409: Out(
                        "tracemalloc is not tracing, or was stopped while the summary was made",
                        ErrorBody,
                    ),
                },
                query=debug.HEAP_QUERY,
            ),
            Route(
                "DELETE",
                "/api/v1/debug/heap",
                partial(debug.heap_stop, self),
                "stopHeapTracing",
                "Stop tracemalloc (tracing slows every allocation) and free what it holds",
                tag,
                {200: Out("off", debug.HeapStopped)},
            ),
        ]

    def blueprint(self) -> Blueprint:
        """The API's routes, from the table the OpenAPI document is made of."""
        bp = Blueprint("api", __name__)
        for route in self.routes:
            bp.add_url_rule(
                route.rule,
                endpoint=route.operation_id,
                view_func=route.handler,
                methods=[route.method],
                provide_automatic_options=False,
            )

        @bp.before_request
        async def known_query() -> None:
            route = self._by_endpoint.get(request.endpoint or "")
            if route is not None and route.path.startswith(API_PREFIX):
                check_query({p.name for p in route.query})

        return bp

    @property
    def _by_endpoint(self) -> dict[str, Route]:
        """Routes by the endpoint name the blueprint gives them."""
        return {f"api.{r.operation_id}": r for r in self.routes}

    @functools.cached_property
    def quart(self) -> QuartTrio:
        """The API alone as an application, made from :attr:`routes` when first used
        (what :meth:`call` and tests use; the admin listener serves the API with the
        dashboard beside it, :func:`llmgw.admin.web.build_app`)."""
        return build_app(self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi(self.quart)(scope, receive, send)

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route for a request and its path parameters; 404 when no route has the
        path, 405 when none has it with this method."""
        adapter = self.quart.url_map.bind("admin")
        try:
            endpoint, params = adapter.match(path, method)
        except NotFound:
            raise ApiError(404, f"no route {method} {path}", "not_found") from None
        except MethodNotAllowed:
            raise ApiError(
                405, f"method {method} not allowed on {path}", "method_not_allowed"
            ) from None
        return self._by_endpoint[str(endpoint)], {k: str(v) for k, v in params.items()}

    async def call(
        self, method: str, path: str, *, query: str = "", body: Any = None
    ) -> tuple[int, Any]:
        """One API request made in-process, past the guards and admin auth (the caller
        authenticated its user itself): the status and the decoded JSON answer (None
        without a body). The dashboard reads and changes everything through this, so
        it shows and does exactly what the API does."""
        raw = b"" if body is None else json_bytes(body)
        answered = trio.Event()
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await answered.wait()
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))
                if not message.get("more_body"):
                    answered.set()

        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8"),
            "query_string": query.encode("ascii"),
            "root_path": "",
            "headers": [
                (b"host", b"localhost"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
            "client": None,
            "server": None,
            TRUSTED: True,
        }
        await self(scope, receive, send)
        answer = b"".join(chunks)
        return status, json.loads(answer) if answer else None

    @staticmethod
    def owns(path: str) -> bool:
        """Whether `path` is the API's (the rest of the admin listener is the dashboard's)."""
        return path in ("/metrics", "/healthz", "/readyz") or AdminApp.protected(path)

    @staticmethod
    def protected(path: str) -> bool:
        return path.startswith(API_PREFIX) or path.rstrip("/") == API_PREFIX.rstrip("/")

    async def authorize(self) -> None:
        """401 without a usable key's secret, 403 when the key is not an admin key."""
        assert self.store is not None  # the constructor insists
        challenge = {"www-authenticate": 'Bearer realm="llmgw-admin"'}
        value = request.headers.get("authorization")
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
                headers={"www-authenticate": 'Bearer realm="llmgw-admin", error="invalid_token"'},
            )
        if not record.admin:
            raise ApiError(
                403, f"key {record.id} ({record.name}) is not an admin key", "not_admin_key"
            )

    # -- this API's document --------------------------------------------------------------

    async def openapi(self) -> Response:
        if self._openapi is None:
            self._openapi = json_bytes(self.openapi_document())
        return Response(self._openapi, 200, content_type="application/json")

    def openapi_document(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document of this app, as configured (auth, bands)."""
        return openapi.document(self)
