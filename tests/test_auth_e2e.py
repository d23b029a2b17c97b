"""API keys, usage and the store through a real llmgw-server (SQLite) and the openai client."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest
import trio

from llmgw.store import open_store

from .procs import server, sim

CONFIG = """
[store]
url = "sqlite:///{path}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""


def make_keys(path: Path) -> dict[str, str]:
    """Keys created in the store before the server starts (as llmgw-ctl would)."""

    async def create() -> dict[str, str]:
        store = await open_store(f"sqlite:///{path}")
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


def usage_by_key(path: Path) -> dict[str, int]:
    async def read() -> dict[str, int]:
        store = await open_store(f"sqlite:///{path}")
        try:
            names = {k.id: k.name for k in await store.list_keys()}
            rows = await store.usage_summary("key")
            return {names.get(str(r.group), str(r.group)): r.requests for r in rows}
        finally:
            await store.aclose()

    return trio.run(read)


def revoke(path: Path, name: str) -> None:
    async def run() -> None:
        store = await open_store(f"sqlite:///{path}")
        try:
            (key,) = [k for k in await store.list_keys() if k.name == name]
            assert await store.revoke_key(key.id)
        finally:
            await store.aclose()

    trio.run(run)


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def ask(c: openai.OpenAI) -> None:
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def test_keys_guard_the_client_port_and_usage_is_recorded(tmp_path: Path) -> None:
    db = tmp_path / "llmgw.db"
    keys = make_keys(db)
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(path=db)) as srv,
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
        revoke(db, "revoked-later")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the key cache holds lookups for 1 s
            try:
                ask(client(srv.base, keys["revoked-later"]))
            except openai.AuthenticationError:
                break
            time.sleep(0.2)
        else:
            pytest.fail("a revoked key still worked after 5 s")

        # Requests right before a graceful stop are still written (the final flush).
        for _ in range(3):
            ask(client(srv.base, keys["full"]))
        assert srv.proc.stop() == 0
    counts = usage_by_key(db)
    assert counts["full"] == 5
    assert counts["slow"] == 2
    assert counts["revoked-later"] >= 1
    assert "other-model" not in counts  # refused requests never reached an engine


def test_without_keys_the_port_is_open_and_a_missing_store_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(path=db)) as srv,
    ):
        srv.wait_scraped()
        ask(client(srv.base, "anything"))  # no key exists yet: nothing to check


def test_a_runtime_model_survives_a_restart(tmp_path: Path) -> None:
    import httpx

    db = tmp_path / "models.db"
    with sim(model="m") as (_, engine):
        flags = ("--endpoint", f"s0={engine}=m")
        with server(*flags, config=CONFIG.format(path=db)) as srv:
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
        with server(*flags, config=CONFIG.format(path=db)) as srv:
            srv.wait_scraped()
            got = httpx.get(f"{srv.admin}/api/v1/models/m2", timeout=10)
            assert got.status_code == 200 and got.json()["source"] == "runtime"
            # Served through its fallback: the alias resolves after the restart too.
            reply = client(srv.base, "x").chat.completions.create(
                model="mm2", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            assert reply.model == "m"
