"""``/api/v1/endpoints``: endpoints added and removed at runtime.

A body is an ``[[endpoints]]`` table as the configuration file writes it (``id``,
``url``, ``models``, and the optional keys), structured and checked by the
configuration's own path (llmgw.endpoint_sources.parse_endpoint). The change goes
through :class:`llmgw.endpoint_sources.EndpointSources`: stored, then live. An id any
source has is refused (409), as is removing an endpoint the configuration file or the
discovery file gives (409: edit that file), and any change without a store (409).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from quart import Response

from llmgw.admin.contract import ApiError, json_reply
from llmgw.admin.health import endpoint_views
from llmgw.admin.inputs import json_object
from llmgw.admin.views import EndpointView, from_dict, unstructure
from llmgw.config import ConfigError
from llmgw.endpoint_sources import EndpointChangeError, parse_endpoint

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext
    from llmgw.endpoint_sources import EndpointSources

NO_SOURCES = "this admin API has no endpoint sources to change (the server did not wire them)"


def _sources(app: AdminContext) -> EndpointSources:
    if app.endpoint_sources is None:
        raise ApiError(409, NO_SOURCES, "no_store")
    return app.endpoint_sources


def _change_error(exc: EndpointChangeError) -> ApiError:
    return ApiError(exc.status, str(exc), exc.code, param=exc.param)


async def create_endpoint(app: AdminContext) -> Response:
    sources = _sources(app)
    body = await json_object()
    try:
        endpoint = parse_endpoint(body)
    except ConfigError as exc:
        first = exc.problems[0]
        param = first.split(":", 1)[0] if ": " in first else None
        raise ApiError(400, "; ".join(exc.problems), "invalid_endpoint", param=param) from None
    try:
        await sources.add(endpoint)
    except EndpointChangeError as exc:
        raise _change_error(exc) from None
    view = next(v for v in endpoint_views(app) if v["id"] == endpoint.id)
    return json_reply(
        201,
        unstructure(from_dict(view, EndpointView)),
        headers={"location": f"/api/v1/endpoints/{quote(endpoint.id, safe='')}"},
    )


async def delete_endpoint(app: AdminContext, id: str) -> Response:
    sources = _sources(app)
    try:
        await sources.remove(id)
    except EndpointChangeError as exc:
        raise _change_error(exc) from None
    return Response("", 204)
