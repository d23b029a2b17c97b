"""API keys, usage, runtime models and the store through a real llmgw-server and the
openai client, on both store backends (`store_url`: a SQLite file, or a database in the
session's PostgreSQL cluster; tests/conftest.py)."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import cast

import httpx
import openai
import pytest
import trio

from llmgw.config import ModelConfig
from llmgw.store import open_store
from llmgw.store.sql.runtime import put_model
from llmgw.store.sql.threaded import ThreadedStore

from .procs import server, sim, wait_for

CONFIG = """
[store]
url = "{url}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""


def make_keys(url: str) -> dict[str, str]:
    """Keys created in the store before the server starts (as llmgw-ctl would)."""

    async def create() -> dict[str, str]:
        store = await open_store(url)
        try:
            secrets = {}
            for name, kw in {
                "full": {},
                "other-model": {"models": ("not-m",)},
                "slow": {"rpm": 2},
                "revoked-later": {},
            }.items():
                _, secrets[name] = await store.create_key(name, **kw)  # type: ignore[arg-type]
            return secrets
        finally:
            await store.aclose()

    return trio.run(create)


def usage_by_key(url: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        store = await open_store(url)
        try:
            names = {k.id: k.name for k in await store.list_keys()}
            rows = await store.usage_summary("key")
            return {names.get(str(r.group), str(r.group)): r.requests for r in rows}
        finally:
            await store.aclose()

    return trio.run(read)


def revoke(url: str, name: str) -> None:
    async def run() -> None:
        store = await open_store(url)
        try:
            (key,) = [k for k in await store.list_keys() if k.name == name]
            assert await store.revoke_key(key.id)
        finally:
            await store.aclose()

    trio.run(run)


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def ask(c: openai.OpenAI) -> None:
    ask_model(c, "m")


def ask_model(c: openai.OpenAI, model: str) -> None:
    c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2
    )


def test_keys_guard_the_client_port_and_usage_is_recorded(store_url: str) -> None:
    keys = make_keys(store_url)
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(url=store_url)) as srv,
    ):
        srv.wait_scraped()
        with pytest.raises(openai.AuthenticationError, match="invalid, revoked or expired"):
            ask(client(srv.base, "llmgw-not-a-key"))
        with pytest.raises(openai.PermissionDeniedError, match="may not use model 'm'"):
            ask(client(srv.base, keys["other-model"]))
        ask(client(srv.base, keys["full"]))
        ask(client(srv.base, keys["full"]))
        assert [m.id for m in client(srv.base, keys["full"]).models.list()] == ["m"]
        assert list(client(srv.base, keys["other-model"]).models.list()) == []

        slow = client(srv.base, keys["slow"])
        ask(slow)
        ask(slow)
        with pytest.raises(openai.RateLimitError, match="2 requests per minute") as info:
            ask(slow)
        assert int(info.value.response.headers["retry-after"]) >= 1

        ask(client(srv.base, keys["revoked-later"]))
        revoke(store_url, "revoked-later")

        def refused() -> bool:  # the key cache holds lookups for 1 s
            try:
                ask(client(srv.base, keys["revoked-later"]))
            except openai.AuthenticationError:
                return True
            return False

        wait_for(refused, "the revoked key refused", 5)

        # Per-key counters are opt-in (auth.key_metrics): by default no such family.
        exported = httpx.get(f"{srv.admin}/metrics", timeout=5).text
        assert "llmgw_requests_total{" in exported
        assert "llmgw_key_" not in exported

        # Requests right before a graceful stop are still written (the final flush).
        for _ in range(3):
            ask(client(srv.base, keys["full"]))
        assert srv.proc.stop() == 0
    counts = usage_by_key(store_url)
    assert counts["full"] == 5
    # Refusals once the key and model are known are usage too: clients saw them.
    assert counts["slow"] == 3  # two served, one 429
    assert counts["revoked-later"] >= 1
    assert counts["other-model"] == 1  # the 403


def test_without_keys_the_port_is_open_and_a_missing_store_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(url=f"sqlite:///{db}")) as srv,
    ):
        srv.wait_scraped()
        ask(client(srv.base, "anything"))  # no key exists yet: nothing to check


def test_a_runtime_model_survives_a_restart(store_url: str) -> None:
    with sim(model="m") as (_, engine):
        flags = ("--endpoint", f"s0={engine}=m")
        with server(*flags, config=CONFIG.format(url=store_url)) as srv:
            r = httpx.post(
                f"{srv.admin}/api/v1/models",
                json={"name": "m2", "aliases": ["mm2"], "fallbacks": ["m"]},
                timeout=10,
            )
            assert r.status_code == 201, r.text
            bad = httpx.post(
                f"{srv.admin}/api/v1/models",
                json={"name": "m3", "fallbacks": ["nowhere"]},
                timeout=10,
            )
            assert bad.status_code == 400
            assert "fallbacks[0]: no model named 'nowhere'" in bad.json()["error"]["message"]
        with server(*flags, config=CONFIG.format(url=store_url)) as srv:
            srv.wait_scraped()
            got = httpx.get(f"{srv.admin}/api/v1/models/m2", timeout=10)
            assert got.status_code == 200 and got.json()["source"] == "runtime"
            # Served through its fallback: the alias resolves after the restart too.
            reply = client(srv.base, "x").chat.completions.create(
                model="mm2", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            assert reply.model == "m"


def seed_models(url: str) -> None:
    """Stored models as an earlier llmgw or configuration left them: one still valid,
    one falling back to a model that is gone, one no longer readable at all."""

    async def run() -> None:
        store = cast(ThreadedStore, await open_store(url))
        try:
            await store.put_model(
                ModelConfig(name="kept", aliases=("kept-alias",), fallbacks=("m",))
            )
            await store.put_model(ModelConfig(name="orphan", fallbacks=("retired",)))
            garbled = json.dumps({"name": "garbled", "replicas": "many", "fallbackz": ["m"]})
            await store._write(partial(put_model, name="garbled", config_json=garbled, now=0.0))
        finally:
            await store.aclose()

    trio.run(run)


def stored_model_names(url: str) -> list[str]:
    async def run() -> list[str]:
        store = await open_store(url)
        try:
            return [str(m.config["name"]) for m in await store.list_models()]
        finally:
            await store.aclose()

    return trio.run(run)


def test_stored_models_that_no_longer_validate_are_reported_and_skipped(store_url: str) -> None:
    seed_models(store_url)
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(url=store_url)) as srv,
    ):
        srv.wait_scraped()
        output = srv.proc.output()
        # One warning per skipped model, naming it and why.
        assert re.search(
            r"WARNING llmgw\.models: stored model 'orphan' skipped, no longer valid: "
            r"fallbacks\[0\]: no model named 'retired' ",
            output,
        ), output
        garbled = re.search(
            r"WARNING llmgw\.models: stored model 'garbled' skipped, no longer valid: "
            r"cannot be read: (.*)",
            output,
        )
        assert garbled, output
        assert "replicas" in garbled[1] and "fallbackz: unknown key" in garbled[1]
        assert "stored model 'kept'" not in output
        # The server serves the rest: the valid stored model (through its fallback)...
        names = [
            m["name"] for m in httpx.get(f"{srv.admin}/api/v1/models", timeout=5).json()["models"]
        ]
        assert sorted(names) == ["kept", "m"]
        reply = client(srv.base, "x").chat.completions.create(
            model="kept-alias", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        assert reply.model == "m"
        # ... and the skipped ones are not served, nor editable as if they were.
        with pytest.raises(openai.NotFoundError):
            ask_model(client(srv.base, "x"), "orphan")
        patched = httpx.patch(f"{srv.admin}/api/v1/models/orphan", json={"replicas": 2}, timeout=5)
        assert patched.status_code == 409
        assert "skipped at start (fallbacks[0]: no model named 'retired')" in patched.text
        # They stay in the store until the operator removes (or re-adds) them.
        assert stored_model_names(store_url) == ["garbled", "kept", "orphan"]
        removed = httpx.delete(f"{srv.admin}/api/v1/models/orphan", timeout=5)
        assert removed.status_code == 204, removed.text
        fixed = httpx.post(f"{srv.admin}/api/v1/models", json={"name": "garbled"}, timeout=5)
        assert fixed.status_code == 201, fixed.text
        assert stored_model_names(store_url) == ["garbled", "kept"]
        assert httpx.delete(f"{srv.admin}/api/v1/models/orphan", timeout=5).status_code == 404
