"""The admin listener's routes: `/metrics`, `/healthz`, `/readyz` and `/api/v1/...`.

`/metrics` renders inside the request, on the trio thread, so collectors read
trio-owned state without locks.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw.asgi import Receive, Scope, Send, lifespan, send_json
from llmgw.router.core import Router

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


class AdminApp:
    def __init__(self, router: Router, *, ready: Callable[[], bool] = lambda: True) -> None:
        self.router = router
        self.ready = ready
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/metrics"): self.metrics,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/api/v1/endpoints"): self.endpoints,
            ("GET", "/api/v1/admission"): self.admission,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        handler = self.routes.get((scope["method"], scope["path"].rstrip("/") or "/"))
        if handler is None:
            message = f"no route {scope['method']} {scope['path']}"
            await send_json(send, 404, _json({"error": {"message": message, "code": "not_found"}}))
            return
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
