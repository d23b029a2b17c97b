"""Health and routing: ``/metrics``, ``/healthz``, ``/readyz`` and the router's live
views ``/api/v1/endpoints`` and ``/api/v1/admission``.

`/metrics` renders inside the request, on the trio thread, so collectors read
trio-owned state without locks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response

from llmgw.admin.contract import json_reply
from llmgw.admin.views import (
    AdmissionView,
    EndpointList,
    HealthView,
    ReadyView,
    from_dict,
    unstructure,
)

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext


async def metrics(app: AdminContext) -> Response:
    body = await app.traffic.metrics_text()
    return Response(body, 200, content_type=CONTENT_TYPE_LATEST)


async def healthz(app: AdminContext) -> Response:
    return json_reply(200, unstructure(HealthView("ok")))


async def readyz(app: AdminContext) -> Response:
    """Ready when the gateway can accept and hold requests (llmgw.router.readiness: an
    engine scraped, or a model that starts on request) and its instance has settled."""
    scraped = sum(1 for s in app.router.endpoints.all() if s.sample is not None)
    ok = app.ready() and app.router.readiness.gateway()
    view = ReadyView("ready" if ok else "not ready", scraped)
    return json_reply(200 if ok else 503, unstructure(view))


def endpoint_views(app: AdminContext) -> list[dict[str, Any]]:
    """Every endpoint's live view, with where it comes from."""
    sources = app.endpoint_sources
    views = app.router.endpoint_views()
    for view in views:
        found = sources.source_of(view["id"]) if sources is not None else None
        if found is None and sources is None:
            configured = {e.id for e in app.router.config.endpoints}
            found = "config" if view["id"] in configured else None
        view["source"] = found or "control_plane"
    return views


async def endpoints(app: AdminContext) -> Response:
    view = from_dict({"endpoints": endpoint_views(app)}, EndpointList)
    return json_reply(200, unstructure(view))


async def admission(app: AdminContext) -> Response:
    """Live queues per pool and band, and each pool's saturation."""
    view = from_dict(app.traffic.admission_view(), AdmissionView)
    return json_reply(200, unstructure(view))
