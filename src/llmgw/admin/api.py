"""The admin listener's routes: `/metrics`, `/healthz`, `/readyz` and `/api/v1/...`.

`/metrics` renders inside the request, on the trio thread, so collectors read
trio-owned state without locks.

Routes are matched exactly, then against templates whose ``{name}`` segments match
one path segment each (``/api/v1/nodes/{id}``); the values are passed to the handler
in ``scope["path_params"]``. The control-plane routes (nodes, replicas, placement)
answer 404 with a clear message when the server runs in router-only mode.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw.asgi import Receive, Scope, Send, lifespan, send_json
from llmgw.control import views
from llmgw.router.core import Router

if TYPE_CHECKING:
    from llmgw.control.controller import Controller

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTER_ONLY = "no control plane: this server runs in router-only mode"


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _error(message: str, code: str, type_: str = "not_found_error") -> bytes:
    """An OpenAI-shaped error body."""
    return _json({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/"))


def _match(template: tuple[str, ...], path: tuple[str, ...]) -> dict[str, str] | None:
    """The ``{name}`` values if `path` fits `template` segment by segment."""
    if len(template) != len(path):
        return None
    params: dict[str, str] = {}
    for want, got in zip(template, path, strict=True):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


class AdminApp:
    """The admin ASGI app. `controller` is None in router-only mode."""

    def __init__(
        self,
        router: Router,
        *,
        controller: Controller | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.router = router
        self.controller = controller
        self.ready = ready
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/metrics"): self.metrics,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/api/v1/endpoints"): self.endpoints,
            ("GET", "/api/v1/admission"): self.admission,
            ("GET", "/api/v1/nodes"): self.nodes,
            ("GET", "/api/v1/replicas"): self.replicas,
            ("GET", "/api/v1/placement"): self.placement,
        }
        # Tried in order after the exact routes.
        self.templates: list[tuple[str, tuple[str, ...], Handler]] = [
            ("GET", _segments("/api/v1/nodes/{id}"), self.node),
            ("POST", _segments("/api/v1/nodes/{id}/drain"), self.drain_node),
        ]

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
        """The handler for a request and its path parameters, if any route fits."""
        handler = self.routes.get((method, path.rstrip("/") or "/"))
        if handler is not None:
            return handler, {}
        segments = _segments(path)
        for want, template, candidate in self.templates:
            if want == method and (params := _match(template, segments)) is not None:
                return candidate, params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        found = self.resolve(scope["method"], scope["path"])
        if found is None:
            message = f"no route {scope['method']} {scope['path']}"
            await send_json(send, 404, _error(message, "not_found"))
            return
        handler, params = found
        scope["path_params"] = params
        await handler(scope, receive, send)

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = generate_latest(self.router.metrics.registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE_LATEST.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, _json({"status": "ok"}))

    async def readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Ready when the router can serve: at least one endpoint has been scraped."""
        serving = [s for s in self.router.endpoints.all() if s.sample is not None]
        ok = self.ready() and bool(serving)
        body = {"status": "ready" if ok else "not ready", "endpoints_scraped": len(serving)}
        await send_json(send, 200 if ok else 503, _json(body))

    async def endpoints(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, _json({"endpoints": self.router.endpoint_views()}))

    async def admission(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Live queues per pool and band, and each pool's saturation."""
        await send_json(send, 200, _json(self.router.admission_view()))

    # -- the control plane ------------------------------------------------------------

    async def _router_only(self, send: Send) -> None:
        await send_json(send, 404, _error(ROUTER_ONLY, "no_control_plane"))

    async def nodes(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every node with its GPUs, engines and shards."""
        if self.controller is None:
            await self._router_only(send)
            return
        await send_json(send, 200, _json(views.nodes_json(self.controller)))

    async def node(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One node, by id."""
        if self.controller is None:
            await self._router_only(send)
            return
        node_id = scope["path_params"]["id"]
        body = views.node_json(self.controller, node_id)
        if body is None:
            await send_json(send, 404, _error(f"no node {node_id!r}", "node_not_found"))
            return
        await send_json(send, 200, _json(body))

    async def replicas(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every replica, and per model desired against actual counts."""
        if self.controller is None:
            await self._router_only(send)
            return
        await send_json(send, 200, _json(views.replicas_json(self.controller)))

    async def placement(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Why replicas of each model that misses some could not be placed."""
        if self.controller is None:
            await self._router_only(send)
            return
        await send_json(send, 200, _json(views.placement_json(self.controller)))

    async def drain_node(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Cordon the node and move its replicas elsewhere, make before break."""
        if self.controller is None:
            await self._router_only(send)
            return
        node_id = scope["path_params"]["id"]
        if self.controller.inventory.get(node_id) is None:
            await send_json(send, 404, _error(f"no node {node_id!r}", "node_not_found"))
            return
        self.controller.drain_node(node_id)
        body = views.node_json(self.controller, node_id)
        await send_json(send, 202, _json(body))
