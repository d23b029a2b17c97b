"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 document of the admin API.

Generated from the app's route table (:attr:`llmgw.admin.api.AdminApp.routes`): every
route with its path and query parameters, request body and responses, and the
schemas of those from the attrs classes the handlers parse and answer with
(:class:`llmgw.admin.schema.SchemaBuilder`). It describes the app as configured:
the admission bands a key may name, the routing profiles a model may use, and,
with admin auth on, the bearer scheme and the 401/403 answers.

Answers every route of the API may give are added here once rather than per route:
400 for an unknown or repeated query parameter (``/api/v1/`` routes), 400 and 413
for a malformed or oversized body (routes that take one), 401, 403 and 503 (the
key lookup) with admin auth, 503 for routes that use the store. 405 (with
``allow``) answers methods a path does not take; 500 is never intended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmgw.admin.contract import API_PREFIX, ErrorBody, Out, Route
from llmgw.admin.keys import KeyCreate
from llmgw.admin.models_api import ModelLive
from llmgw.admin.schema import SchemaBuilder
from llmgw.catalog.rules import MAX_REPLICAS
from llmgw.domain.catalog import AutoscaleConfig, DeploymentProfile, ModelConfig
from llmgw.domain.engines import ENGINES
from llmgw.version import __version__

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = ["OPENAPI_VERSION", "document"]

OPENAPI_VERSION = "3.1.0"

TAGS = [
    ("health", "liveness, readiness and Prometheus metrics (never behind admin auth)"),
    ("meta", "this document"),
    ("routing", "the router's endpoints and admission queues"),
    ("fleet", "the control plane: nodes, replicas, placement (404 in router-only mode)"),
    ("models", "the live model catalog and runtime changes to it"),
    ("keys", "API keys"),
    ("usage", "usage records summarised per key or model"),
    ("debug", "the task tree, thread stacks, CPU profiles and a heap summary (docs/debugging.md)"),
]

DESCRIPTION = """\
The admin API of llmgw-server (the admin listener). Errors are always
`{"error": {"message", "type", "param", "code"}}`; `param` names the query parameter or
request key at fault when one is. Request bodies are JSON objects of at most 1 MiB.
Times are Unix seconds. Keys, usage and runtime model changes need a store
(`store.url`): without one they answer 409 saying so.
"""


def _overrides(app: AdminContext) -> dict[tuple[Any, ...], dict[str, Any]]:
    bands = [b.name for b in app.router.config.router.admission.bands]
    profiles = sorted(app.router.config.router.profiles)
    return {
        (KeyCreate, "band"): {"enum": [*bands, None]},
        (ModelConfig, "name"): {"minLength": 1},
        (ModelConfig, "replicas"): {"minimum": 0},
        (ModelConfig, "replicas", "input"): {"maximum": MAX_REPLICAS},
        (ModelConfig, "routing_profile", "input"): {"enum": [*profiles, None]},
        (AutoscaleConfig, "min_replicas"): {"minimum": 0},
        (AutoscaleConfig, "min_replicas", "input"): {"maximum": MAX_REPLICAS},
        (AutoscaleConfig, "max_replicas"): {"minimum": 1},
        (AutoscaleConfig, "max_replicas", "input"): {"maximum": MAX_REPLICAS},
        (AutoscaleConfig, "target_saturation"): {"exclusiveMinimum": 0, "maximum": 1},
        (DeploymentProfile, "name"): {"minLength": 1},
        (DeploymentProfile, "weights"): {"minLength": 1},
        (DeploymentProfile, "engine"): {"enum": list(ENGINES)},
        (DeploymentProfile, "tensor_parallel"): {"minimum": 1},
        (DeploymentProfile, "pipeline_parallel"): {"minimum": 1},
        (DeploymentProfile, "gpus_per_node"): {"minimum": 1},
    }


def _model_schemas(builder: SchemaBuilder) -> None:
    """Model, ModelList and ModelPatch: a catalog entry (the configuration's shape)
    merged with what the API adds (ModelLive)."""
    entry = builder.object_schema(ModelConfig, "output", "config")
    live = builder.object_schema(ModelLive, "output", "view")
    builder.add(
        "Model",
        {
            "type": "object",
            "description": "A catalog entry, as the configuration writes it, with its live status.",
            "properties": {**entry["properties"], **live["properties"]},
            "required": [*entry["required"], *live["required"]],
            "additionalProperties": False,
        },
    )
    builder.add(
        "ModelList",
        {
            "type": "object",
            "properties": {
                "models": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}
            },
            "required": ["models"],
            "additionalProperties": False,
        },
    )
    given = builder.object_schema(ModelConfig, "input", "config")
    patch = {k: v for k, v in given.items() if k != "required"}
    patch["description"] = (
        "Any keys of a catalog entry; each replaces the model's (a list replaces the whole "
        "list). `name`, if given, must be the model's own."
    )
    patch["properties"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "default"}
        for k, v in given["properties"].items()
    }
    builder.add("ModelPatch", patch)


def _schema(builder: SchemaBuilder, schema: Any, mode: str, style: str) -> dict[str, Any]:
    if isinstance(schema, str):
        return {"$ref": f"#/components/schemas/{schema}"}
    if isinstance(schema, type):
        return builder.ref(schema, mode, style)  # type: ignore[arg-type]
    return dict(schema)


def _response(builder: SchemaBuilder, out: Out) -> dict[str, Any]:
    response: dict[str, Any] = {"description": out.description}
    if out.schema is not None:
        response["content"] = {
            media: {"schema": _schema(builder, schema, "output", "view")}
            for media, schema in {out.media_type: out.schema, **out.alternatives}.items()
        }
    if out.headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in out.headers.items()
        }
    return response


def _error(description: str) -> Out:
    return Out(description, ErrorBody)


def _responses(app: AdminContext, route: Route) -> dict[int, Out]:
    responses = dict(route.responses)
    extra: dict[int, str] = {}
    if route.path.startswith(API_PREFIX):
        extra[400] = "an unknown or repeated query parameter"
        if app.admin_auth:
            extra[401] = "no admin key, or not a usable one (unknown, revoked, expired)"
            extra[403] = "the key is not an admin key"
            extra[503] = "the store cannot be reached to check the key"
    if route.body is not None:
        extra[400] = "a malformed body or a bad value: the message names the key"
        extra[413] = "the body is larger than 1 MiB"
        extra[408] = "the body did not arrive within router.timeouts.client_body"
        extra[415] = "the body is not sent as application/json"
    if route.method not in ("GET", "HEAD", "OPTIONS"):
        cross = "the browser says the request comes from another site"
        extra[403] = f"{extra[403]}, or {cross}" if 403 in extra else cross
    if route.uses_store:
        extra[503] = "the store cannot be reached"
    for status, text in extra.items():
        if status not in responses:
            responses[status] = _error(text)
    return dict(sorted(responses.items()))


def _operation(app: AdminContext, builder: SchemaBuilder, route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
    }
    if route.description:
        op["description"] = route.description
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1},
        }
        for name in route.path_params
    ]
    parameters += [
        {
            "name": p.name,
            "in": "query",
            "required": p.required,
            "description": p.description,
            "schema": dict(p.schema),
        }
        for p in route.query
    ]
    if parameters:
        op["parameters"] = parameters
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "description": route.body.description,
            "content": {
                "application/json": {
                    "schema": _schema(builder, route.body.schema, "input", route.body.style)
                }
            },
        }
    op["responses"] = {
        str(status): _response(builder, out) for status, out in _responses(app, route).items()
    }
    if app.admin_auth and route.path.startswith(API_PREFIX):
        op["security"] = [{"adminKey": []}]
    return op


def document(app: AdminContext) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s routes."""
    builder = SchemaBuilder(_overrides(app))
    builder.ref(ErrorBody)
    _model_schemas(builder)
    paths: dict[str, dict[str, Any]] = {}
    for route in app.routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(app, builder, route)
    components: dict[str, Any] = {"schemas": dict(sorted(builder.components.items()))}
    if app.admin_auth:
        components["securitySchemes"] = {
            "adminKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "the secret of an API key created with admin: true",
            }
        }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "llmgw admin API",
            "version": __version__,
            "description": DESCRIPTION,
        },
        "tags": [{"name": name, "description": text} for name, text in TAGS],
        "paths": paths,
        "components": components,
    }
