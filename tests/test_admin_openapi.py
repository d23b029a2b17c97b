"""The admin API's OpenAPI document: valid OpenAPI 3.1, complete, generated from the
view classes, and true to what the handlers accept and answer (schemathesis drives
a real server with generated requests and checks every answer against it).

The fuzzing server is llmgw.http.server on trio in a background thread, on a loopback port,
over a real SQLite store, a router with static endpoints and a control plane
(`tests.test_fleet_metrics.scenario`), with admin auth on.
"""

from __future__ import annotations

import collections
import socket
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import hypothesis
import hypothesis.errors
import jsonschema_rs
import pytest
import schemathesis
import trio
from schemathesis.specs.openapi.checks import positive_data_acceptance

from llmgw.admin import keys
from llmgw.admin.api import AdminApp
from llmgw.admin.usage import UsageReport
from llmgw.catalog.live import ModelRegistry
from llmgw.config import EndpointConfig, ModelConfig, load
from llmgw.control import views
from llmgw.domain.engine_metrics import EngineSample
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.endpoint_sources import EndpointSources
from llmgw.http.server import HttpServerConfig, serve_listeners
from llmgw.router.core import Router
from llmgw.store import open_store
from tests.test_fleet_metrics import MODELS, scenario

CONFIG: dict[str, Any] = {
    "endpoints": [{"id": "e1", "url": "http://127.0.0.1:9", "models": ["base"]}],
    "models": [{"name": "base", "aliases": ["base-alias"]}],
}
MAX_EXAMPLES = 25
SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,  # the same requests every run
    database=None,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def admin_app(*, admin_auth: bool) -> AdminApp:
    config = load(data=CONFIG, environ={})
    store: Any = object() if admin_auth else None  # the document never touches the store
    return AdminApp(Router(config), store=store, admin_auth=admin_auth)


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


# -- the document ----------------------------------------------------------------------


@pytest.mark.parametrize("admin_auth", [False, True])
async def test_the_document_is_valid_openapi_3_1(admin_auth: bool) -> None:
    # The OpenAPI Initiative's 3.1 schema, as schemathesis ships it.
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    doc = admin_app(admin_auth=admin_auth).openapi_document()
    assert doc["openapi"] == "3.1.0"
    errors = [str(e) for e in OPENAPI_31_VALIDATOR.iter_errors(doc)]
    assert not errors
    # Every schema is a valid JSON Schema (2020-12, the dialect of OpenAPI 3.1).
    schemas = doc["components"]["schemas"]
    for name, schema in schemas.items():
        jsonschema_rs.meta.validate(schema)
        assert schema, name
    for path in doc["paths"].values():
        for operation in path.values():
            for response in operation["responses"].values():
                for media in response.get("content", {}).values():
                    jsonschema_rs.meta.validate(media["schema"])
    # Every reference resolves; operation ids are unique.
    for ref in set(refs(doc)):
        assert ref.startswith("#/components/schemas/")
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    # Schemathesis reads every operation.
    loaded = schemathesis.openapi.from_dict(doc)
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert len(operations) == len(ids)


async def test_the_document_lists_every_route_and_only_those() -> None:
    app = admin_app(admin_auth=False)
    doc = app.openapi_document()
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    assert documented == {(r.path, r.method) for r in app.routes}
    assert {
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/openapi.json",
        "/api/v1/endpoints",
        "/api/v1/endpoints/{id}",
        "/api/v1/admission",
        "/api/v1/nodes",
        "/api/v1/nodes/{id}",
        "/api/v1/nodes/{id}/drain",
        "/api/v1/nodes/{id}/cordon",
        "/api/v1/nodes/{id}/uncordon",
        "/api/v1/replicas",
        "/api/v1/placement",
        "/api/v1/keys",
        "/api/v1/keys/{id}",
        "/api/v1/usage",
        "/api/v1/models",
        "/api/v1/models/{name}",
        "/api/v1/debug",
        "/api/v1/debug/tasks",
        "/api/v1/debug/threads",
        "/api/v1/debug/profile",
        "/api/v1/debug/heap",
    } == set(doc["paths"])
    for path, ops in doc["paths"].items():
        for operation in ops.values():
            params = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert params == {s[1:-1] for s in path.split("/") if s.startswith("{")}
            # Every error an operation documents has the one error shape.
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/readyz":
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}


async def test_schemas_are_generated_from_the_view_classes() -> None:
    doc = admin_app(admin_auth=False).openapi_document()
    schemas = doc["components"]["schemas"]
    for cls in (keys.KeyView, keys.NewKeyView, UsageReport, views.NodeDetail, views.ReplicaView):
        schema = schemas[cls.__name__]
        names = [f.name for f in attrs.fields(cls)]
        assert list(schema["properties"]) == names
        assert schema["required"] == names  # views always write every field
        assert schema["additionalProperties"] is False
    # Request bodies: only fields without a default are required, unknown keys refused.
    key_input = schemas["KeyCreateInput"]
    assert key_input["required"] == ["name"]
    assert key_input["properties"]["band"]["enum"] == ["platinum", "gold", "silver", "bronze", None]
    model_input = schemas["ModelConfigInput"]
    assert model_input["required"] == ["name"]
    profile = schemas["DeploymentProfileInput"]
    assert profile["required"] == ["name", "engine", "weights"]
    assert profile["properties"]["engine"]["enum"] == ["vllm", "sglang", "sim", "llamacpp"]
    # Sizes as the configuration writes them, and also as numbers on input.
    assert schemas["DeploymentProfile"]["properties"]["min_gpu_memory"]["type"] == [
        "string",
        "null",
    ]
    assert {"type": "integer", "minimum": 0} in profile["properties"]["min_gpu_memory"]["anyOf"]
    assert "required" not in schemas["ModelPatch"]
    # Enums: their values.
    node_state = schemas["NodeDetail"]["properties"]["state"]
    assert node_state == {"type": "string", "enum": ["ready", "unreachable", "lost"]}


# -- schemathesis against a real server --------------------------------------------------


@attrs.define
class Server:
    url: str
    auth: dict[str, str]
    known: dict[str, dict[str, str]]
    # (method, path template, generation mode) -> responses by status (the fuzz test).
    seen: dict[tuple[str, str, str], collections.Counter[int]] = attrs.field(factory=dict)


async def _serve_admin(
    db: Path, sock: socket.socket, info: dict[str, Any], started: threading.Event
) -> None:
    config = load(data=CONFIG, environ={})
    store = await open_store(f"sqlite:///{db}")
    try:
        s = scenario()
        s.controller.reconcile()
        router = Router(config)
        state = router.endpoints.get("e1")
        assert state is not None
        state.sample = EngineSample("vllm", waiting=0.0, running=1.0, kv_usage=0.25)
        state.last_scrape = trio.current_time()
        registry = ModelRegistry([*config.models, *MODELS], config.router.profiles, store=store)
        await registry.load()
        _, secret = await store.create_key("fuzz-admin", admin=True)
        user, _ = await store.create_key("fuzz-user", band="silver", models=("base",))
        await registry.put(ModelConfig("rt", fallbacks=("base",), replicas=0), create=True)
        sources = EndpointSources(config.endpoints, router, router.endpoints, store=store)
        await sources.add(EndpointConfig("rt-e", "http://127.0.0.1:9", ("rt",)))
        await store.record_usage(
            [
                (1_700_000_000.0 + i * 600, UsageRecord("base", "e1", 200, Usage(10, i), 0.5))
                for i in range(6)
            ]
        )
        # Profiles of a second at most: the fuzzing sends many.
        app = AdminApp(
            router,
            controller=s.controller,
            store=store,
            models=registry,
            endpoint_sources=sources,
            admin_auth=True,
            max_profile_seconds=1,
        )
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        stop = trio.Event()
        token = trio.lowlevel.current_trio_token()
        info.update(secret=secret, user_id=user.id, stop=stop, token=token)
        started.set()  # the socket already listens: early connections wait in its backlog
        await serve_listeners(app, [listener], HttpServerConfig(), shutdown_trigger=stop.wait)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


@pytest.fixture(scope="module")
def admin_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    db = tmp_path_factory.mktemp("admin-fuzz") / "llmgw.db"
    info: dict[str, Any] = {}
    started = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            trio.run(_serve_admin, db, sock, info, started)
        except BaseException as exc:  # reported by the fixture
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=run, name="admin-fuzz-server", daemon=True)
    thread.start()
    assert started.wait(30), "the admin server did not start"
    assert not failure, failure
    server = Server(
        f"http://127.0.0.1:{port}",
        {"Authorization": f"Bearer {info['secret']}"},
        # Path values that exist, for a third pass (random ones are almost always 404).
        {
            "/api/v1/nodes/{id}": {"id": "gpu-2"},
            "/api/v1/nodes/{id}/drain": {"id": "gpu-2"},
            "/api/v1/nodes/{id}/cordon": {"id": "gpu-2"},
            "/api/v1/nodes/{id}/uncordon": {"id": "gpu-2"},
            "/api/v1/keys/{id}": {"id": info["user_id"]},
            "/api/v1/models/{name}": {"name": "rt"},
            "/api/v1/endpoints/{id}": {"id": "rt-e"},
        },
    )
    yield server
    trio.from_thread.run_sync(info["stop"].set, trio_token=info["token"])
    thread.join(30)
    tracemalloc.stop()  # POST /api/v1/debug/heap started it in this process
    assert not failure, failure
    _report(request.config, server)


def _report(config: pytest.Config, server: Server) -> None:
    """What the fuzzing sent, per operation and status (shown in the test summary)."""
    if not server.seen:
        return
    total = sum(sum(c.values()) for c in server.seen.values())
    operations = {(method, path) for method, path, _ in server.seen}
    lines = [f"schemathesis: {len(operations)} operations, {total} requests"]
    for (method, path, mode), statuses in sorted(server.seen.items(), key=lambda kv: kv[0][1]):
        counts = ", ".join(f"{s}x{n}" for s, n in sorted(statuses.items()))
        lines.append(f"  {method:6} {path} ({mode}): {counts}")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        for line in lines:
            reporter.write_line(line)


@pytest.fixture(scope="module")
def admin_schema(admin_server: Server) -> Any:
    return schemathesis.openapi.from_url(
        f"{admin_server.url}/api/v1/openapi.json", headers=admin_server.auth
    )


def _fuzzer(strategy: Any, label: str, server: Server) -> Any:
    """A Hypothesis test sending `strategy`'s cases to `server` and checking the answers."""

    @SETTINGS
    @hypothesis.given(case=strategy)
    def run(case: Any) -> None:
        response = case.call(headers=server.auth)
        key = (case.method.upper(), case.path, label)
        server.seen.setdefault(key, collections.Counter())[response.status_code] += 1
        case.validate_response(
            response, excluded_checks=[positive_data_acceptance], headers=server.auth
        )

    return run


def test_schemathesis_finds_no_server_error_or_schema_violation(
    admin_server: Server, admin_schema: Any
) -> None:
    """Positive and negative requests for every operation (at most MAX_EXAMPLES of each,
    derandomized): no 5xx, every status documented, every body and content type as
    documented, negative data refused, auth enforced.

    `positive_data_acceptance` is left out: schema-valid requests that the catalog's
    rules refuse (a fallback naming no model, a key for a model that does not exist,
    a bucket under a second) are right to answer 400, and a JSON Schema cannot say so.
    """
    failures: list[str] = []
    operations = [result.ok() for result in admin_schema.get_all_operations()]
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    for operation in operations:
        passes = [("positive", positive, None), ("negative", negative, None)]
        if operation.path in admin_server.known:
            passes.append(("known", positive, admin_server.known[operation.path]))
        for label, mode, path_parameters in passes:
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
            run = _fuzzer(strategy, label, admin_server)
            try:
                run()
            except hypothesis.errors.Unsatisfiable:
                assert mode is negative  # nothing to negate: an operation without inputs
            except Exception as exc:  # every operation is tried; all failures are shown
                failures.append(f"{operation.label} ({label}): {exc}")
    assert len(operations) == 31  # POST, GET and DELETE of debug/heap among them
    assert not failures, "\n\n".join(failures)
    # The fuzzing got through auth to every operation, and some requests succeeded.
    for operation in operations:
        statuses = admin_server.seen[(operation.method.upper(), operation.path, "positive")]
        assert set(statuses) - {401, 403}, (operation.label, statuses)
