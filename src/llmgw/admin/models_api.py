"""``/api/v1/models``: the live catalog, and models added, changed and removed at runtime.

A model is its catalog entry in the configuration's own shape (``name, aliases,
fallbacks, routing_profile, replicas, profiles``; sizes as strings such as
``"80GB"``) plus where it comes from (`source`: the configuration file, the admin
API at runtime, or only an endpoint that serves it), its replicas when a control
plane runs (`status`: desired against starting, ready, draining, unplaced), and
who serves it now (`routing`: the endpoints taking its requests, and how many of
them their breakers let requests through to).

Changes go through :class:`llmgw.catalog.live.ModelRegistry`: validated against the whole
catalog by the catalog's rules, persisted in the store, then swapped in. Without a
store they are refused (409), as are changes to models the configuration file
defines (409: edit the file) and, in router-only mode (no control plane), models with
deployment profiles (409 ``no_control_plane``: nothing would ever start them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import attrs
import trio
from quart import Response

from llmgw.admin.contract import ApiError, json_reply
from llmgw.admin.inputs import json_object
from llmgw.admin.views import unstructure
from llmgw.catalog.live import ModelChangeError, parse_model
from llmgw.catalog.rules import replica_bound
from llmgw.config import JSON_WORDING, ConfigError, hide_profile_keys, shape_problems
from llmgw.control import views
from llmgw.domain.catalog import ModelConfig
from llmgw.store.base import model_to_dict

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext
    from llmgw.catalog.live import ModelRegistry

__all__ = ["ModelLive", "RoutingView"]

NO_STORE = (
    "no store is configured (store.url), so a model added now would vanish on restart; "
    "configure a store or add the model to the configuration file"
)
NO_REGISTRY = "this admin API has no live model catalog to change (the server did not wire one)"

_CODES = {400: "invalid_model", 404: "model_not_found", 409: "model_conflict"}


@attrs.frozen
class RoutingView:
    """Who serves the model now."""

    endpoints: tuple[str, ...] = attrs.field(
        metadata={"description": "ids of the endpoints that take new requests for it"}
    )
    available: int = attrs.field(
        metadata={"description": "how many of them their breakers let requests through to now"}
    )
    waiting: int = attrs.field(
        default=0,
        metadata={
            "description": "requests waiting for a replica to start (an autoscaled model "
            "woken from zero)"
        },
    )


@attrs.frozen
class ModelLive:
    """What the admin API adds to a catalog entry."""

    source: Literal["config", "runtime", "endpoints"] = attrs.field(
        metadata={
            "description": "the configuration file, the admin API (stored), or only an "
            "endpoint that names it (router-only mode)"
        }
    )
    status: views.ModelCounts | None = attrs.field(
        metadata={"description": "its replicas; null without a control plane or profiles"}
    )
    routing: RoutingView


def _source(app: AdminContext, model: ModelConfig) -> Literal["config", "runtime", "endpoints"]:
    registry = app.models
    if registry is not None:
        if model.name in registry.runtime:
            return "runtime"
        return "config" if model.name in registry.configured else "endpoints"
    configured = {m.name for m in app.router.config.models}
    return "config" if model.name in configured else "endpoints"


def model_json(app: AdminContext, model: ModelConfig, counts: dict[str, views.ModelCounts]) -> Any:
    data: dict[str, Any] = (
        app.models.describe(model) if app.models is not None else model_to_dict(model)
    )
    hide_profile_keys([data])  # the engines' keys are the operator's, not the API's
    now = trio.current_time()
    serving = app.router.endpoints.serving(model.name)
    live = ModelLive(
        source=_source(app, model),
        status=counts.get(model.name),
        routing=RoutingView(
            endpoints=tuple(s.endpoint.id for s in serving),
            available=sum(1 for s in serving if s.breaker.allows(now)),
            waiting=app.traffic.cold_waiting(model.name),
        ),
    )
    data.update(unstructure(live))
    return data


def _counts(app: AdminContext) -> dict[str, views.ModelCounts]:
    controller = app.controller
    if controller is None:
        return {}
    return {c.model: c for c in views.model_counts(controller, controller.clock())}


def _registry(app: AdminContext) -> ModelRegistry:
    """The registry, for a change: 409 when changes could not be kept."""
    if app.models is None:
        raise ApiError(409, NO_STORE if app.store is None else NO_REGISTRY, "no_store")
    if app.models.store is None:
        raise ApiError(409, NO_STORE, "no_store", param="store.url")
    return app.models


def _change_error(exc: ModelChangeError) -> ApiError:
    problems = exc.problems or (str(exc),)
    first = problems[0]
    param = first.split(":", 1)[0] if exc.status == 400 and ": " in first else None
    message = "; ".join(problems) if exc.problems else str(exc)
    code = exc.code or _CODES.get(exc.status, "model_error")
    return ApiError(exc.status, message, code, param=param)


def _invalid(problems: tuple[str, ...] | list[str]) -> ApiError:
    param = problems[0].split(":", 1)[0]
    return ApiError(400, "; ".join(problems), "invalid_model", param=param)


def _check_replicas(body: dict[str, Any]) -> None:
    autoscale = body.get("autoscale")
    counts = [("replicas", body.get("replicas"))]
    if isinstance(autoscale, dict):
        counts += [(f"autoscale.{k}", autoscale.get(k)) for k in ("min_replicas", "max_replicas")]
    # The catalog's bound, asked here before the registry's catalog check so that the
    # keys are the body's own (the catalog's check names them `models[i].`).
    for key, n in counts:
        if isinstance(n, int) and not isinstance(n, bool) and (problems := replica_bound(key, n)):
            raise _invalid(problems)


def _parse(body: dict[str, Any]) -> ModelConfig:
    try:
        model = parse_model(body)
    except ConfigError as exc:
        raise _invalid(exc.problems) from None
    _check_replicas(body)
    return model


def _location(name: str) -> dict[str, str]:
    return {"location": f"/api/v1/models/{quote(name, safe='')}"}


async def list_models(app: AdminContext) -> Response:
    counts = _counts(app)
    models = [model_json(app, m, counts) for m in app.catalog().models]
    return json_reply(200, {"models": models})


async def get_model(app: AdminContext, name: str) -> Response:
    model = app.catalog().resolve(name)
    if model is None:
        raise ApiError(404, f"no model named {name!r}", "model_not_found", param="name")
    return json_reply(200, model_json(app, model, _counts(app)))


async def create_model(app: AdminContext) -> Response:
    registry = _registry(app)
    model = _parse(await json_object())
    try:
        await registry.put(model, create=True, control_plane=app.controller is not None)
    except ModelChangeError as exc:
        raise _change_error(exc) from None
    return json_reply(201, model_json(app, model, _counts(app)), headers=_location(model.name))


async def patch_model(app: AdminContext, name: str) -> Response:
    registry = _registry(app)
    changes = await json_object()
    # Only some keys: structured once merged over the model (ModelRegistry.patch), their
    # shapes checked here so that a malformed body is a 400 before any 404 or 409.
    problems = shape_problems(changes, ModelConfig, wording=JSON_WORDING)
    if problems:
        raise _invalid(problems)
    _check_replicas(changes)
    try:
        model = await registry.patch(name, changes, control_plane=app.controller is not None)
    except ModelChangeError as exc:
        raise _change_error(exc) from None
    return json_reply(200, model_json(app, model, _counts(app)))


async def delete_model(app: AdminContext, name: str) -> Response:
    registry = _registry(app)
    try:
        await registry.delete(name)
    except ModelChangeError as exc:
        raise _change_error(exc) from None
    return Response("", 204)
