"""The admin JSON API (`/api/v1/keys`, `usage`, `models`, admin auth, the request
plumbing), driven through the ASGI app in-process with a real SQLite store.

Every response in these tests is checked against the app's own OpenAPI document:
its status must be documented for the operation, and its body must match the
documented schema (`Admin.check`, an httpx response hook).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import jsonschema_rs
import pytest
import trio
import trio.testing

from llmgw import extras
from llmgw.admin.api import AdminApp
from llmgw.admin.contract import ApiError
from llmgw.catalog.live import ModelRegistry
from llmgw.config import Config, load
from llmgw.control.controller import Controller
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.engine_metrics import EngineSample
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.router.core import Router
from llmgw.store import Store, open_store
from llmgw.store.keys import hash_secret
from tests.test_fleet_metrics import MODELS, scenario

CONFIG: dict[str, Any] = {
    "endpoints": [
        {"id": "e1", "url": "http://127.0.0.1:9", "models": ["base"]},
        {"id": "e2", "url": "http://127.0.0.1:10", "models": ["base"]},
    ],
    "models": [{"name": "base", "aliases": ["base-alias"]}],
}

# An endpoint naming a model no [[models]] entry defines (served as is, router-only).
ENDPOINT_ONLY = {"id": "e3", "url": "http://127.0.0.1:11", "models": ["served-only"]}
ERROR_KEYS = {"message", "type", "param", "code"}
JSON = {"content-type": "application/json"}


def config(data: dict[str, Any] | None = None) -> Config:
    return load(data=CONFIG if data is None else data, environ={})


@attrs.define
class Admin:
    app: AdminApp
    client: httpx.AsyncClient
    store: Store | None
    registry: ModelRegistry
    router: Router
    doc: dict[str, Any]
    checked: int = 0

    async def check(self, response: httpx.Response) -> None:
        """The response is one the OpenAPI document says the operation may give."""
        await response.aread()
        check_response(self.app, self.doc, response)
        self.checked += 1


def check_response(app: AdminApp, doc: dict[str, Any], response: httpx.Response) -> None:
    request = response.request
    status = str(response.status_code)
    try:
        route, _ = app.resolve(request.method, request.url.path)
    except ApiError:
        route = None
    if route is None:  # no operation: an unknown path, a wrong method, or auth first
        assert response.status_code in (401, 403, 404, 405), response.text
        schema: dict[str, Any] | None = {"$ref": "#/components/schemas/ErrorBody"}
        media = "application/json"
    else:
        operation = doc["paths"][route.path][route.method.lower()]
        assert status in operation["responses"], (
            f"{route.method} {route.path} answered {status}, which the document does not list "
            f"({sorted(operation['responses'])}): {response.text}"
        )
        content = operation["responses"][status].get("content")
        if content is None:
            assert response.content == b""
            return
        ((media, spec),) = content.items()
        schema = spec["schema"]
    assert response.headers["content-type"].startswith(media)
    if media == "application/json":
        validator = jsonschema_rs.Draft202012Validator({**schema, "components": doc["components"]})
        errors = [str(e) for e in validator.iter_errors(response.json())]
        assert not errors, f"{request.method} {request.url.path} -> {status}: {errors}"


@asynccontextmanager
async def admin_api(
    tmp_path: Path | None,
    *,
    admin_auth: bool = False,
    controller: Controller | None = None,
    cfg: Config | None = None,
    configured: Any = None,
    control_plane: bool = False,
    extra: Any = (),
) -> AsyncIterator[Admin]:
    """The admin app over a fresh SQLite store in `tmp_path` (no store when None);
    router-only unless a `controller` is given or `control_plane` asks for one (wired
    to the catalog as llmgw.server wires it)."""
    cfg = cfg or config()
    store = None if tmp_path is None else await open_store(f"sqlite:///{tmp_path / 'llmgw.db'}")
    try:
        router = Router(cfg)
        registry = ModelRegistry(
            cfg.models if configured is None else configured,
            cfg.router.profiles,
            store=store,
            extra=extra,
        )
        await registry.load()
        if control_plane and controller is None:
            controller = Controller(cfg.control, registry.catalog, router)
            registry.subscribe(controller.set_catalog)
        app = AdminApp(
            router, controller=controller, store=store, models=registry, admin_auth=admin_auth
        )
        doc = app.openapi_document()
        admin = Admin(app, httpx.AsyncClient(), store, registry, router, doc)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://admin",
            event_hooks={"response": [admin.check]},
        ) as client:
            admin.client = client
            yield admin
    finally:
        if store is not None:
            await store.aclose()


def error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    detail: dict[str, Any] = body["error"]
    return detail


# -- keys ------------------------------------------------------------------------------


async def test_key_secret_is_shown_once_then_never_and_revoke(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        before = time.time()
        r = await a.client.post(
            "/api/v1/keys",
            json={
                "name": "ci",
                "band": "silver",
                "models": ["base", "base-alias"],
                "rpm": 60,
                "tpm": 10_000,
                "expires_in_seconds": 3600,
            },
        )
        assert r.status_code == 201, r.text
        created = r.json()
        secret = created["secret"]
        assert secret.startswith("llmgw-") and len(secret) > 40
        assert created["prefix"] == secret[: len(created["prefix"])]
        assert created["name"] == "ci"
        assert created["band"] == "silver"
        assert created["models"] == ["base", "base-alias"]
        assert (created["rpm"], created["tpm"], created["admin"]) == (60, 10_000, False)
        assert created["status"] == "active"
        assert created["revoked_at"] is None
        assert before + 3600 <= created["expires_at"] <= time.time() + 3600
        assert r.headers["location"] == f"/api/v1/keys/{created['id']}"
        # The secret works: the store finds the key by it.
        assert a.store is not None
        found = await a.store.lookup_key(secret)
        assert found is not None and found.id == created["id"]

        listed = await a.client.get("/api/v1/keys")
        assert listed.status_code == 200
        (key,) = listed.json()["keys"]
        assert "secret" not in key
        assert secret not in listed.text
        assert hash_secret(secret) not in listed.text
        assert key == {k: v for k, v in created.items() if k != "secret"}

        r = await a.client.delete(f"/api/v1/keys/{created['id']}")
        assert r.status_code == 200
        revoked = r.json()
        assert revoked["status"] == "revoked"
        assert revoked["revoked_at"] is not None
        assert await a.store.lookup_key(secret) is None
        # Revoking again changes nothing; the key stays listed.
        again = await a.client.delete(f"/api/v1/keys/{created['id']}")
        assert again.status_code == 200
        assert again.json()["revoked_at"] == revoked["revoked_at"]
        listed = (await a.client.get("/api/v1/keys")).json()["keys"]
        assert [k["status"] for k in listed] == ["revoked"]

        r = await a.client.delete("/api/v1/keys/key_nope")
        assert r.status_code == 404
        assert error(r)["code"] == "key_not_found"


async def test_key_defaults_and_expiry_status(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.post("/api/v1/keys", json={"name": "plain"})
        assert r.status_code == 201
        key = r.json()
        assert (key["band"], key["models"], key["rpm"], key["tpm"]) == (None, None, None, None)
        assert key["admin"] is False
        assert key["expires_at"] is None
        r = await a.client.post(
            "/api/v1/keys", json={"name": "brief", "expires_in_seconds": 0.001, "admin": True}
        )
        assert r.status_code == 201
        assert r.json()["admin"] is True
        await trio.sleep(0.01)  # the key's 1 ms lifetime runs out: time passing is the test
        statuses = {
            k["name"]: k["status"] for k in (await a.client.get("/api/v1/keys")).json()["keys"]
        }
        assert statuses == {"plain": "active", "brief": "expired"}


async def test_a_name_a_live_key_has_is_refused_and_free_once_revoked(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        first = (await a.client.post("/api/v1/keys", json={"name": "ci"})).json()
        r = await a.client.post("/api/v1/keys", json={"name": "ci", "band": "gold"})
        assert r.status_code == 409, r.text
        detail = error(r)
        assert (detail["code"], detail["param"]) == ("duplicate_name", "name")
        assert detail["message"] == (
            f"name: a key named 'ci' exists ({first['id']}) and is not revoked: "
            "choose another name, or revoke that key first"
        )
        assert [k["id"] for k in (await a.client.get("/api/v1/keys")).json()["keys"]] == [
            first["id"]
        ]
        assert (await a.client.delete(f"/api/v1/keys/{first['id']}")).status_code == 200
        r = await a.client.post("/api/v1/keys", json={"name": "ci"})
        assert r.status_code == 201, r.text
        assert r.json()["id"] != first["id"]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({}, "name", "required key is missing"),
        ({"name": ""}, "name", "must not be empty"),
        ({"name": "a\nb"}, "name", "control characters"),
        ({"name": "x" * 201}, "name", "at most 200"),
        ({"name": 5}, "name", "expected str"),
        ({"name": "k", "band": "tin"}, "band", "no band named 'tin' (have platinum, gold"),
        ({"name": "k", "rpm": 0}, "rpm", "must be in [1, "),
        ({"name": "k", "tpm": -5}, "tpm", "must be in [1, "),
        ({"name": "k", "rpm": 2**40}, "rpm", "must be in [1, "),
        ({"name": "k", "rpm": "60"}, "rpm", "expected int"),
        ({"name": "k", "rpm": 1.5}, "rpm", "expected int"),
        ({"name": "k", "admin": "yes"}, "admin", "expected bool"),
        ({"name": "k", "models": "base"}, "models", "expected an array, got a string"),
        ({"name": "k", "models": ["nope"]}, "models[0]", "no model or alias named 'nope'"),
        ({"name": "k", "models": ["base", "base"]}, "models[1]", "listed twice"),
        ({"name": "k", "expires_in_seconds": 0}, "expires_in_seconds", "must be in (0, "),
        ({"name": "k", "bnad": "gold"}, "bnad", "unknown key (did you mean 'band'?)"),
    ],
)
async def test_key_creation_is_validated_naming_the_key(
    tmp_path: Path, body: dict[str, Any], param: str, fragment: str
) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.post("/api/v1/keys", json=body)
        assert r.status_code == 400, r.text
        detail = error(r)
        assert detail["param"] == param
        assert detail["type"] == "invalid_request_error"
        assert fragment in detail["message"]
        assert detail["message"].startswith(param + ":")
        assert (await a.client.get("/api/v1/keys")).json() == {"keys": []}


async def test_without_a_store_keys_usage_and_model_changes_answer_409(tmp_path: Path) -> None:
    async with admin_api(None) as a:
        for method, path, body in (
            ("GET", "/api/v1/keys", None),
            ("POST", "/api/v1/keys", {"name": "x"}),
            ("DELETE", "/api/v1/keys/key_1", None),
            ("GET", "/api/v1/usage", None),
            ("POST", "/api/v1/models", {"name": "new"}),
            ("PATCH", "/api/v1/models/base", {"replicas": 2}),
            ("DELETE", "/api/v1/models/base", None),
        ):
            r = await a.client.request(method, path, json=body)
            assert r.status_code == 409, (method, path, r.text)
            detail = error(r)
            assert detail["code"] == "no_store"
            assert "store.url" in detail["message"]
        # Reading the catalog needs no store.
        r = await a.client.get("/api/v1/models")
        assert r.status_code == 200
        assert [m["name"] for m in r.json()["models"]] == ["base"]


# -- usage -----------------------------------------------------------------------------


def record(model: str, key: str | None, *, prompt: int, completion: int, **kw: Any) -> UsageRecord:
    return UsageRecord(
        model=model,
        endpoint="e1",
        status=kw.pop("status", 200),
        usage=Usage(prompt, completion, kw.pop("cached", None)),
        latency=kw.pop("latency", 1.0),
        ttft=kw.pop("ttft", None),
        key_id=key,
    )


async def test_usage_summary_by_key_and_model_over_windows_and_buckets(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        assert a.store is not None
        alice, _ = await a.store.create_key("alice")
        now = time.time()
        await a.store.record_usage(
            [
                (now - 7200, record("base", alice.id, prompt=100, completion=10, ttft=0.5)),
                (now - 1800, record("base", alice.id, prompt=50, completion=5, ttft=0.25)),
                (now - 60, record("other", None, prompt=7, completion=3, status=500)),
                (now - 30, record("base", "key_gone", prompt=1, completion=1, cached=1)),
            ]
        )

        r = await a.client.get("/api/v1/usage")
        assert r.status_code == 200
        body = r.json()
        assert set(body) == {"group_by", "since", "until", "bucket_seconds", "usage"}
        assert (body["group_by"], body["since"], body["until"], body["bucket_seconds"]) == (
            "key",
            None,
            None,
            None,
        )
        rows = {row["group"]: row for row in body["usage"]}
        assert body["usage"][0]["group"] is None  # keyless requests first
        assert rows[alice.id]["name"] == "alice"
        assert rows[alice.id]["requests"] == 2
        assert rows[alice.id]["prompt_tokens"] == 150
        assert rows[alice.id]["completion_tokens"] == 15
        assert rows[alice.id]["mean_ttft"] == pytest.approx(0.375)
        assert rows[alice.id]["bucket"] is None
        assert rows[None]["errors"] == 1
        assert rows[None]["name"] is None
        assert rows[None]["mean_ttft"] is None
        assert rows["key_gone"]["name"] is None  # no such key (any more)
        assert rows["key_gone"]["cached_tokens"] == 1

        r = await a.client.get("/api/v1/usage", params={"group_by": "model", "since": "1h"})
        body = r.json()
        assert body["since"] == pytest.approx(time.time() - 3600, abs=5)
        models = {row["group"]: row for row in body["usage"]}
        assert models["base"]["requests"] == 2  # the 2h-old record is outside
        assert models["base"]["prompt_tokens"] == 51
        assert models["other"]["requests"] == 1
        assert all(row["name"] is None for row in body["usage"])

        # Absolute bounds in Unix seconds, and buckets.
        r = await a.client.get(
            "/api/v1/usage",
            params={
                "group_by": "model",
                "since": str(int(now - 3 * 3600)),
                "until": "10m",
                "bucket": "1h",
            },
        )
        body = r.json()
        assert body["bucket_seconds"] == 3600
        assert body["until"] == pytest.approx(time.time() - 600, abs=5)
        assert [row["requests"] for row in body["usage"]] and all(
            row["bucket"] % 3600 == 0 for row in body["usage"]
        )
        assert sum(row["requests"] for row in body["usage"]) == 2  # the last 10 minutes excluded


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("group_by=tenant", "group_by"),
        ("since=yesterday", "since"),
        ("since=-5", "since"),
        ("until=1e999", "until"),
        ("bucket=0", "bucket"),
        ("bucket=500ms", "bucket"),
        ("bucket=1w", "bucket"),
        ("since=10&until=5", "since"),
        ("since=1h&until=2h", "since"),
        ("grop_by=key", "grop_by"),
        ("since=1h&since=2h", "since"),
    ],
)
async def test_usage_rejects_bad_parameters_naming_them(
    tmp_path: Path, query: str, param: str
) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.get(f"/api/v1/usage?{query}")
        assert r.status_code == 400, r.text
        assert error(r)["param"] == param
        assert param in error(r)["message"]


# -- models ----------------------------------------------------------------------------

PROFILE = {"name": "sim1", "engine": "sim", "weights": "sim/tiny"}


async def test_runtime_model_lifecycle(tmp_path: Path) -> None:
    async with admin_api(tmp_path, control_plane=True) as a:
        r = await a.client.post(
            "/api/v1/models",
            json={
                "name": "fresh",
                "aliases": ["fresh-alias"],
                "fallbacks": ["base"],
                "profiles": [{**PROFILE, "min_gpu_memory": 80_000_000_000}],
            },
        )
        assert r.status_code == 201, r.text
        model = r.json()
        assert r.headers["location"] == "/api/v1/models/fresh"
        assert model["source"] == "runtime"
        assert model["replicas"] == 1
        assert model["profiles"][0]["min_gpu_memory"] == "80GB"  # the configuration's form
        assert (model["status"]["desired"], model["status"]["ready"]) == (1, 0)
        assert model["routing"] == {"endpoints": [], "available": 0, "waiting": 0}
        assert a.registry.catalog.resolve("fresh-alias") is not None

        listed = (await a.client.get("/api/v1/models")).json()["models"]
        assert [(m["name"], m["source"]) for m in listed] == [
            ("base", "config"),
            ("fresh", "runtime"),
        ]
        base = listed[0]
        assert base["routing"] == {"endpoints": ["e1", "e2"], "available": 2, "waiting": 0}

        assert (await a.client.get("/api/v1/models/fresh")).json() == model
        assert (await a.client.get("/api/v1/models/fresh-alias")).json()["name"] == "fresh"

        r = await a.client.patch("/api/v1/models/fresh", json={"replicas": 3})
        assert r.status_code == 200, r.text
        assert r.json()["replicas"] == 3
        assert r.json()["aliases"] == ["fresh-alias"]  # untouched keys stay
        r = await a.client.patch(
            "/api/v1/models/fresh",
            json={"profiles": [PROFILE, {**PROFILE, "name": "sim2", "tensor_parallel": 2}]},
        )
        assert r.status_code == 200, r.text
        assert [p["name"] for p in r.json()["profiles"]] == ["sim1", "sim2"]
        assert r.json()["profiles"][0]["min_gpu_memory"] is None  # a list replaces the whole

        # Kept across a restart: a new registry over the same store loads it.
        again = ModelRegistry(config().models, config().router.profiles, store=a.store)
        assert await again.load() == []
        assert again.runtime["fresh"].replicas == 3

        r = await a.client.delete("/api/v1/models/fresh")
        assert r.status_code == 204
        assert r.content == b""
        assert (await a.client.get("/api/v1/models/fresh")).status_code == 404
        assert (await a.client.delete("/api/v1/models/fresh")).status_code == 404
        assert (
            await a.client.patch("/api/v1/models/fresh", json={"replicas": 1})
        ).status_code == 404
        assert a.checked == 10  # every response was checked against the document


async def test_router_only_refuses_models_with_deployment_profiles(tmp_path: Path) -> None:
    """Without a control plane nothing would ever start such a model: refused, POST and
    PATCH alike, saying why; without profiles the same model is fine."""
    async with admin_api(tmp_path) as a:
        assert a.app.controller is None
        r = await a.client.post("/api/v1/models", json={"name": "fresh", "profiles": [PROFILE]})
        assert r.status_code == 409, r.text
        detail = error(r)
        assert detail["code"] == "no_control_plane"
        assert detail["message"].startswith(
            "no control plane: this server runs as a router only (no model had deployment "
            "profiles when it started), so no agent would ever start model 'fresh'"
        )
        assert a.store is not None and await a.store.list_models() == []
        assert a.registry.catalog.resolve("fresh") is None

        r = await a.client.post("/api/v1/models", json={"name": "fresh", "fallbacks": ["base"]})
        assert r.status_code == 201, r.text
        r = await a.client.patch("/api/v1/models/fresh", json={"profiles": [PROFILE]})
        assert r.status_code == 409, r.text
        assert error(r)["code"] == "no_control_plane"
        assert a.registry.runtime["fresh"].profiles == ()
        assert [m.config.get("profiles") for m in await a.store.list_models()] == [[]]
        # Changes that add no profiles still go through.
        r = await a.client.patch("/api/v1/models/fresh", json={"replicas": 2, "profiles": []})
        assert r.status_code == 200, r.text
        # A broken entry hears what is wrong with it first.
        bad = {"name": "x", "profiles": [{**PROFILE, "engine": "tgi"}]}
        r = await a.client.post("/api/v1/models", json=bad)
        assert r.status_code == 400 and "engine: unknown" in error(r)["message"]


async def test_model_names_with_slashes(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.post("/api/v1/models", json={"name": "meta-llama/Llama-3.1-8B"})
        assert r.status_code == 201
        assert r.headers["location"] == "/api/v1/models/meta-llama%2FLlama-3.1-8B"
        r = await a.client.get("/api/v1/models/meta-llama/Llama-3.1-8B")
        assert r.status_code == 200
        assert r.json()["name"] == "meta-llama/Llama-3.1-8B"
        r = await a.client.patch("/api/v1/models/meta-llama%2FLlama-3.1-8B", json={"replicas": 2})
        assert r.status_code == 200
        assert r.json()["replicas"] == 2


async def test_model_validation_errors_name_the_key(tmp_path: Path) -> None:
    cfg = config({"endpoints": CONFIG["endpoints"]})
    async with admin_api(tmp_path, cfg=cfg) as a:
        r = await a.client.post("/api/v1/models", json={"name": "m", "fallbacks": ["x"]})
        assert r.status_code == 400
        detail = error(r)
        assert detail["message"] == "models[0].fallbacks[0]: no model named 'x'"
        assert detail["param"] == "models[0].fallbacks[0]"
        assert detail["code"] == "invalid_model"

        cases = [
            ({"fallbacks": ["m"]}, "models[0].fallbacks[0]: a model cannot fall back to itself"),
            ({"profiles": [{**PROFILE, "engine": "tgi"}]}, "models[0].profiles[0].engine: unknown"),
            ({"profiles": [{"name": "p"}]}, "profiles[0].engine: required key is missing"),
            ({"replicas": -1}, "models[0].replicas: must be 0 or more"),
            ({"replicas": 10**9}, "replicas: must be at most 10000"),
            (
                {"autoscale": {"min_replicas": 0, "max_replicas": 10**9}},
                "autoscale.max_replicas: must be at most 10000",
            ),
            (
                {"autoscale": {"min_replicas": 3, "max_replicas": 2}},
                "models[0].autoscale.min_replicas: must not exceed max_replicas (2)",
            ),
            ({"autoscale": {"min_replicas": 0}}, "autoscale.max_replicas: required key"),
            ({"replicas": "2"}, "replicas: expected int"),
            ({"aliases": "abc"}, "aliases: expected an array, got a string"),
            ({"profiles": [{**PROFILE, "args": "--x"}]}, "profiles[0].args: expected an array"),
            ({"routing_profile": "fast"}, "models[0].routing_profile: no routing profile"),
            ({"replics": 2}, "replics: unknown key (did you mean 'replicas'?)"),
        ]
        for extra, message in cases:
            r = await a.client.post("/api/v1/models", json={"name": "m", **extra})
            assert r.status_code == 400, (extra, r.text)
            assert error(r)["message"].startswith(message), (extra, r.text)
            assert error(r)["param"] == message.split(":")[0]
        assert (await a.client.post("/api/v1/models", json={"fallbacks": []})).status_code == 400
        assert (await a.client.get("/api/v1/models")).json()["models"] == []

        # PATCH validates the merged model the same way.
        assert (await a.client.post("/api/v1/models", json={"name": "m"})).status_code == 201
        r = await a.client.patch("/api/v1/models/m", json={"fallbacks": ["x"]})
        assert r.status_code == 400
        assert error(r)["message"] == "models[0].fallbacks[0]: no model named 'x'"
        r = await a.client.patch("/api/v1/models/m", json={"replics": 2})
        assert error(r)["param"] == "replics"
        r = await a.client.patch("/api/v1/models/m", json={"name": "renamed"})
        assert r.status_code == 400
        assert "cannot be renamed" in error(r)["message"]


async def test_runtime_models_take_autoscale_settings(tmp_path: Path) -> None:
    cfg = config({"endpoints": CONFIG["endpoints"]})
    async with admin_api(tmp_path, cfg=cfg) as a:
        body = {"name": "m", "autoscale": {"min_replicas": 0, "max_replicas": 3}}
        r = await a.client.post("/api/v1/models", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["autoscale"] == {
            "min_replicas": 0,
            "max_replicas": 3,
            "idle_timeout": "10m",
            "target_saturation": 0.7,
            "scale_up_window": "30s",
            "scale_down_window": "5m",
            "cold_start_timeout": "10m",
        }
        changes = {"autoscale": {"min_replicas": 1, "max_replicas": 4, "idle_timeout": "90s"}}
        r = await a.client.patch("/api/v1/models/m", json=changes)
        assert r.status_code == 200, r.text
        assert r.json()["autoscale"]["idle_timeout"] == "90s"
        assert r.json()["autoscale"]["max_replicas"] == 4
        # Back to a static count.
        r = await a.client.patch("/api/v1/models/m", json={"autoscale": None, "replicas": 2})
        assert (r.json()["autoscale"], r.json()["replicas"]) == (None, 2)


async def test_model_conflicts(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.post("/api/v1/models", json={"name": "base"})
        assert r.status_code == 409
        assert "configuration file" in error(r)["message"]
        r = await a.client.patch("/api/v1/models/base", json={"replicas": 2})
        assert r.status_code == 409
        assert error(r)["code"] == "model_conflict"
        assert (await a.client.delete("/api/v1/models/base")).status_code == 409

        assert (await a.client.post("/api/v1/models", json={"name": "a"})).status_code == 201
        assert (await a.client.post("/api/v1/models", json={"name": "a"})).status_code == 409
        r = await a.client.post("/api/v1/models", json={"name": "b", "fallbacks": ["a"]})
        assert r.status_code == 201
        r = await a.client.delete("/api/v1/models/a")  # b falls back to it
        assert r.status_code == 409
        assert "no model named 'a'" in error(r)["message"]
        # An alias clash is a validation error of the catalog.
        r = await a.client.post("/api/v1/models", json={"name": "c", "aliases": ["base-alias"]})
        assert r.status_code == 400
        assert "'base-alias' is already an alias of 'base'" in error(r)["message"]


async def test_runtime_model_names_follow_the_catalog_rule_and_shadow_nothing(
    tmp_path: Path,
) -> None:
    """The admin API and the store take names by the configuration file's rule (a raw
    CR reached a /metrics label, 20,000 aliases and 5,000-character names were taken),
    and a new model never takes over a name clients already use for another: an alias,
    or a model that endpoints in the configuration file serve."""
    cfg = config({**CONFIG, "endpoints": [*CONFIG["endpoints"], ENDPOINT_ONLY]})
    extra = [ModelConfig("served-only")]
    async with admin_api(tmp_path, cfg=cfg, extra=extra) as a:
        cases = [
            ({"name": "evil\r\nx"}, "models[1].name: must not contain control characters"),
            ({"name": "m" * 5000}, "models[1].name: must be at most 256 characters, got 5000"),
            ({"name": "m", "aliases": ["ok\r"]}, "models[1].aliases[0]: must not contain"),
            (
                {"name": "m", "aliases": [f"a{i}" for i in range(20_000)]},
                "models[1].aliases: at most 64 aliases, got 20000",
            ),
        ]
        for body, message in cases:
            r = await a.client.post("/api/v1/models", json=body)
            assert r.status_code == 400, (body, r.text[:300])
            detail = error(r)
            assert detail["message"].startswith(message), (body, detail["message"][:300])
            assert detail["code"] == "invalid_model" and len(detail["message"]) < 400
        conflicts = [
            ({"name": "base-alias"}, "'base-alias' is already an alias of model 'base'"),
            ({"name": "served-only"}, "model 'served-only' is served by endpoints"),
        ]
        for body, message in conflicts:
            r = await a.client.post("/api/v1/models", json=body)
            assert r.status_code == 409, (body, r.text)
            assert error(r)["code"] == "model_conflict"
            assert error(r)["message"].startswith(message), error(r)["message"]
        assert a.store is not None and await a.store.list_models() == []
        assert a.registry.catalog.resolve("base-alias").name == "base"  # type: ignore[union-attr]
        assert a.registry.catalog.resolve("served-only") == extra[0]

        # A model stored by an older version under a bad name is skipped at load, and
        # said why (its name is shown escaped, never as a raw CR).
        await a.store.put_model(ModelConfig("bad\rname"))
        warnings = await a.registry.load()
        assert any("must not contain control characters" in w for w in warnings), warnings
        assert all("\r" not in w for w in warnings), warnings
        assert a.registry.catalog.resolve("bad\rname") is None


async def test_models_show_replica_status_with_a_control_plane(tmp_path: Path) -> None:
    s = scenario()
    s.controller.reconcile()
    async with admin_api(tmp_path, controller=s.controller, configured=MODELS) as a:
        models = {m["name"]: m for m in (await a.client.get("/api/v1/models")).json()["models"]}
        assert models["llama"]["source"] == "config"
        status = models["llama"]["status"]
        assert status["model"] == "llama"
        assert status["desired"] == 2
        assert status["starting"] == 2
        assert status["ready"] == 0
        assert models["huge"]["status"]["unplaced"] == 1
        assert models["llama"]["profiles"][0]["engine"] == "vllm"


# -- admin auth ------------------------------------------------------------------------


async def test_admin_auth_401_403_and_200(tmp_path: Path) -> None:
    async with admin_api(tmp_path, admin_auth=True) as a:
        assert a.store is not None
        admin, admin_secret = await a.store.create_key("root", admin=True)
        _, user_secret = await a.store.create_key("user")

        r = await a.client.get("/api/v1/keys")
        assert r.status_code == 401
        assert error(r)["code"] == "missing_api_key"
        assert r.headers["www-authenticate"].startswith("Bearer")
        for value in ("Basic abc", "Bearer", "Bearer llmgw-nope", admin_secret):
            r = await a.client.get("/api/v1/keys", headers={"authorization": value})
            assert r.status_code == 401, value
            assert error(r)["type"] == "authentication_error"
        r = await a.client.get("/api/v1/keys", headers={"authorization": f"Bearer {user_secret}"})
        assert r.status_code == 403
        assert error(r)["type"] == "permission_error"

        auth = {"authorization": f"Bearer {admin_secret}"}
        for path in ("/api/v1/keys", "/api/v1/models", "/api/v1/openapi.json", "/api/v1/usage"):
            assert (await a.client.get(path, headers=auth)).status_code == 200, path
        # Unknown routes are not revealed without a key.
        assert (await a.client.get("/api/v1/nope")).status_code == 401
        assert (await a.client.get("/api/v1/nope", headers=auth)).status_code == 404
        # Health and metrics stay open.
        assert (await a.client.get("/healthz")).status_code == 200
        assert (await a.client.get("/metrics")).status_code == 200
        assert (await a.client.get("/readyz")).status_code == 503  # nothing scraped yet

        # The last usable admin key cannot be revoked through the API it guards.
        r = await a.client.delete(f"/api/v1/keys/{admin.id}", headers=auth)
        assert r.status_code == 409
        assert error(r)["code"] == "last_admin_key"
        r = await a.client.post("/api/v1/keys", json={"name": "root2", "admin": True}, headers=auth)
        assert r.status_code == 201
        second = r.json()["secret"]
        assert (await a.client.delete(f"/api/v1/keys/{admin.id}", headers=auth)).status_code == 200
        assert (await a.client.get("/api/v1/keys", headers=auth)).status_code == 401
        r = await a.client.get("/api/v1/keys", headers={"authorization": f"bearer  {second}"})
        assert r.status_code == 200


async def test_admin_auth_needs_a_store() -> None:
    with pytest.raises(ValueError, match="store"):
        AdminApp(Router(config()), admin_auth=True)


async def test_openapi_document_follows_admin_auth(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        doc = a.doc
        assert "securitySchemes" not in doc["components"]
        assert "401" not in doc["paths"]["/api/v1/keys"]["get"]["responses"]
    async with admin_api(tmp_path, admin_auth=True) as a:
        doc = a.doc
        assert doc["components"]["securitySchemes"]["adminKey"]["scheme"] == "bearer"
        keys = doc["paths"]["/api/v1/keys"]["get"]
        assert keys["security"] == [{"adminKey": []}]
        assert {"401", "403"} <= set(keys["responses"])
        assert "security" not in doc["paths"]["/healthz"]["get"]


# -- plumbing --------------------------------------------------------------------------


async def test_wrong_method_is_405_with_allow(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        for method, path, allow in (
            # A GET route answers HEAD too.
            ("PUT", "/api/v1/keys", {"GET", "HEAD", "POST"}),
            ("GET", "/api/v1/keys/key_1", {"DELETE"}),
            ("POST", "/api/v1/models/x", {"GET", "HEAD", "PATCH", "DELETE"}),
            ("DELETE", "/healthz", {"GET", "HEAD"}),
            ("GET", "/api/v1/nodes/n1/drain", {"POST"}),
        ):
            r = await a.client.request(method, path)
            assert r.status_code == 405, (method, path)
            assert set(r.headers["allow"].split(", ")) == allow
            assert error(r)["code"] == "method_not_allowed"
        r = await a.client.get("/api/v1/nothing")
        assert r.status_code == 404
        assert error(r)["message"] == "no route GET /api/v1/nothing"


async def test_bodies_are_bounded_and_must_be_json_objects(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        big = b'{"name": "' + b"x" * (1 << 20) + b'"}'
        r = await a.client.post("/api/v1/keys", content=big)
        assert r.status_code == 413
        assert error(r)["code"] == "body_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it comes
            for _ in range(20):
                yield b" " * 65536

        r = await a.client.post("/api/v1/models", content=chunks())
        assert r.status_code == 413

        for raw, fragment in (
            (b"", "must be a JSON object"),
            (b"{", "malformed JSON"),
            (b"[1, 2]", "must be a JSON object, got list"),
            (b'{"name": NaN}', "NaN is not valid JSON"),
            (b"\xff\xfe", "malformed JSON"),
        ):
            r = await a.client.post("/api/v1/keys", content=raw, headers=JSON)
            assert r.status_code == 400, raw
            assert error(r)["code"] == "invalid_json"
            assert fragment in error(r)["message"]
        # JSON only as JSON: a cross-site form may post text/plain without a preflight.
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
            headers = {} if content_type is None else {"content-type": content_type}
            r = await a.client.post("/api/v1/keys", content=b'{"name": "x"}', headers=headers)
            assert r.status_code == 415, content_type
            assert error(r)["code"] == "unsupported_media_type"
        assert (await a.client.get("/api/v1/keys")).json() == {"keys": []}


async def test_unknown_query_parameters_are_refused(tmp_path: Path) -> None:
    async with admin_api(tmp_path) as a:
        r = await a.client.get("/api/v1/keys?limit=5")
        assert r.status_code == 400
        assert error(r)["param"] == "limit"
        # Health probes and scrapers may add what they like.
        assert (await a.client.get("/healthz?probe=1")).status_code == 200


async def test_existing_views_pass_through_their_view_classes(tmp_path: Path) -> None:
    """The router's endpoint and admission dicts have exactly the view classes' keys
    (a key the router adds must be added to the view, or the API would drop it)."""
    async with admin_api(tmp_path) as a:
        state = a.router.endpoints.get("e1")
        assert state is not None
        state.sample = EngineSample("vllm", waiting=1.0, running=2.0, kv_usage=0.5)
        state.last_scrape = 0.0
        r = await a.client.get("/api/v1/endpoints")
        assert r.status_code == 200
        raw = a.router.endpoint_views()
        # The API adds where each endpoint comes from (llmgw.endpoint_sources).
        assert [set(e) for e in r.json()["endpoints"]] == [set(e) | {"source"} for e in raw]
        assert r.json()["endpoints"][0]["engine"] == "vllm"
        assert r.json()["endpoints"][0]["source"] == "config"
        r = await a.client.get("/api/v1/admission")
        assert json.loads(json.dumps(a.router.admission_view())) == r.json()
        r = await a.client.get("/readyz")
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "endpoints_scraped": 1}


async def test_a_trickled_body_is_cut_with_408_at_the_body_timeout(tmp_path: Path) -> None:
    """One byte every 0.2 s resets the listener's wait for each chunk; the admin API
    bounds the whole body (issue #17: /api/v1/keys and /admin/login hung)."""

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(100):  # 20 s of it, unless cut
            await trio.sleep(0.2)
            yield b" "

    store = await open_store(f"sqlite:///{tmp_path / 'llmgw.db'}")
    try:
        app = AdminApp(Router(config()), store=store, body_timeout=0.5)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            start = trio.current_time()
            r = await client.post("/api/v1/keys", content=trickle(), headers=JSON)
            assert r.status_code == 408
            assert error(r)["code"] == "body_timeout"
            assert trio.current_time() - start < 10
    finally:
        await store.aclose()


async def test_cross_site_changes_are_refused(tmp_path: Path) -> None:
    """A page on another site cannot create a key through the operator's browser
    (issue #17: a cross-site POST got 201 and the secret)."""
    async with admin_api(tmp_path) as a:
        for headers in (
            {"sec-fetch-site": "cross-site"},
            {"origin": "http://attacker.example"},
        ):
            r = await a.client.post("/api/v1/keys", json={"name": "x"}, headers=headers)
            assert r.status_code == 403, headers
            assert error(r)["code"] == "cross_site"
        assert (await a.client.get("/api/v1/keys")).json() == {"keys": []}


async def test_a_loopback_listener_answers_only_its_own_host_names() -> None:
    """DNS rebinding (issue #17): Host: attacker.example got 201 and a key's secret."""
    from llmgw.admin.web import LOOPBACK_HOSTS

    app = AdminApp(Router(config()), hosts=LOOPBACK_HOSTS)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090") as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/healthz", headers={"host": "[::1]:9090"})).status_code == 200
        assert (await c.get("/healthz", headers={"host": "localhost"})).status_code == 200
        r = await c.post("/api/v1/keys", json={"name": "x"}, headers={"host": "attacker.example"})
        assert r.status_code == 421
        assert error(r)["code"] == "misdirected"


def test_the_host_allowlist_is_the_listeners_own_names() -> None:
    """Loopback names, admin_hosts, the configured and bound addresses (a wildcard
    names none) and the machine's names, lower case (issue #17)."""
    from llmgw.admin.hosts import allowed_hosts, wildcard
    from llmgw.admin.web import LOOPBACK_HOSTS

    assert all(wildcard(a) for a in ("0.0.0.0:9090", "[::]:9090", ":9090"))
    assert not any(wildcard(a) for a in ("127.0.0.1:9090", "[::1]:9090", "gw01:9090"))
    assert allowed_hosts([], "127.0.0.1:9090", ["127.0.0.1:41235"]) == LOOPBACK_HOSTS
    assert allowed_hosts([], ":9090", ["0.0.0.0:9090", "[::]:9090"]) == LOOPBACK_HOSTS
    named = allowed_hosts(
        ["Metrics.Example.Internal"], "gw01.internal:9090", ["10.0.0.5:9090"], ["GW01", "gw01.dc"]
    )
    assert named == LOOPBACK_HOSTS | {
        "metrics.example.internal",
        "gw01.internal",
        "10.0.0.5",
        "gw01",
        "gw01.dc",
    }


async def test_a_stuck_resolver_holds_up_the_start_only_briefly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The FQDN comes from the resolver, which can hang for a DNS timeout: the admin
    listener starts without it after RESOLVER_TIMEOUT, with the host name, and says so."""
    import socket
    import threading

    from llmgw.admin import hosts

    release = threading.Event()

    def stuck() -> str:
        release.wait(30)
        return "late.example"

    monkeypatch.setattr(socket, "getfqdn", stuck)
    monkeypatch.setattr(hosts, "RESOLVER_TIMEOUT", 0.2)
    try:
        with trio.fail_after(10):
            names = await hosts.machine_names(wildcard_bind=False)
    finally:
        release.set()
    assert names == {socket.gethostname()}
    assert "no FQDN for this machine" in caplog.text


async def test_a_profile_without_the_profiler_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(extras.EXTRAS, "profiling", {"llmgw_no_such_module": "pyinstrument"})
    async with admin_api(None) as a:
        r = await a.client.post("/api/v1/debug/profile", params={"seconds": "1"})
    assert r.status_code == 501  # and documented: admin_api checks every answer
    assert error(r)["message"] == (
        "a CPU profile needs pyinstrument, not installed: pip install 'llmgw[profiling]'"
    )
    assert error(r)["code"] == "profiler_missing"
