"""What an API key decides, seen from outside a real llmgw-server (SQLite store): the
admission band and tenant of its requests, the opt-in per-key Prometheus counters, and
that its secret never reaches the server's logs, even at debug level.

Both store backends run the key, usage and runtime-model tests in test_auth_e2e.py;
these depend on the router, not on where keys are kept.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from llmgw.config import AuthConfig, Config, EndpointConfig
from llmgw.domain.keys import KeyRecord
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.router.core import Router
from llmgw.router.metrics import KeyMetrics, RouterMetrics
from llmgw.store import open_store
from llmgw.store.keys import display_prefix
from llmgw.testing.procs import Proc

from .procs import Server, server, sim, wait_for
from .waiting import wait_until

CONFIG = """
[store]
url = "sqlite:///{path}"
[router]
scrape_interval = "100ms"
scrape_timeout = "80ms"
"""
DEADLINE = 30.0  # seconds per test body: a hang fails instead of blocking CI


def create_keys(path: Path, **specs: dict[str, Any]) -> dict[str, tuple[KeyRecord, str]]:
    """Keys created in the store before the server starts: name -> (record, secret)."""

    async def create() -> dict[str, tuple[KeyRecord, str]]:
        store = await open_store(f"sqlite:///{path}")
        try:
            return {name: await store.create_key(name, **kw) for name, kw in specs.items()}
        finally:
            await store.aclose()

    return trio.run(create)


def client(base: str, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=secret, max_retries=0, timeout=30)


# -- per-key counters ---------------------------------------------------------------------


def test_per_key_counters_count_each_keys_requests_and_tokens(tmp_path: Path) -> None:
    """With `auth.key_metrics = true`, llmgw_key_requests_total and llmgw_key_tokens_total
    match what two keys' clients were answered (the default, off, is in test_auth_e2e)."""
    db = tmp_path / "llmgw.db"
    keys = create_keys(db, alice={}, bob={})
    alice, bob = keys["alice"][0].id, keys["bob"][0].id
    sent: dict[str, dict[str, int]] = {
        k: {"requests": 0, "prompt": 0, "completion": 0} for k in (alice, bob)
    }

    def count(key: str, usage: Any) -> None:
        sent[key]["requests"] += 1
        sent[key]["prompt"] += usage.prompt_tokens
        sent[key]["completion"] += usage.completion_tokens

    config = CONFIG.format(path=db) + "[auth]\nkey_metrics = true\n"
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=config) as srv,
    ):
        srv.wait_scraped()
        messages: Any = [{"role": "user", "content": "tell me something"}]
        for key, secret, n in ((alice, keys["alice"][1], 3), (bob, keys["bob"][1], 1)):
            for i in range(n):
                reply = client(srv.base, secret).chat.completions.create(
                    model="m", messages=messages, max_tokens=3 + i
                )
                count(key, reply.usage)
        # A stream counts too, with the usage the engine reported at its end.
        stream = client(srv.base, keys["bob"][1]).chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        (usage,) = [chunk.usage for chunk in stream if chunk.usage is not None]
        count(bob, usage)
        # Refused before any engine (unknown key): not a key's request.
        with pytest.raises(openai.AuthenticationError):
            client(srv.base, "llmgw-unknown").models.list()

        def exported() -> dict[str, dict[str, float]]:
            return {
                key: {
                    "requests": srv.metric("llmgw_key_requests_total", key=key),
                    "ok": srv.metric("llmgw_key_requests_total", key=key, model="m", status="200"),
                    "prompt": srv.metric("llmgw_key_tokens_total", key=key, kind="prompt"),
                    "completion": srv.metric(
                        "llmgw_key_tokens_total", key=key, model="m", kind="completion"
                    ),
                }
                for key in (alice, bob)
            }

        # The counters move after the response is out: poll until every request is in.
        wait_for(
            lambda: all(exported()[k]["requests"] == sent[k]["requests"] for k in sent),
            "every request in llmgw_key_requests_total",
            timeout=10,
        )
        got = exported()
        text = httpx.get(f"{srv.admin}/metrics", timeout=5).text
    assert sent[alice]["requests"] == 3 and sent[bob]["requests"] == 2
    assert all(sent[k]["prompt"] > 0 and sent[k]["completion"] > 0 for k in sent), sent
    for key in (alice, bob):
        assert got[key] == {**sent[key], "ok": sent[key]["requests"]}, (key, got, sent)
    # Labelled by the key's id; its secret is nowhere in the exposition.
    for _, secret in keys.values():
        assert display_prefix(secret) not in text


async def test_per_key_counters_are_registered_only_when_enabled() -> None:
    """The switch decides whether the Router registers the families; requests without a
    key (keys not in use yet) add no series."""
    endpoints = (EndpointConfig(id="e1", url="http://127.0.0.1:9", models=("m",)),)
    off = Router(Config(endpoints=endpoints))
    on = Router(Config(endpoints=endpoints, auth=AuthConfig(key_metrics=True)))
    names = {m.name for m in off.metrics.registry.collect()}
    assert "llmgw_requests" in names and "llmgw_key_requests" not in names
    (sink,) = [s for s in on.pipeline.account.sinks if isinstance(s, KeyMetrics)]
    sink.record(UsageRecord("m", "e1", 200, Usage(7, 3), 0.1))
    sink.record(UsageRecord("m", "e1", 200, Usage(7, 3), 0.1, key_id="key_1"))
    sink.record(UsageRecord("m", "e1", 500, Usage(), 0.1, key_id="key_1"))
    registry = on.metrics.registry
    assert (
        registry.get_sample_value(
            "llmgw_key_requests_total", {"key": "key_1", "model": "m", "status": "200"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "llmgw_key_requests_total", {"key": "key_1", "model": "m", "status": "500"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "llmgw_key_tokens_total", {"key": "key_1", "model": "m", "kind": "prompt"}
        )
        == 7
    )
    samples = [s for m in registry.collect() for s in m.samples if s.name.startswith("llmgw_key_")]
    assert {s.labels["key"] for s in samples} == {"key_1"}


async def test_refusals_carry_the_key_only_when_key_metrics_is_on() -> None:
    """llmgw_rejected_requests_total gains a `key` label (the key's id) with
    auth.key_metrics (issue #17), and only then: each process has one label set."""
    endpoints = (EndpointConfig(id="e1", url="http://127.0.0.1:9", models=("m",)),)
    off = Router(Config(endpoints=endpoints)).metrics
    on = Router(Config(endpoints=endpoints, auth=AuthConfig(key_metrics=True))).metrics
    for metrics in (off, on):
        metrics.reject("rpm_exceeded", "m", "key_1")
        metrics.reject("invalid_api_key", "", None)

    def samples(metrics: RouterMetrics) -> list[dict[str, str]]:
        return [
            s.labels
            for m in metrics.registry.collect()
            for s in m.samples
            if s.name == "llmgw_rejected_requests_total"
        ]

    assert samples(off) == [
        {"reason": "rpm_exceeded", "model": "m"},
        {"reason": "invalid_api_key", "model": ""},
    ]
    assert samples(on) == [
        {"reason": "rpm_exceeded", "model": "m", "key": "key_1"},
        {"reason": "invalid_api_key", "model": "", "key": ""},
    ]


# -- the key decides the band and is the tenant ------------------------------------------

ADMISSION_SIM = ("--max-num-seqs", "4")
# Saturation is about "requests in flight / 4" (the endpoint's capacity): four long
# streams fill the pool (as in test_admission_e2e.py).
ADMISSION_ENDPOINT = """
[[endpoints]]
id = "s0"
url = "{url}"
models = ["m"]
capacity = 4
"""
LONG = 3000  # tokens: far longer than the test; the streams are cut when it ends


async def stream(
    http: httpx.AsyncClient,
    secret: str,
    band_header: str,
    tenant_header: str,
    started: trio.Event | None = None,
) -> None:
    """One long streamed completion; `started` is set at its first content event."""
    headers = {
        "authorization": f"Bearer {secret}",
        "x-llmgw-band": band_header,
        "x-llmgw-tenant": tenant_header,
    }
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": LONG,
        "stream": True,
    }
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if started is not None and line.startswith("data: {") and '"content"' in line:
                started.set()
                started = None


async def until(srv: Server, name: str, check: Callable[[float], bool], **labels: str) -> None:
    """Wait until a metric (absent counts as 0) has a value for which `check` holds."""
    seen: list[float] = []

    async def holds() -> bool:
        seen.append(await trio.to_thread.run_sync(lambda: srv.metric(name, **labels)))
        return check(seen[-1])

    await wait_until(holds, f"{name}{labels} as expected", context=lambda: f"value: {seen[-1:]}")


@pytest.fixture
def admission_fleet(tmp_path: Path) -> Iterator[tuple[Server, dict[str, tuple[KeyRecord, str]]]]:
    db = tmp_path / "llmgw.db"
    keys = create_keys(db, holder={}, one={"band": "bronze"}, two={"band": "bronze"})
    with (
        sim(*ADMISSION_SIM, model="m") as (_, engine),
        server(config=CONFIG.format(path=db) + ADMISSION_ENDPOINT.format(url=engine)) as srv,
    ):
        srv.wait_scraped()
        yield srv, keys


def test_the_key_decides_the_band_and_is_the_tenant(
    admission_fleet: tuple[Server, dict[str, tuple[KeyRecord, str]]],
) -> None:
    """Band and tenant headers are ignored once keys are in use: a key without a band
    gets the default band (gold), a bronze key queues in bronze even when it asks for
    platinum, and each key is one tenant however many tenant headers it sends."""
    srv, keys = admission_fleet
    secret = {name: s for name, (_, s) in keys.items()}

    async def main() -> None:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        with trio.fail_after(DEADLINE):
            await scenario(limits)

    async def scenario(limits: httpx.Limits) -> None:
        async with (
            httpx.AsyncClient(base_url=srv.base, timeout=30, limits=limits) as http,
            trio.open_nursery() as nursery,
        ):
            # Four streams of the band-less key saying "bronze" fill the pool. As
            # bronze (ceiling 0.30) the third would wait; as gold (0.85) all get in.
            for i in range(4):
                started = trio.Event()
                nursery.start_soon(stream, http, secret["holder"], "bronze", f"h{i}", started)
                await started.wait()
            await until(srv, "llmgw_admission_pool_saturation_ratio", lambda v: v == 1.0)
            # Two bronze keys ask for platinum, each request as a tenant of its own.
            for i in range(6):
                name = ("one", "two")[i % 2]
                nursery.start_soon(stream, http, secret[name], "platinum", f"t{i}")
            await until(srv, "llmgw_admission_queue_depth", lambda v: v == 6, band="bronze")
            assert srv.metric("llmgw_admission_queue_depth", band="platinum") == 0
            # Six tenant headers, two keys: two tenants.
            assert srv.metric("llmgw_admission_queue_tenants", band="bronze") == 2
            admission = (await http.get(srv.admin + "/api/v1/admission")).json()
            (pool,) = admission["pools"]
            queued = {b["band"]: b for b in pool["bands"]}
            assert queued["bronze"]["depth"] == 6 and queued["bronze"]["tenants"] == 2
            assert queued["platinum"]["depth"] == 0
            # Counted while everything still waits: once the streams are cut below,
            # a freed slot may go to a queued request before its client's going is seen.
            admitted = await trio.to_thread.run_sync(admitted_by_band)
            assert admitted == {"gold": 4, "bronze": 0, "platinum": 0}, admitted
            nursery.cancel_scope.cancel()  # cuts the streams and the queued requests

    def admitted_by_band() -> dict[str, float]:
        total = "llmgw_admission_admitted_total"
        return {
            "gold": srv.metric(total, band="gold", queued="false"),
            "bronze": srv.metric(total, band="bronze"),
            "platinum": srv.metric(total, band="platinum"),
        }

    trio.run(main)
    # Each of the six queued requests ends once: abandoned with its client, or admitted
    # in the moment between a slot freeing up and the disconnect being seen.
    wait_for(
        lambda: (
            srv.metric("llmgw_admission_abandoned_total", band="bronze")
            + srv.metric("llmgw_admission_admitted_total", band="bronze")
            == 6
        ),
        "the six queued bronze requests each ended (abandoned, or admitted in the race)",
        timeout=10,
    )


# -- secrets never in the logs ------------------------------------------------------------

# llmgw-server with every logger at DEBUG: --log-level debug opens llmgw's own loggers
# only (llmgw.logs.setup), so its setup is wrapped to open every other one too, httpx's
# and httpcore's included (whose levels set at import are reset to inherit DEBUG).
DEBUG_SERVER = """
import logging, sys
from llmgw import logs
from llmgw_cli.server import main
own = logs.setup
def everything(level, fmt, stream=None):
    own(level, fmt, stream)
    logging.root.setLevel(logging.DEBUG)
    for name in list(logging.root.manager.loggerDict):
        logging.getLogger(name).setLevel(logging.NOTSET)
    logging.getLogger("llmgw").debug("debug logging on")
logs.setup = everything
main(sys.argv[1:])
"""


def leaked(secret: str, text: str, window: int = 12) -> list[str]:
    """Pieces of the secret's hidden part (after the prefix listings show) found in
    `text`: any `window` characters of it (72 random bits) count, so a truncated or
    partly masked secret is caught too."""
    hidden = secret[len(display_prefix(secret)) :]
    assert len(hidden) >= window
    pieces = [hidden[i : i + window] for i in range(len(hidden) - window + 1)]
    return [piece for piece in pieces if piece in text]


def test_secrets_never_reach_the_logs_even_at_debug(tmp_path: Path) -> None:
    config = tmp_path / "llmgw.toml"
    config.write_text(CONFIG.format(path=tmp_path / "llmgw.db"))
    with sim(model="m") as (_, engine):
        proc = Proc(
            [
                sys.executable, "-c", DEBUG_SERVER, "--log-level", "debug",
                "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                "--ready-file", str(tmp_path / "ready.json"),
                "--config", str(config), "--endpoint", f"s0={engine}=m,other",
            ],
            tmp_path / "server.log",
        )  # fmt: skip
        try:
            proc.wait_ready_file(tmp_path / "ready.json")
            secrets, ids = exercise_keys(proc.url("listen"), proc.url("admin_listen"))
            assert proc.stop() == 0
        finally:
            proc.stop()
    log = proc.log.read_text(errors="replace")
    assert "DEBUG llmgw: debug logging on" in log
    # The log does speak of the keys, by id.
    assert f"dashboard login with key {ids['ops']} (ops)" in log
    for name, secret in secrets.items():
        assert not leaked(secret, log), (name, leaked(secret, log))


def exercise_keys(base: str, admin: str) -> tuple[dict[str, str], dict[str, str]]:
    """Create keys through the admin API and use them every way that succeeds or fails."""
    created = {}
    for body in (
        {"name": "app", "band": "silver", "models": ["m"], "rpm": 3},
        {"name": "ops", "admin": True},
    ):
        r = httpx.post(f"{admin}/api/v1/keys", json=body, timeout=5)
        assert r.status_code == 201, r.text
        created[str(body["name"])] = r.json()
    secret = created["app"]["secret"]
    messages: Any = [{"role": "user", "content": "x"}]
    app = client(base, secret)
    # Success: a request, a stream, the model list.
    app.chat.completions.create(model="m", messages=messages, max_tokens=2)
    chunks = app.chat.completions.create(model="m", messages=messages, max_tokens=2, stream=True)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert [m.id for m in app.models.list()] == ["m"]
    # Failures: a model the key may not use, the rate limit, mangled secrets.
    with pytest.raises(openai.PermissionDeniedError):
        app.chat.completions.create(model="other", messages=messages, max_tokens=2)
    app.chat.completions.create(model="m", messages=messages, max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        app.chat.completions.create(model="m", messages=messages, max_tokens=2)
    for wrong in (secret + "x", secret[:-1], secret.upper()):
        with pytest.raises(openai.AuthenticationError):
            client(base, wrong).models.list()
    for header in (f"Basic {secret}", secret, f"Bearer {secret} {secret}"):
        r = httpx.get(f"{base}/v1/models", headers={"authorization": header}, timeout=5)
        assert r.status_code == 401, (header[:5], r.status_code)
    # The dashboard login on the client port: refused for a non-admin key, then taken.
    with httpx.Client(base_url=base, timeout=5) as browser:
        browser.get("/admin/login")
        csrf = browser.cookies["llmgw_csrf"]
        r = browser.post("/admin/login", data={"csrf": csrf, "key": secret})
        assert r.status_code == 403
        r = browser.post("/admin/login", data={"csrf": csrf, "key": created["ops"]["secret"]})
        assert r.status_code == 303
    # Revoked: refused within the key cache's second.
    assert httpx.delete(f"{admin}/api/v1/keys/{created['app']['id']}", timeout=5).is_success

    def refused() -> bool:
        try:
            app.models.list()
        except openai.AuthenticationError:
            return True
        return False

    wait_for(refused, "the revoked key refused", timeout=5)
    return (
        {name: key["secret"] for name, key in created.items()},
        {name: key["id"] for name, key in created.items()},
    )


def test_refusals_are_counted_per_model_and_key_in_usage_and_metrics(tmp_path: Path) -> None:
    """A 429 was counted only in llmgw_rejected_requests_total{reason}: the dashboard and
    usage showed 0 errors while clients received 429s (issue #17)."""
    db = tmp_path / "llmgw.db"
    keys = create_keys(db, app={"rpm": 2})
    key_id, secret = keys["app"][0].id, keys["app"][1]
    config = CONFIG.format(path=db) + "[auth]\nkey_metrics = true\n"
    messages: Any = [{"role": "user", "content": "x"}]
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=config) as srv,
    ):
        srv.wait_scraped()
        statuses = []
        for _ in range(5):
            try:
                client(srv.base, secret).chat.completions.create(
                    model="m", messages=messages, max_tokens=2
                )
                statuses.append(200)
            except openai.RateLimitError:
                statuses.append(429)
        assert statuses == [200, 200, 429, 429, 429]
        # A model nobody configured is refused too, under no model's name.
        with pytest.raises(openai.NotFoundError):
            client(srv.base, secret).chat.completions.create(
                model="made-up", messages=messages, max_tokens=2
            )

        def usage() -> dict[str, int] | None:
            rows = httpx.get(
                f"{srv.admin}/api/v1/usage", params={"group_by": "model"}, timeout=5
            ).json()["usage"]
            got = {r["group"]: (r["requests"], r["errors"]) for r in rows}
            return got if got.get("m") == (5, 3) else None

        assert wait_for(usage, "three refusals among five requests in usage", timeout=10) == {
            "m": (5, 3)
        }
        assert srv.metric("llmgw_key_requests_total", key=key_id, model="m", status="429") == 3
        rejected = srv.metric("llmgw_rejected_requests_total", model="m")
        assert rejected == 3, rejected
        assert srv.metric("llmgw_rejected_requests_total", model="", reason="model_not_found") == 1
        # With key_metrics, under the key's id (issue #17); a refused secret is no key.
        assert srv.metric("llmgw_rejected_requests_total", model="m", key=key_id) == 3
        assert srv.metric("llmgw_rejected_requests_total", model="", key=key_id) == 1
        with pytest.raises(openai.AuthenticationError):
            client(srv.base, "llmgw-made-up-secret").models.list()
        assert srv.metric("llmgw_rejected_requests_total", reason="invalid_api_key", key="") == 1
        text = httpx.get(f"{srv.admin}/metrics", timeout=5).text
    assert "made-up" not in text  # a client's name or secret never becomes a label
    # The access log has the key's six under its id, the made-up model's refusal too.
    access = [
        line for line in srv.proc.log.read_text().splitlines() if " INFO llmgw.access: " in line
    ]
    assert all(f" key_id={key_id} " in line for line in access[:-1]), access
    statuses = [m[1] for line in access if (m := re.search(r" status=(\d+) ", line))]
    assert statuses == ["200", "200", "429", "429", "429", "404", "401"], access
    assert all(line.endswith(" error=rpm_exceeded") for line in access[2:5]), access
    assert " model=- " in access[-2] and " error=model_not_found" in access[-2], access
    assert " key_id=- " in access[-1], access
