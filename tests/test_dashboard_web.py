"""The dashboard's HTTP plumbing and pages in-process: cookies, the origin check, the
key form, router-only mode and no store. The browser tests (test_dashboard_browser.py)
cover the same app through a real server and Chromium."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from llmgw.admin.api import AdminApp
from llmgw.admin.web import same_origin
from llmgw.config import Config, EndpointConfig
from llmgw.dashboard import DashboardApp, panels
from llmgw.dashboard.app import _local
from llmgw.dashboard.panels import key_request
from llmgw.router.core import Router


def test_cookies_are_http_only_strict_and_host_prefixed_over_tls() -> None:
    async def main(client: httpx.AsyncClient) -> None:
        page = await client.get("/")
        (cookie,) = page.headers.get_list("set-cookie")
        if client.base_url.scheme == "https":
            assert cookie.startswith("__Host-llmgw_csrf=")
            assert "; Secure" in cookie and "; Path=/" in cookie
        else:
            assert cookie.startswith("llmgw_csrf=") and "Secure" not in cookie
            assert "; Path=/admin" in cookie
        assert "; HttpOnly" in cookie and "; SameSite=Strict" in cookie
        # The token it set is the one the page's forms carry, and it is not set again.
        again = await client.get("/fleet")
        assert "set-cookie" not in again.headers

    app = dashboard(prefix="/admin")
    for base in ("http://dash/admin", "https://dash/admin"):
        run(app, main, base_url=base)


@pytest.mark.parametrize(
    ("headers", "same"),
    [
        ((), True),  # curl, or a browser too old to say
        (((b"sec-fetch-site", b"same-origin"),), True),
        (((b"sec-fetch-site", b"none"),), True),  # typed into the address bar
        (((b"sec-fetch-site", b"cross-site"),), False),
        (((b"sec-fetch-site", b"same-site"),), False),  # another port or subdomain
        (((b"origin", b"http://127.0.0.1:9090"), (b"host", b"127.0.0.1:9090")), True),
        (((b"origin", b"http://evil.example"), (b"host", b"127.0.0.1:9090")), False),
        (((b"origin", b"null"), (b"host", b"127.0.0.1:9090")), False),
        # Behind a proxy that rewrote Host: the browser's word, or X-Forwarded-Host.
        (((b"sec-fetch-site", b"same-origin"), (b"origin", b"https://gw"), (b"host", b"x")), True),
        (((b"sec-fetch-site", b"cross-site"), (b"origin", b"https://gw"), (b"host", b"gw")), False),
        (
            (
                (b"origin", b"https://gw"),
                (b"host", b"127.0.0.1:8080"),
                (b"x-forwarded-host", b"gw"),
            ),
            True,
        ),
    ],
)
def test_same_origin(headers: tuple[tuple[bytes, bytes], ...], same: bool) -> None:
    assert same_origin({k.decode(): v.decode() for k, v in headers}) is same


def test_key_form_to_api_body() -> None:
    body = key_request(
        {"name": " ci ", "band": "gold", "models": "a, b,", "rpm": "60", "expires_days": "1.5"}
    )
    assert body == {
        "name": "ci",
        "band": "gold",
        "models": ["a", "b"],
        "rpm": 60,
        "expires_in_seconds": 1.5 * 86400,
        "admin": False,
    }
    assert key_request({"name": "x", "admin": "on"})["admin"] is True
    with pytest.raises(ValueError, match="tpm: must be a whole number, got '1e3'"):
        key_request({"name": "x", "tpm": "1e3"})
    with pytest.raises(ValueError, match="expires_days: must be a finite number"):
        key_request({"name": "x", "expires_days": "inf"})


@pytest.mark.parametrize(
    ("target", "kept"),
    [("/fleet", "/fleet"), ("//evil.example/x", None), ("https://evil.example", None),
     ("/\\evil.example", None), (None, None), ("", None),
     ("/\r\nSet-Cookie: x=1", None), ("/keys\n", None), ("/a\0b", None), ("/a\x7f", None)],
)  # fmt: skip
def test_login_goes_back_only_within_the_dashboard(target: str | None, kept: str | None) -> None:
    assert _local(target) == kept


# -- in-process pages, router-only and without a store ------------------------------------


def dashboard(**kw: Any) -> DashboardApp:
    config = Config(endpoints=(EndpointConfig(id="e1", url="http://127.0.0.1:9", models=("m",)),))
    return DashboardApp(AdminApp(Router(config)), **kw)


def run(
    app: DashboardApp,
    main: Callable[[httpx.AsyncClient], Awaitable[None]],
    base_url: str = "http://dash",
) -> None:
    async def wrapper() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            await main(client)

    trio.run(wrapper)


def test_router_only_pages() -> None:
    async def main(client: httpx.AsyncClient) -> None:
        fleet = await client.get("/fleet")
        assert fleet.status_code == 200 and "router-only mode" in fleet.text
        endpoints = await client.get("/endpoints")
        assert endpoints.status_code == 200
        assert 'data-endpoint="e1"' in endpoints.text and "http://127.0.0.1:9" in endpoints.text
        # Never scraped: its numbers are missing, not 0.
        assert "never" in endpoints.text
        models = await client.get("/models")
        assert 'data-model="m"' in models.text
        assert (await client.get("/nope")).status_code == 404
        for path in ("/static/../app.py", "/static/nothing.css"):
            assert (await client.get(path)).status_code == 404
        css = await client.get("/static/dashboard.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        page = await client.get("/")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"

    run(dashboard(), main)


def test_without_a_store_keys_and_usage_say_so_and_changes_are_refused() -> None:
    async def main(client: httpx.AsyncClient) -> None:
        keys = await client.get("/keys")
        assert keys.status_code == 200 and "no store is configured" in keys.text
        token = client.cookies["llmgw_csrf"]
        created = await client.post("/keys/create", data={"csrf": token, "name": "x"})
        assert created.status_code == 409 and "no store is configured" in created.text
        usage = await client.get("/usage")
        assert "no store is configured" in usage.text

    run(dashboard(), main)


def test_a_login_without_a_store_explains_itself() -> None:
    async def main(client: httpx.AsyncClient) -> None:
        r = await client.get("/admin/fleet")
        assert r.status_code == 303 and r.headers["location"] == "/admin/login?next=%2Ffleet"
        login = await client.get("/admin/login")
        assert login.status_code == 200 and "needs a store" in login.text
        assert "Secure" not in r.headers["set-cookie"]
        # Behind a TLS-terminating proxy the cookies are Secure.
        client.cookies.clear()
        proxied = await client.get("/admin/login", headers={"x-forwarded-proto": "https"})
        secure = proxied.headers["set-cookie"]
        assert secure.startswith("__Host-llmgw_csrf=") and "; Secure" in secure
        # The bare prefix goes to the overview.
        bare = await client.get("/admin")
        assert bare.status_code == 303 and bare.headers["location"] == "/admin/"

    run(dashboard(prefix="/admin", login_required=True), main)


def test_login_on_an_admin_listener_off_loopback(tmp_path: Any) -> None:
    """With a login required at "/" (the admin listener bound off loopback): sessions
    come from the store, end with their TTL, and end when the key is revoked."""
    from llmgw.store import open_store

    now = [1_000_000.0]

    async def main() -> None:
        store = await open_store(f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0])
        try:
            config = Config(
                endpoints=(EndpointConfig(id="e1", url="http://127.0.0.1:9", models=("m",)),)
            )
            admin = AdminApp(Router(config), store=store, admin_auth=True)
            app = DashboardApp(admin, login_required=True, session_ttl=60)
            record, secret = await store.create_key("ops", admin=True)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://d") as client:
                assert (await client.get("/keys")).headers["location"] == "/login?next=%2Fkeys"
                await client.get("/login")
                token = client.cookies["llmgw_csrf"]
                r = await client.post(
                    "/login", data={"csrf": token, "key": secret, "next": "/keys"}
                )
                assert r.status_code == 303 and r.headers["location"] == "/keys"
                assert "Max-Age=60" in r.headers["set-cookie"]
                # A `next` with CR/LF goes home: no header of the sender's making.
                r = await client.post(
                    "/login",
                    data={"csrf": token, "key": secret, "next": "/\r\nSet-Cookie: evil=1"},
                )
                assert r.status_code == 303 and r.headers["location"] == "/"
                assert "evil" not in str(r.headers.raw)
                page = await client.get("/keys")
                assert page.status_code == 200 and record.id in page.text
                # Past its TTL the session is gone.
                now[0] += 61
                assert (await client.get("/keys")).status_code == 303
                # A new login, then the key is revoked: the session ends with it.
                await client.post("/login", data={"csrf": token, "key": secret})
                assert (await client.get("/keys")).status_code == 200
                await store.revoke_key(record.id)
                assert (await client.get("/keys")).status_code == 303
                # Five wrong secrets from one address, then 429 with Retry-After.
                for _ in range(5):
                    r = await client.post("/login", data={"csrf": token, "key": "wrong"})
                    assert r.status_code == 401
                r = await client.post("/login", data={"csrf": token, "key": secret})
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                # Changes need the login too, before anything else is looked at.
                refused = await client.post("/nodes/drain", data={"csrf": token, "node": "x"})
                assert refused.status_code == 401
        finally:
            await store.aclose()

    trio.run(main)


def test_panels_summaries_and_formats() -> None:
    from llmgw.dashboard import panels
    from llmgw.dashboard.traffic import TrafficRing

    gpu = {"memory_used_bytes": None}
    nodes = [
        {"state": "ready", "cordoned": False, "gpus": [gpu] * 2, "gpus_allocated": 1,
         "gpus_free": 1},
        {"state": "lost", "cordoned": True, "gpus": [gpu], "gpus_allocated": 0, "gpus_free": 0},
    ]  # fmt: skip
    assert panels.fleet_summary(nodes) == {
        "nodes": 2,
        "states": {"ready": 1, "lost": 1},
        "cordoned": 1,
        "cordoned_by_state": {"lost": 1},
        "gpus": 3,
        "gpus_allocated": 1,
        "gpus_free": 1,
    }
    endpoints = [
        {"stale": True, "breaker": "closed", "draining": False},
        {"stale": False, "breaker": "half_open", "draining": True},
    ]
    assert panels.endpoint_summary(endpoints) == {
        "total": 2, "stale": 1, "open": 1, "draining": 1
    }  # fmt: skip
    # Absent is not zero.
    assert panels.fmt_num(None) == panels.MISSING and panels.fmt_num(0) == "0"
    assert panels.fmt_num(12345) == "12,345" and panels.fmt_num(2.25, 2) == "2.25"
    assert panels.fmt_ago(None) == "never" and panels.fmt_ago(90) == "1m 30s"
    assert panels.fmt_when(0) == "1970-01-01 00:00:00 UTC"
    # An empty ring still gives every chart, each saying it has no data.
    now = [100.0]
    ring = TrafficRing(clock=lambda: now[0])
    made = panels.traffic_charts(ring.series())
    assert [c["title"] for c in made][:4] == [
        "Requests per second",
        "Errors per second per model",
        "Retries per second per model",
        "Time to first token",
    ]
    assert [c["title"] for c in made][-2:] == [
        "Prefix-cache predictions against the engines",
        "Affinity spills per second by reason",
    ]
    assert len(made) == 10 and all("no data" in c["svg"] for c in made)


def test_the_saturation_chart_marks_each_bands_ceiling() -> None:
    from llmgw.dashboard import panels
    from llmgw.dashboard.traffic import TrafficRing

    ring = TrafficRing(clock=lambda: 100.0)
    ceilings = [("platinum", 1.0), ("gold", 0.85), ("bronze", 0.3)]
    (saturation,) = [
        c for c in panels.traffic_charts(ring.series(), ceilings) if "Saturation" in c["title"]
    ]
    assert "gold ceiling" in saturation["svg"] and "bronze ceiling" in saturation["svg"]
    assert "platinum ceiling" not in saturation["svg"]  # 1.0 is the top: nothing is held


def test_last_failures_keep_each_models_latest_failed_shard() -> None:
    from llmgw.dashboard import panels

    def shard(model: str, epoch: int, state: str = "failed") -> dict[str, Any]:
        return {"model": model, "epoch": epoch, "state": state, "message": f"{model}@{epoch}"}

    nodes = [
        {"id": "n1", "shards": [shard("a", 1), shard("a", 3, "ready"), shard("b", 2)]},
        {"id": "n2", "shards": [shard("a", 2)]},
    ]
    found = panels.last_failures(nodes)
    assert {m: (f["node"], f["message"]) for m, f in found.items()} == {
        "a": ("n2", "a@2"),
        "b": ("n1", "b@2"),
    }


def test_a_large_fleet_is_paged_with_problems_first() -> None:
    def node(i: int, state: str = "ready") -> dict[str, Any]:
        return {
            "id": f"n{i:03d}", "hostname": "h", "address": "a", "agent_version": "1",
            "state": state, "in_state_seconds": 1.0, "heartbeat_age_seconds": 1.0,
            "cordoned": i == 7, "draining": False, "labels": {}, "fabrics": [], "engines": [],
            "shards": [],
            "gpus_total": 0, "gpus_allocated": 0, "gpus_free": 0, "gpus": [],
        }  # fmt: skip

    nodes = [node(i, "lost" if i in (90, 91) else "ready") for i in range(120)]
    app = dashboard()
    app.admin.controller = object()  # type: ignore[assignment]

    async def call(method: str, path: str, **kw: Any) -> tuple[int, Any]:
        assert (method, path) == ("GET", "/api/v1/nodes")
        return 200, {"nodes": nodes}

    app.admin.call = call  # type: ignore[method-assign]

    async def main(client: httpx.AsyncClient) -> None:
        first = (await client.get("/fleet")).text
        ids = [part.split('"', 1)[0] for part in first.split('data-node="')[1:]]
        # The lost nodes, then the cordoned one, then the rest in order.
        assert ids[:4] == ["n090", "n091", "n007", "n000"] and len(ids) == 50
        assert "nodes 1\N{EN DASH}50 of 120 (problems first)" in first and "page 1 of 3" in first
        last = (await client.get("/fleet?page=3")).text
        assert last.count('data-node="') == 20 and "previous" in last
        assert "next \N{SINGLE RIGHT-POINTING ANGLE QUOTATION MARK}" not in last
        bad = await client.get("/fleet?page=4")
        assert bad.status_code == 400 and "page: must be a whole number in [1, 3]" in bad.text

    run(app, main)


def test_a_page_that_fails_to_render_is_a_500_page_not_a_dropped_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("template bug")

    # The endpoints page formats numbers with it (a filter taken when the app is built).
    monkeypatch.setattr(panels, "fmt_num", broken)
    app = dashboard()

    async def main(client: httpx.AsyncClient) -> None:
        r = await client.get("/endpoints")
        assert r.status_code == 500 and "Internal error" in r.text

    run(app, main)
