"""`llmgw-ctl`: admin subcommands against the real admin API, and `bench` against the
simulator.

The admin API is llmgw's own (`AdminApp`) over a SQLite store, a control plane with
five nodes (`tests.test_fleet_metrics.scenario`) and a router with two endpoints,
served by llmgw.http.server on a loopback port in the test's trio run, while llmgw-ctl runs
as it does from a shell, in a worker thread. Every answer the CLI gets is checked
against the API's served OpenAPI document, as tests/test_admin_api.py checks the API's
own answers: what the tests feed llmgw-ctl is what the admin API answers. Failures are
the app's own answers too (a handler made to raise: 500; a store made to fail: 503).
Only what an llmgw admin API never answers comes from elsewhere: nothing listening on
the port, and a web server that is not llmgw (Python's http.server).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import httpx
import jsonschema_rs
import pytest
import trio
from rich.console import Console, RenderableType

from llmgw.admin.api import AdminApp
from llmgw.catalog.live import ModelRegistry
from llmgw.config import load
from llmgw.control import views as control_views
from llmgw.control.controller import Controller
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.http.asgi import Receive, Scope, Send
from llmgw.http.server import HttpServerConfig, serve_listeners
from llmgw.router.core import Router
from llmgw.store import Store, open_store
from llmgw.store.base import StoreError
from llmgw.store.migrations.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from llmgw.store.sqlite import SQLiteStore
from llmgw.testing.procs import reserve_port
from llmgw_cli import ctl_views
from llmgw_cli.ctl import main
from llmgw_cli.ctl_models import read_model_entry
from llmgw_cli.ctl_output import render_table
from llmgw_cli.ctl_views import render
from tests.procs import BIN, sim
from tests.test_admin_api import check_response
from tests.test_fleet_metrics import MODELS, scenario

# ----------------------------------------------------------------- the admin API

CONFIG: dict[str, Any] = {
    "endpoints": [
        {"id": "e1", "url": "http://127.0.0.1:9", "models": ["base"]},
        {"id": "e2", "url": "http://127.0.0.1:10", "models": ["base"]},
    ],
    "models": [{"name": "base", "aliases": ["base-alias"]}],
}


@attrs.define
class Exchange:
    """One request llmgw-ctl made and the answer it got."""

    method: str
    target: str  # the path and query, as sent
    authorization: str | None
    body: Any  # the request's JSON; None without a body
    status: int
    answer: Any  # the response's JSON; None without a body


@attrs.define
class LiveAdmin:
    """The admin API being served, as an ASGI app in front of it that records every
    exchange and checks each answer against the OpenAPI document."""

    app: AdminApp
    store: Store
    registry: ModelRegistry
    controller: Controller
    doc: dict[str, Any]
    url: str = ""
    exchanges: list[Exchange] = attrs.field(factory=list)
    problems: list[str] = attrs.field(factory=list)

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        return [(e.method, e.target, e.authorization) for e in self.exchanges]

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies sent, in order."""
        return [e.body for e in self.exchanges if e.body is not None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent: list[bytes] = []
        start: dict[str, Any] = {}
        answered: list[bytes] = []

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                sent.append(bytes(message.get("body", b"")))
            return message

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                answered.append(bytes(message.get("body", b"")))
                if not message.get("more_body"):
                    # Recorded before the last byte goes out: the client (and the test
                    # reading the exchanges after it) cannot see the answer first.
                    self.record(scope, b"".join(sent), start, b"".join(answered))
            await send(message)

        await self.app(scope, recording_receive, recording_send)

    def record(self, scope: Scope, body: bytes, start: dict[str, Any], answer: bytes) -> None:
        query = scope["query_string"].decode()
        target = bytes(scope["raw_path"]).decode() + (f"?{query}" if query else "")
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        response = httpx.Response(
            start["status"],
            headers=[(k.decode(), v.decode()) for k, v in start["headers"]],
            content=answer,
            request=httpx.Request(scope["method"], f"http://admin{target}"),
        )
        self.check(response)
        self.exchanges.append(
            Exchange(
                scope["method"],
                target,
                headers.get("authorization"),
                json.loads(body) if body else None,
                response.status_code,
                response.json() if answer else None,
            )
        )

    def check(self, response: httpx.Response) -> None:
        """The answer is one the document lists for the operation, with a body of the
        documented shape; 500 (never intended, so not listed) in the one error shape."""
        where = f"{response.request.method} {response.request.url.raw_path.decode()}"
        try:
            if response.status_code == 500:
                errors = schema_errors(self.doc, "ErrorBody", response.json())
                assert not errors, errors
            else:
                check_response(self.app, self.doc, response)
        except AssertionError as exc:
            self.problems.append(f"{where} -> {response.status_code}: {exc}")


def schema_errors(doc: dict[str, Any], schema: str, data: Any) -> list[str]:
    """Where `data` breaks the document's component schema `schema`."""
    ref = {"$ref": f"#/components/schemas/{schema}", "components": doc["components"]}
    return [str(e) for e in jsonschema_rs.Draft202012Validator(ref).iter_errors(data)]


@asynccontextmanager
async def live_admin(tmp_path: Path, *, admin_auth: bool = False) -> AsyncIterator[LiveAdmin]:
    """The admin API on a loopback port (port 0: the kernel picks a free one) over a
    fresh SQLite store in `tmp_path`, with the fleet of `scenario()`: gpu-1 and gpu-2
    ready in fabric ib-a (gpu-1 runs llama's two replicas), gpu-3 unreachable, gpu-4
    lost, gpu-5 cordoned; model huge cannot be placed."""
    config = load(data=CONFIG, environ={})
    store = await open_store(f"sqlite:///{tmp_path / 'llmgw.db'}")
    try:
        fleet = scenario()
        fleet.controller.reconcile()
        router = Router(config)
        registry = ModelRegistry([*config.models, *MODELS], config.router.profiles, store=store)
        await registry.load()
        app = AdminApp(
            router,
            controller=fleet.controller,
            store=store,
            models=registry,
            admin_auth=admin_auth,
        )
        status, doc = await app.call("GET", "/api/v1/openapi.json")  # what the route serves
        assert status == 200
        admin = LiveAdmin(app, store, registry, fleet.controller, doc)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            (admin.url,) = await nursery.start(
                partial(
                    serve_listeners,
                    admin,
                    listeners,
                    HttpServerConfig(),
                    shutdown_trigger=trio.sleep_forever,
                )
            )
            yield admin
            nursery.cancel_scope.cancel()
        assert not admin.problems, "\n".join(admin.problems)
    finally:
        await store.aclose()


@contextmanager
def not_llmgw(directory: Path) -> Iterator[str]:
    """A web server that is not llmgw (Python's http.server, serving `directory`)."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """llmgw-ctl with `argv`: its exit code, standard output and standard error."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


async def ctl_async(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`ctl` in a worker thread, for a test whose trio run serves the admin API."""
    return await trio.to_thread.run_sync(partial(ctl, capsys, *argv))


def cells(out: str, first: str) -> list[str]:
    """The cells of the row of a boxed table in `out` whose first cell is `first`."""
    for line in out.splitlines():
        row = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if row and row[0] == first:
            return row
    raise AssertionError(f"no row {first!r} in:\n{out}")


def words(out: str, first: str) -> list[str]:
    """The words of the line of `out` (a borderless table) whose first word is `first`."""
    for line in out.splitlines():
        if line.split()[:1] == [first]:
            return line.split()
    raise AssertionError(f"no line {first!r} in:\n{out}")


async def test_nodes_as_a_table_and_as_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "nodes")
        assert (code, err) == (0, ""), err
        # node, state, heartbeat, GPUs free/total, GPU memory GiB (used/total), fabrics
        assert cells(out, "gpu-1") == ["gpu-1", "ready", "0s ago", "0/4", "103/298", "ib-a"]
        assert cells(out, "gpu-2") == ["gpu-2", "ready", "0s ago", "4/4", "?/298", "ib-a"]
        assert cells(out, "gpu-3")[1:3] == ["unreachable", "20s ago"]
        assert cells(out, "gpu-4")[1] == "lost"
        assert cells(out, "gpu-5")[1::4] == ["ready (cordoned)", "ib-b"]

        # global flags after the subcommand work too; --json prints the API's answer
        code, out, err = await ctl_async(capsys, "nodes", "--json", "--admin", admin.url)
        assert (code, err) == (0, "")
        assert json.loads(out) == admin.exchanges[-1].answer
        assert [n["id"] for n in json.loads(out)["nodes"]] == [
            "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"
        ]  # fmt: skip
        assert [r[:2] for r in admin.requests] == [("GET", "/api/v1/nodes")] * 2


async def test_replicas_placement_models_usage_and_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "replicas")
        assert code == 0
        for replica in admin.controller.reconciler.replicas.values():
            if replica.placement.model == "llama":
                row = cells(out, replica.placement.replica_id)
                assert row[1:3] == ["llama", "starting"] and row[4].startswith("gpu-1 (0:")
        assert cells(out, "huge")[1:7] == ["1", "0", "0", "0", "1", "-"]
        assert cells(out, "llama")[1:3] == ["2", "0"]

        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "placement")
        assert code == 0
        assert out.startswith("huge: 0 of 1 replicas placed; 1 cannot be placed")
        assert "    gpu-1: has 4 GPUs, needs 8\n" in out and "    gpu-5: cordoned\n" in out

        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "models")
        assert code == 0
        # model, source, aliases, fallbacks, ready/desired, autoscale, endpoints
        assert words(out, "base") == [
            "base", "config", "base-alias", "-", "-", "-", "2/2", "available:", "e1,", "e2"
        ]  # fmt: skip
        assert words(out, "llama") == ["llama", "config", "-", "-", "0/2", "-", "none"]

        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "--admin-key", "ak", "usage", "--filter", "group_by=model"
        )
        assert code == 0 and out == "no usage (all recorded)\n"
        assert admin.requests[-1] == ("GET", "/api/v1/usage?group_by=model", "Bearer ak")
        code, out, err = await ctl_async(
            capsys, "--admin", admin.url, "usage", "--filter", "model=llama"
        )
        assert (code, out) == (1, "")
        assert err == (
            "llmgw-ctl: error: admin API answered 400 to GET /api/v1/usage: unknown query "
            "parameter 'model'; it takes bucket, group_by, since, until (param model)\n"
        )

        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "keys")
        assert code == 0
        assert out == "no API keys (create one: llmgw-ctl keys create --name NAME)\n"


async def test_wide_records_are_shown_one_field_per_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "endpoints")
        assert code == 0
        endpoints = admin.exchanges[-1].answer["endpoints"]
    assert [e["id"] for e in endpoints] == ["e1", "e2"]
    assert "endpoints (2) id=e1" in out and "endpoints (2) id=e2" in out
    lines = [line.split() for line in out.splitlines()]
    for field, value in (
        ("url", "http://127.0.0.1:9"),
        ("models", "base"),
        ("pool", "default"),
        ("stale", "yes"),
        ("engine", "-"),
        ("breaker", "closed"),
    ):
        assert [field, value] in lines, field
    for field in endpoints[0]:  # every field, on a line of its own
        assert [line for line in lines if line[:1] == [field]], field


def text(view: RenderableType, width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(view)
    return console.export_text()


def test_generic_tables_for_answers_not_in_llmgw_shape() -> None:
    """An answer in none of llmgw's shapes (another tool's admin API, a newer or older
    llmgw) is still shown: a table whose columns are the records' keys."""
    nodes = {
        "nodes": [
            {"id": "gpu-1", "state": "ready", "gpus": 8, "labels": {"zone": "a"}},
            {"id": "gpu-2", "state": "unreachable", "gpus": 4, "fabric": "ib-a"},
        ]
    }
    assert render("nodes", nodes) is None  # not llmgw's nodes: no readable view
    out = text(render_table(nodes, "nodes"))
    # columns are the union of the records' keys, in first-seen order
    header = next(line for line in out.splitlines() if "state" in line)
    assert header.index("id") < header.index("state") < header.index("fabric")
    assert "gpu-2" in out and "unreachable" in out and "ib-a" in out
    assert '{"zone":"a"}' in out
    # a mapping of records keyed by id; a lone object as key and value
    placement = {"llama": {"placed": 1, "reasons": ["gpu-3: 2 free GPUs, needs 4"]}}
    out = text(render_table(placement, "placement"))
    assert "llama" in out and "gpu-3: 2 free GPUs, needs 4" in out
    out = text(render_table({"total": 3, "window": "1h"}, "keys"))
    assert ["total", "3"] in [line.split() for line in out.splitlines()]
    assert text(render_table({"items": []}, "usage")).strip() == "no usage"
    # too wide for a row each: one field per line
    wide = {f"field_{i}": f"value-{i}-" + "x" * 20 for i in range(12)}
    out = text(render_table({"replicas": [{"id": "r1", **wide}]}, "replicas"))
    assert "replicas (1) id=r1" in out
    for key, value in wide.items():
        assert [key, value] in [line.split() for line in out.splitlines()]


async def test_drain(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    async with live_admin(tmp_path) as admin:
        inventory = admin.controller.inventory
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "drain", "gpu-1")
        assert (code, err) == (0, "")
        record = inventory.get("gpu-1")
        assert record is not None and record.cordoned
        # What the drain does, from the node the API answers (202): llama's two replicas
        # run on gpu-1 and move.
        assert admin.exchanges[-1].status == 202
        llama = sorted(admin.controller.reconciler.replicas)
        assert out == (
            "node gpu-1: ready, connected, draining (cordoned: no new shards, its replicas "
            "move elsewhere)\n"
            "moving 2 replicas elsewhere, each drained once its replacement is ready:\n"
            + "".join(f"  {r} (model llama)\n" for r in llama)
            + "undo: llmgw-ctl nodes uncordon gpu-1\n"
        )

        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "--json", "drain", "gpu-2")
        assert code == 0 and json.loads(out) == admin.exchanges[-1].answer
        assert json.loads(out)["id"] == "gpu-2" and json.loads(out)["cordoned"] is True

        code, out, err = await ctl_async(capsys, "--admin", admin.url, "drain", "nope")
        assert code == 1 and out == ""
        assert (
            err == f"llmgw-ctl: error: admin API at {admin.url}: no node 'nope' (404 Not Found)\n"
        )
        assert [r[:2] for r in admin.requests] == [
            ("POST", "/api/v1/nodes/gpu-1/drain"),
            ("POST", "/api/v1/nodes/gpu-2/drain"),
            ("POST", "/api/v1/nodes/nope/drain"),
        ]


async def test_node_cordon_uncordon_and_forget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        inventory = admin.controller.inventory
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "nodes", "cordon", "gpu-1")
        assert (code, err) == (0, "")
        record = inventory.get("gpu-1")
        assert record is not None and record.cordoned and not record.draining
        llama = sorted(admin.controller.reconciler.replicas)
        assert out == (
            "node gpu-1: ready, connected, cordoned (no new shards, its replicas stay)\n"
            "2 replicas stay on it:\n"
            + "".join(f"  {r} (model llama)\n" for r in llama)
            + "undo: llmgw-ctl nodes uncordon gpu-1\n"
        )
        # The stand-alone verb, on the node the scenario cordoned.
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "uncordon", "gpu-5")
        assert (code, err) == (0, "")
        assert out == (
            "node gpu-5: ready, connected, not cordoned\nplacement may put new shards on it again\n"
        )
        assert not inventory.get("gpu-5").cordoned  # type: ignore[union-attr]

        # Forget: refused for a connected node, done for the lost one.
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "nodes", "forget", "gpu-2")
        assert code == 1 and out == ""
        assert "node 'gpu-2' is connected: stop its agent first" in err
        assert "gpu-2" in inventory
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "nodes", "forget", "gpu-4")
        assert (code, err) == (0, "")
        assert out == (
            "forgot node gpu-4\nit was lost; if its agent comes back it registers as a new node\n"
        )
        assert "gpu-4" not in inventory
        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "--json", "nodes", "uncordon", "gpu-1"
        )
        assert code == 0 and json.loads(out) == admin.exchanges[-1].answer
        assert json.loads(out)["cordoned"] is False
        assert [r[:2] for r in admin.requests] == [
            ("POST", "/api/v1/nodes/gpu-1/cordon"),
            ("POST", "/api/v1/nodes/gpu-5/uncordon"),
            ("DELETE", "/api/v1/nodes/gpu-2"),
            ("DELETE", "/api/v1/nodes/gpu-4"),
            ("POST", "/api/v1/nodes/gpu-1/uncordon"),
        ]


async def test_missing_api_and_server_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --admin naming a web server that is not llmgw: 404 with a non-JSON body.
    with not_llmgw(tmp_path) as url:
        code, out, err = await ctl_async(capsys, "--admin", url, "models")
    assert (code, out) == (1, "")
    assert err == f"llmgw-ctl: error: admin API at {url}: no /api/v1/models (404 Not Found)\n"

    async with live_admin(tmp_path) as admin:
        # An admin API without this route (an older llmgw): its 404 names the route.
        admin.app.routes = [r for r in admin.app.routes if r.path != "/api/v1/models"]
        del admin.app.quart  # made again from the routes left
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "models")
        assert (code, out) == (1, "")
        assert err == (
            f"llmgw-ctl: error: admin API at {admin.url}: no route GET /api/v1/models "
            "(404 Not Found)\n"
        )

        # A handler that fails: the server logs it and answers 500.
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(control_views, "replicas_json", broken)
        code, _, err = await ctl_async(capsys, "--admin", admin.url, "replicas")
        assert code == 1
        assert err == (
            "llmgw-ctl: error: admin API answered 500 to GET /api/v1/replicas: "
            "internal error (logged by the server)\n"
        )

        # The store fails: 503, saying how.
        async def locked(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("database is locked")

        monkeypatch.setattr(admin.store, "list_keys", locked)
        code, _, err = await ctl_async(capsys, "--admin", admin.url, "keys")
        assert code == 1
        assert err == (
            "llmgw-ctl: error: admin API answered 503 to GET /api/v1/keys: "
            "the store failed: database is locked\n"
        )
        assert [e.status for e in admin.exchanges] == [404, 500, 503]


async def test_admin_auth_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    async with live_admin(tmp_path, admin_auth=True) as admin:
        ops, secret = await admin.store.create_key("ops", admin=True)
        _, user = await admin.store.create_key("user")
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "keys")
        assert (code, out) == (1, "")
        assert err == (
            "llmgw-ctl: error: admin API refused GET /api/v1/keys: 401 the admin API needs "
            "an admin key: send Authorization: Bearer <secret>; pass --admin-key\n"
        )
        code, _, err = await ctl_async(capsys, "--admin", admin.url, "--admin-key", user, "keys")
        assert code == 1 and err.startswith("llmgw-ctl: error: admin API refused GET ")
        assert "403" in err and "is not an admin key" in err and "--admin-key" not in err
        code, out, err = await ctl_async(
            capsys, "--admin", admin.url, "--admin-key", secret, "keys"
        )
        assert (code, err) == (0, "") and "ops" in out and "user" in out
        # The last admin key: the API refuses to revoke it, naming the parameter.
        code, _, err = await ctl_async(
            capsys, "--admin", admin.url, "--admin-key", secret, "keys", "revoke", "ops"
        )
        assert code == 1
        assert err == (
            f"llmgw-ctl: error: admin API answered 409 to DELETE /api/v1/keys/{ops.id}: "
            f"{ops.id} is the last usable admin key, and this admin API needs one: create "
            "another admin key first (param id)\n"
        )
        # The listing also asks for the admission view (the default band of keys).
        assert [(e.status, e.target) for e in admin.exchanges][2:4] == [
            (200, "/api/v1/keys"),
            (200, "/api/v1/admission"),
        ]
        assert [e.status for e in admin.exchanges] == [401, 403, 200, 200, 200, 409]


def test_unreachable_admin(capsys: pytest.CaptureFixture[str]) -> None:
    with reserve_port() as port:  # held, so nothing listens there
        url = f"http://127.0.0.1:{port}"
        code, out, err = ctl(capsys, "--admin", url, "nodes")
    assert (code, out) == (1, "")
    assert err == f"llmgw-ctl: error: cannot reach admin API at {url}: connection refused\n"


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = ctl(capsys, "bench", "--url", "http://x", "--model", "m", "--concurrency", "0")
    assert code == 2 and err.count("\n") == 1 and "--concurrency" in err
    code, _, err = ctl(
        capsys, "bench", "--url", "http://x", "--model", "m", "--target-ttft", "500ms"
    )
    assert code == 2 and err == (
        "llmgw-ctl: error: --target-ttft needs --sweep C1,C2,... (the concurrencies to measure)\n"
    )
    code, _, err = ctl(capsys, "bench", "--url", "http://x", "--model", "m", "--duration", "soon")
    assert code == 2 and "--duration" in err and err.count("\n") == 1


# ------------------------------------------------------------- keys, usage, models


async def test_keys_create_prints_the_secret_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        # --admin after the command is the admin API's URL, as before it (issue #33:
        # the key's role is --role, no longer a second --admin).
        argv = ["keys", "create", "--name", "ci", "--band", "silver", "--admin", admin.url,
                "--models", "base,llama", "--rpm", "60", "--tpm", "5000", "--role", "admin",
                "--expires-in", "30d"]  # fmt: skip
        code, out, err = await ctl_async(capsys, *argv)
        assert (code, err) == (0, "")
        assert admin.bodies == [
            {"name": "ci", "band": "silver", "models": ["base", "llama"], "rpm": 60,
             "tpm": 5000, "expires_in_seconds": 30 * 86400.0, "admin": True}
        ]  # fmt: skip
        (secret,) = re.findall(r"^    (llmgw-\S+)$", out, re.MULTILINE)
        assert out.count(secret) == 1 and secret == admin.exchanges[0].answer["secret"]
        assert "cannot be shown again" in out
        assert "first usable key" in out  # the only active key in the listing
        key = await admin.store.lookup_key(secret)  # the secret printed is the key's
        assert key is not None and (key.name, key.band, key.models) == (
            "ci", "silver", ("base", "llama")
        )  # fmt: skip
        assert (key.rpm, key.tpm, key.admin) == (60, 5000, True)

        # The name is taken while that key is not revoked: one line, exit 1.
        admin.exchanges.clear()
        code, out, err = await ctl_async(
            capsys, "--admin", admin.url, "keys", "create", "--name", "ci"
        )
        assert (code, out) == (1, "")
        assert err == (
            "llmgw-ctl: error: admin API answered 409 to POST /api/v1/keys: name: a key "
            f"named 'ci' exists ({key.id}) and is not revoked: choose another name, or "
            "revoke that key first\n"
        )

        admin.exchanges.clear()
        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "keys", "create", "--name", "ci-2", "--json"
        )
        assert code == 0 and json.loads(out) == admin.exchanges[0].answer
        assert json.loads(out)["secret"] != secret
        assert admin.bodies == [{"name": "ci-2"}]

    code, _, err = ctl(capsys, "keys", "create", "--name", "x", "--models", "a,,b")
    assert code == 2 and "--models" in err and err.count("\n") == 1
    code, _, err = ctl(capsys, "keys", "create", "--band", "gold")
    assert code == 2 and "--name" in err and err.count("\n") == 1


async def legacy_keys(db: Path, *names: str) -> list[str]:
    """Keys made in `db` at schema version 1, before names were unique (so they may
    share one); their ids, in order. The next open_store migrates them along."""
    store = SQLiteStore(str(db), migrations=SQLITE_MIGRATIONS[:1])
    await store.start()
    try:
        await store.migrate()
        ids = [f"key_legacy{i}" for i in range(len(names))]
        for i, (key_id, name) in enumerate(zip(ids, names, strict=True)):
            sql = "INSERT INTO api_keys (id, name, prefix, hash, created_at) VALUES (?, ?, ?, ?, ?)"
            params = (key_id, name, "llmgw-legacy", f"hash-{i}", 1_700_000_000.0 + i)
            await store._write(partial(lambda db, q, p: db.run(q, p), q=sql, p=params))
    finally:
        await store.aclose()
    return ids


async def test_keys_revoke_resolves_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    twin_a, twin_b = await legacy_keys(tmp_path / "llmgw.db", "twin", "twin")
    async with live_admin(tmp_path) as admin:
        store = admin.store
        old, _ = await store.create_key("ci")
        await store.revoke_key(old.id)
        new, _ = await store.create_key("ci")
        gone, _ = await store.create_key("gone")
        await store.revoke_key(gone.id)
        # A name reused after revoking: several keys, all revoked.
        for _ in "ab":
            reused, _ = await store.create_key("reused")
            await store.revoke_key(reused.id)

        # a name matching a revoked key and a live one means the live one
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", "ci")
        assert code == 0 and out.startswith(f"revoked key 'ci' ({new.id})")
        record = await store.get_key(new.id)
        assert record is not None and record.revoked_at is not None
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", old.id)
        assert code == 0 and "already revoked" in out
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", "gone")
        assert code == 0 and "already revoked" in out
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", "reused")
        assert (code, out) == (0, f"key 'reused' ({reused.id}) was already revoked\n")
        # Live keys sharing a name: only those from before names were unique.
        code, out, err = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", "twin")
        assert (code, out) == (1, "")
        assert err == (
            f"llmgw-ctl: error: 2 keys are named 'twin' ({twin_a}, {twin_b}): "
            "revoke one by its id\n"
        )
        code, _, err = await ctl_async(capsys, "--admin", admin.url, "keys", "revoke", "nobody")
        assert code == 1 and "no key with the id or name 'nobody'" in err
        deletes = [r[1] for r in admin.requests if r[0] == "DELETE"]
        assert deletes == [f"/api/v1/keys/{k}" for k in (new.id, old.id, gone.id, reused.id)]
        active = [k.name for k in await store.list_keys() if k.revoked_at is None]
        assert active == ["twin", "twin"]


async def test_api_errors_name_the_parameter(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with live_admin(tmp_path) as admin:
        code, _, err = await ctl_async(
            capsys, "--admin", admin.url, "keys", "create", "--name", "n", "--models", "z"
        )
        assert code == 1
        # the message starts with the parameter: not named twice
        assert err == (
            "llmgw-ctl: error: admin API answered 400 to POST /api/v1/keys: "
            "models[0]: no model or alias named 'z'\n"
        )
        code, _, err = await ctl_async(capsys, "--admin", admin.url, "models", "remove", "nope")
        assert code == 1
        assert err == (
            f"llmgw-ctl: error: admin API at {admin.url}: no runtime model 'nope' (404 Not Found)\n"
        )
        assert await admin.store.list_keys() == []


async def test_usage_parameters(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bucket = 1700002800.0  # 2023-11-14 23:00 UTC
    llama = [UsageRecord("llama", "e1", 500 if i < 3 else 200, Usage(), 1.5, 0.25)
             for i in range(1200)]  # fmt: skip
    llama[0] = attrs.evolve(llama[0], usage=Usage(1234567, 89, 0))
    qwen = [UsageRecord("qwen", "e2", 200, Usage(), 0.5) for _ in range(800)]
    qwen[0] = attrs.evolve(qwen[0], usage=Usage(10, 11, 5))
    async with live_admin(tmp_path) as admin:
        await admin.store.record_usage(
            [(bucket + i % 3600, record) for i, record in enumerate(llama + qwen)]
        )
        argv = ["--admin", admin.url, "usage", "--by", "model", "--since", "2023-11-14T22:13:20",
                "--until", "1h", "--bucket", "1h"]  # fmt: skip
        code, out, err = await ctl_async(capsys, *argv)
        assert (code, err) == (0, "")
        assert admin.requests[-1][1] == (
            "/api/v1/usage?group_by=model&since=1700000000&until=1h&bucket=1h"
        )
        assert "usage by model since 2023-11-14 22:13:20 UTC" in out and ", per 1h" in out
        assert words(out, "2023-11-14")[:3] == ["2023-11-14", "23:00", "llama"]
        assert words(out, "2023-11-14")[2:] == [
            "llama", "1,200", "1,234,567", "89", "0", "3", "1.50", "s", "250", "ms",
        ]  # fmt: skip
        qwen_row = next(line.split() for line in out.splitlines() if "qwen" in line)
        assert qwen_row[2:] == ["qwen", "800", "10", "11", "5", "0", "500", "ms", "-"]
        assert words(out, "total") == [
            "total", "2,000", "1,234,577", "100", "5", "3", "1.10", "s"
        ]  # fmt: skip

        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "usage", "--since", "2023-11-15T00:00+01:00"
        )
        assert code == 0 and admin.requests[-1][1] == "/api/v1/usage?since=1700002800"
        assert "usage by key since 2023-11-14 23:00 UTC" in out
        assert words(out, "(no")[:4] == ["(no", "key)", "2,000", "1,234,577"]
    for bad in (("--since", "last week"), ("--bucket", "500ms"), ("--by", "band")):
        code, _, err = ctl(capsys, "usage", *bad)
        assert code == 2 and bad[0] in err and err.count("\n") == 1


def _key(id: str, name: str, **kw: Any) -> dict[str, Any]:
    key = {
        "id": id, "name": name, "prefix": "llmgw-abcdefgh", "band": None, "models": None,
        "rpm": None, "tpm": None, "admin": False, "status": "active",
        "created_at": 1000.0, "expires_at": None, "revoked_at": None,
    }  # fmt: skip
    return {**key, **kw}


def served_document() -> dict[str, Any]:
    """The admin API's OpenAPI document, as an app of this module's configuration serves it."""
    config = load(data=CONFIG, environ={})
    status, doc = trio.run(AdminApp(Router(config)).call, "GET", "/api/v1/openapi.json")
    assert status == 200
    return dict(doc)


def test_readable_keys_and_models() -> None:
    now = 1_000_000.0
    keys = {
        "keys": [
            _key("key_1", "ops", admin=True, rpm=1500, tpm=2_000_000),
            _key("key_2", "old", status="revoked", revoked_at=now - 7200),
            _key("key_3", "temp", status="expired", expires_at=now - 90),
            _key("key_4", "ci", band="gold", models=["a"], expires_at=now + 30 * 86400),
        ]
    }
    models = {
        "models": [
            {"name": "llama", "aliases": ["l"], "fallbacks": [], "routing_profile": None,
             "replicas": 2, "profiles": [], "autoscale": None, "source": "config",
             "status": {"model": "llama", "desired": 2, "starting": 0, "ready": 1,
                        "draining": 0, "unplaced": 1, "backoff_seconds": None,
                        "failed_starts": 0, "moving": 0, "idle_seconds": None,
                        "requests_per_second": 0.0, "tokens_per_second": 0.0},
             "routing": {"endpoints": ["r1"], "available": 1, "waiting": 0}},
            {"name": "rt", "aliases": [], "fallbacks": ["llama"], "routing_profile": None,
             "replicas": 1, "profiles": [], "autoscale": None, "source": "runtime",
             "status": None,
             "routing": {"endpoints": [], "available": 0, "waiting": 0}},
        ]
    }  # fmt: skip
    # Hand-written answers, so they must be ones the admin API can give.
    doc = served_document()
    assert not schema_errors(doc, "KeyList", keys)
    assert not schema_errors(doc, "ModelList", models)

    out = text(ctl_views.keys(keys, now=now), width=200)
    rows = {line.split()[0]: line for line in out.splitlines()[3:] if line.strip()}
    assert "1.5k rpm, 2M tpm" in rows["ops"] and "yes" in rows["ops"]
    assert rows["old"].rstrip().endswith("revoked 2.0h ago")
    assert rows["temp"].rstrip().endswith("expired 90s ago")
    assert "gold" in rows["ci"] and rows["ci"].rstrip().endswith("active, expires in 30d")
    assert "no API keys" in text(render("keys", {"keys": []}))
    # A key without a band gets the server's default band, which the admission view names.
    assert words(out, "ops")[3] == "default"  # not known: the caller had no admission view
    admission = {"default_band": "silver", "bands": [{"name": n} for n in ("gold", "silver")]}
    bands = ctl_views.Bands.of(admission)
    assert bands == ctl_views.Bands("silver", ("gold", "silver"))
    out = text(render("keys", keys, bands), width=200)
    assert words(out, "ops")[3:5] == ["silver", "(default)"]
    assert words(out, "ci")[3] == "gold"
    # As the router resolves it: exact, then ignoring case; else it is refused (400).
    assert ctl_views.key_band({"band": "GOLD"}, bands) == "gold"
    assert ctl_views.key_band({"band": "tin"}, bands) == "tin (no such band: requests get 400)"
    assert ctl_views.key_band({"band": ""}, bands) == "silver (default)"
    assert ctl_views.Bands.of({"bands": []}) is None  # not llmgw's admission view

    out = text(render("models", models), width=200)
    assert words(out, "llama") == [
        "llama", "config", "l", "-", "1/2", "-", "1/1", "available:", "r1"
    ]  # fmt: skip
    assert words(out, "rt") == ["rt", "runtime", "-", "llama", "-", "-", "none"]
    # An autoscaled model at zero with requests waiting for its first replica.
    woken = {
        "name": "z", "aliases": [], "fallbacks": [], "routing_profile": None, "replicas": 0,
        "profiles": [], "source": "runtime",
        "autoscale": {"min_replicas": 0, "max_replicas": 3, "idle_timeout": "10m",
                      "target_saturation": 0.7, "scale_up_window": "30s",
                      "scale_down_window": "5m", "cold_start_timeout": "10m"},
        "status": {"model": "z", "desired": 1, "starting": 1, "ready": 0, "draining": 0,
                   "unplaced": 0, "backoff_seconds": None, "failed_starts": 0, "moving": 0,
                   "idle_seconds": 0.5, "requests_per_second": 0.0, "tokens_per_second": 0.0},
        "routing": {"endpoints": [], "available": 0, "waiting": 2},
    }  # fmt: skip
    assert not schema_errors(doc, "ModelList", {"models": [woken]})
    out = text(render("models", {"models": [woken]}), width=200)
    assert words(out, "z") == ["z", "runtime", "-", "-", "0/1", "(2", "waiting)", "0-3", "none"]


def test_model_entries_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw_cli._common import CliError

    entry = {"name": "m", "fallbacks": ["base"], "replicas": 2}
    files = {
        "table.toml": '[[models]]\nname = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
        "bare.toml": 'name = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
        "bare.json": json.dumps(entry),
        "list.json": json.dumps({"models": [entry]}),
        "noext": json.dumps(entry),
        "noext-toml": 'name = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert read_model_entry(str(tmp_path / name)) == entry, name
    monkeypatch.setattr("sys.stdin", io.StringIO('name = "m"\nfallbacks = ["base"]\nreplicas = 2'))
    assert read_model_entry("-") == entry

    bad = {
        "two.toml": ('[[models]]\nname = "a"\n[[models]]\nname = "b"\n', "found 2 in 'models'"),
        "list.json": ("[1, 2]", "expected a catalog entry (an object), got list"),
        "empty.json": ("{}", "the catalog entry is empty"),
        "broken.toml": ("name = ", "not valid TOML"),
        "broken.json": ('{"name": "x",}', "not valid JSON"),
    }
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(CliError, match=re.escape(message)) as info:
            read_model_entry(str(tmp_path / name))
        assert info.value.code == 2 and "\n" not in str(info.value)


async def test_models_changes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "org/m", "fallbacks": ["base"]}))
    async with live_admin(tmp_path) as admin:
        code, out, _ = await ctl_async(capsys, "--admin", admin.url, "models", "add", str(path))
        assert code == 0 and out == "added model 'org/m' (runtime; fallbacks base)\n"
        model = admin.registry.catalog.resolve("org/m")
        assert model is not None and model.fallbacks == ("base",)
        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "models", "set-replicas", "org/m", "0"
        )
        assert code == 0 and out.startswith("model 'org/m': 0 replica(s) desired\n")
        assert "no deployment profiles" in out
        model = admin.registry.catalog.resolve("org/m")
        assert model is not None and model.replicas == 0
        code, out, _ = await ctl_async(
            capsys, "--admin", admin.url, "--json", "models", "remove", "org/m"
        )
        assert code == 0 and json.loads(out) == {"model": "org/m", "removed": True}
        assert admin.registry.catalog.resolve("org/m") is None
        assert await admin.store.list_models() == []
        assert admin.bodies == [{"name": "org/m", "fallbacks": ["base"]}, {"replicas": 0}]
        assert [(e.method, e.target, e.status) for e in admin.exchanges] == [
            ("POST", "/api/v1/models", 201),
            ("PATCH", "/api/v1/models/org%2Fm", 200),
            ("DELETE", "/api/v1/models/org%2Fm", 204),
        ]


# ------------------------------------------------------------- bench vs simulator


def _run_ctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-ctl"), *argv], capture_output=True, text=True, timeout=60
    )


def test_bench_against_simulator() -> None:
    with sim(model="sim-a") as (_proc, base):
        # streaming chat, ignore_eos so every response is exactly --output-tokens
        done = _run_ctl(
            "bench", "--url", base, "--model", "sim-a", "--json",
            "--requests", "24", "--concurrency", "4", "--prompt-tokens", "32",
            "--output-tokens", "8", "--shared-prefix-ratio", "0.5", "--prefix-groups", "2",
            "--seed", "7",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # no progress bar when not a TTY / with --json
        report = json.loads(done.stdout)
        s = report["summary"]
        assert (s["requests"], s["ok"], s["failed"], s["errors"]) == (24, 24, 0, {})
        assert s["completion_tokens"] == 24 * 8
        assert s["prompt_tokens"] >= 24 * 32
        assert s["cached_tokens"] > 0, "the shared prefix should hit the simulator's cache"
        assert 0 < s["ttft"]["p50"] <= s["e2e"]["p50"]
        assert s["ttft"]["max"] <= s["e2e"]["max"]
        assert s["ttft"]["min"] <= s["ttft"]["p50"] <= s["ttft"]["p90"] <= s["ttft"]["p99"]
        assert s["itl"]["count"] == 24 * 7
        assert s["request_throughput"] > 0 and s["output_token_throughput"] > 0
        assert report["config"]["workload"]["seed"] == 7

        # plain completions, not streamed
        done = _run_ctl(
            "bench", "--url", base + "/v1", "--model", "sim-a", "--json", "--no-stream",
            "--endpoint", "completions", "--requests", "6", "--concurrency", "3",
            "--prompt-tokens", "16", "--output-tokens", "5",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        s = json.loads(done.stdout)["summary"]
        assert s["ok"] == 6 and s["completion_tokens"] == 30 and s["ttft"] is None

        # a sweep reads the simulator's waiting queue and suggests scoring targets
        done = _run_ctl(
            "bench", "--url", base, "--model", "sim-a", "--json", "--sweep", "1,2",
            "--requests", "6", "--prompt-tokens", "16", "--output-tokens", "4",
            "--target-ttft", "10s",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert [st["concurrency"] for st in report["steps"]] == [1, 2]
        assert all(st["passed"] and st["engine"] is not None for st in report["steps"])
        assert report["suggestion"]["capacity"] == 2
        assert report["suggestion"]["target_waiting"] >= 1

        # a wrong model is a runtime failure, reported in one line
        done = _run_ctl("bench", "--url", base, "--model", "nope", "--requests", "2")
        assert done.returncode == 1
        assert done.stderr.startswith("llmgw-ctl: error: no request succeeded (2 x 404")
        assert done.stderr.count("\n") == 1


def test_bench_unreachable_target() -> None:
    with reserve_port() as port:  # held, so nothing listens there
        url = f"http://127.0.0.1:{port}"
        done = _run_ctl("bench", "--url", url, "--model", "m", "--requests", "3", "--json")
    assert done.returncode == 1
    assert done.stderr.startswith("llmgw-ctl: error: no request succeeded (3 x connect_error")
    assert json.loads(done.stdout)["summary"]["errors"] == {"connect_error": 3}


async def test_output_cut_by_its_reader_ends_without_a_traceback(tmp_path: Path) -> None:
    """`llmgw-ctl --json keys | head` (issue #33): the reader left before the output."""
    read, write = os.pipe()
    os.close(read)  # a pipe whose reader has gone: the first write fails
    try:
        async with live_admin(tmp_path) as admin:
            done = await trio.run_process(
                [str(BIN / "llmgw-ctl"), "--admin", admin.url, "--json", "keys"],
                stdout=write,
                capture_stderr=True,
                check=False,
            )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, b"")
