"""The admin API's debugging aids (``/api/v1/debug/...``) and `llmgw-ctl debug`, against
a real llmgw-server routing to a real simulator, its admin listener off loopback so
that admin auth is on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.store import open_store

from .procs import BIN, running, sim, wait_for

CONFIG = """
[store]
url = "sqlite:///{path}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""

# Every debug route, as (method, path).
ROUTES = [
    ("GET", "/api/v1/debug"),
    ("GET", "/api/v1/debug/tasks"),
    ("GET", "/api/v1/debug/threads"),
    ("POST", "/api/v1/debug/profile?seconds=1"),
    ("POST", "/api/v1/debug/heap"),
    ("GET", "/api/v1/debug/heap"),
    ("DELETE", "/api/v1/debug/heap"),
]
IDLE = {"profiler_loaded": False, "profile_running": False, "profile_hook": False,
        "tracemalloc": False}  # fmt: skip
WHERE = re.compile(r"^\S.*:\d+$")  # a file, or a frozen module ("<frozen abc>:123")


class Gateway:
    def __init__(self, admin: str, base: str, admin_key: str, user_key: str) -> None:
        self.admin = admin
        self.base = base
        self.admin_key = admin_key
        self.user_key = user_key

    def get(self, path: str, *, timeout: float = 10.0, **params: Any) -> httpx.Response:
        return self.request("GET", path, timeout=timeout, **params)

    def post(self, path: str, *, timeout: float = 10.0, **params: Any) -> httpx.Response:
        return self.request("POST", path, timeout=timeout, **params)

    def request(
        self,
        method: str,
        path: str,
        *,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        **params: Any,
    ) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.admin}{path}",
            params=params,
            headers={"authorization": f"Bearer {self.admin_key}", **(headers or {})},
            timeout=timeout,
        )

    def status(self) -> dict[str, Any]:
        r = self.get("/api/v1/debug")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def chat(self) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"authorization": f"Bearer {self.user_key}"}
        return httpx.post(
            f"{self.base}/v1/chat/completions", json=body, headers=headers, timeout=10
        ).status_code

    def ctl(self, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "llmgw-ctl"), "--admin", self.admin, "--admin-key", key or self.admin_key,
             "debug", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
            | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        )  # fmt: skip

    def ok(self, *args: str) -> str:
        done = self.ctl(*args)
        assert (done.returncode, done.stderr) == (0, ""), (args, done.returncode, done.stderr)
        return done.stdout


async def _make_keys(db: Path) -> tuple[str, str]:
    store = await open_store(f"sqlite:///{db}")
    try:
        _, admin = await store.create_key("ops", admin=True)
        _, user = await store.create_key("user")
    finally:
        await store.aclose()
    return admin, user


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with sim(model="m") as (_, url):
        yield url


@pytest.fixture
def gw(tmp_path: Path, engine: str) -> Iterator[Gateway]:
    """A fresh server each test: what the debugging aids leave on (a loaded profiler,
    tracemalloc) is per process."""
    db = tmp_path / "llmgw.db"
    admin_key, user_key = trio.run(_make_keys, db)
    config = tmp_path / "llmgw.toml"
    config.write_text(CONFIG.format(path=db))
    argv = ("--config", str(config), "--endpoint", f"s0={engine}=m",
            "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0")  # fmt: skip
    with running("llmgw-server", *argv, ready=True) as proc:
        (bound,) = proc.ready["admin_listen"]
        admin = f"http://127.0.0.1:{bound.rsplit(':', 1)[1]}"
        gateway = Gateway(admin, proc.url("listen"), admin_key, user_key)
        wait_for(lambda: gateway.chat() == 200, "a request through the gateway", 10)
        yield gateway


def test_every_debug_route_needs_an_admin_key(gw: Gateway) -> None:
    for method, path in ROUTES:
        url = f"{gw.admin}{path}"
        assert httpx.request(method, url, timeout=10).status_code == 401, path
        user = {"authorization": f"Bearer {gw.user_key}"}
        refused = httpx.request(method, url, headers=user, timeout=10)
        assert refused.status_code == 403, path
        assert refused.json()["error"]["code"] == "not_admin_key"
    # None of the refusals started anything.
    assert gw.status() == IDLE
    done = gw.ctl("tasks", key=gw.user_key)
    assert done.returncode == 1 and "403" in done.stderr and "not an admin key" in done.stderr
    # The routes are in the OpenAPI document, behind the admin key.
    doc = gw.get("/api/v1/openapi.json").json()
    for method, path in ROUTES:
        op = doc["paths"][path.partition("?")[0]][method.lower()]
        assert op["security"] == [{"adminKey": []}] and "401" in op["responses"]


def test_task_tree_and_thread_stacks(gw: Gateway) -> None:
    tree = gw.get("/api/v1/debug/tasks").json()
    names: list[str] = []

    def walk(task: dict[str, Any]) -> None:
        names.append(task["name"])
        for child in task["children"]:
            walk(child)

    walk(tree["root"])
    assert tree["count"] == len(names) > 5
    # The router's own loop, suspended somewhere in llmgw's code or trio's.
    assert any(n.startswith("llmgw.router.core.Router.run") for n in names), names
    assert any(n.startswith("llmgw.admin") or "quart" in n or "hypercorn" in n for n in names)

    def suspended(task: dict[str, Any]) -> list[str]:
        found = [task["where"][-1]] if task["where"] else []
        return found + [w for c in task["children"] for w in suspended(c)]

    assert all(re.search(r"\.py:\d+ in \S+$", w) for w in suspended(tree["root"]))

    # Where each waits, past trio's own frames (its trap is the same for every task):
    # the scrape loop waits in llmgw's scraper, not in trio/_core.
    def waits(task: dict[str, Any]) -> list[tuple[str, str | None]]:
        found = [(task["name"], task["waits_at"])]
        return found + [w for c in task["children"] for w in waits(c)]

    every = waits(tree["root"])
    trio_own = os.path.dirname(trio.__file__) + os.sep
    assert not [w for _, w in every if w is not None and w.startswith(trio_own)], every
    scraper = [w for n, w in every if n.endswith("Scraper.run")]
    assert scraper and all(w is not None and "llmgw/router/scraper.py" in w for w in scraper)

    threads = gw.get("/api/v1/debug/threads").json()["threads"]
    main = threads[0]
    assert main["name"] == "MainThread" and main["daemon"] is False
    stack = "".join(main["stack"])
    assert "trio" in stack and "llmgw" in stack and "debug.py" in stack

    out = gw.ok("tasks")
    assert re.match(r"^\d+ tasks\n", out), out
    assert "llmgw.router.core.Router.run" in out and " @ " in out
    out = gw.ok("threads")
    assert "Thread MainThread (" in out and 'File "' in out


def test_profile_of_the_event_loop(gw: Gateway, tmp_path: Path) -> None:
    """Idle, the profiler costs nothing: not imported, no hook, no thread; a profile
    samples every task while the server serves; one at a time; afterwards nothing is
    left running."""

    def sampler_left() -> list[str]:
        threads = gw.get("/api/v1/debug/threads").json()["threads"]
        return [t["name"] for t in threads if "pyinstrument" in "".join(t["stack"])]

    idle = {"profiler_loaded": False, "profile_running": False, "profile_hook": False}
    assert {k: gw.status()[k] for k in idle} == idle
    assert sampler_left() == []

    answer: list[httpx.Response] = []
    first = threading.Thread(
        target=lambda: answer.append(gw.post("/api/v1/debug/profile", seconds=3, timeout=30))
    )
    first.start()
    try:
        running_now = wait_for(
            lambda: (s := gw.status())["profile_running"] and s, "the profile to start", 5
        )
        assert running_now["profile_hook"] and running_now["profiler_loaded"]
        second = gw.post("/api/v1/debug/profile", seconds=1)
        assert second.status_code == 409, second.text
        assert second.json()["error"]["code"] == "profile_running"
        # The loop keeps serving while it is sampled.
        assert [gw.chat() for _ in range(5)] == [200] * 5
    finally:
        first.join(30)
    (r,) = answer
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "llmgw" in r.text and "Duration: 3." in r.text, r.text[:2000]
    after = gw.status()
    assert (after["profile_running"], after["profile_hook"]) == (False, False)
    assert sampler_left() == []

    for bad in ({"seconds": "0"}, {"seconds": "61"}, {"seconds": "x"}, {"format": "pdf"}):
        refused = gw.post("/api/v1/debug/profile", **bad)
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["error"]["param"] == next(iter(bad))

    out = tmp_path / "profile.speedscope.json"
    written = gw.ok("profile", "--seconds", "1", "--format", "speedscope", "--out", str(out))
    assert "written to" in written
    speedscope = json.loads(out.read_text())
    assert "speedscope" in speedscope["$schema"] and speedscope["profiles"]
    frames = [f["name"] + " " + str(f.get("file")) for f in speedscope["shared"]["frames"]]
    assert any("trio" in f for f in frames)
    text = gw.ok("profile", "--seconds", "1")
    assert "Duration: 1." in text and "llmgw" in text
    done = gw.ctl("profile", "--seconds", "0")
    assert done.returncode == 2 and "from 1 to 60" in done.stderr
    assert gw.status()["profile_hook"] is False


def test_heap_summary_starts_and_stops_tracemalloc(gw: Gateway) -> None:
    # A GET reads and never starts: it is what any page can make a browser send.
    off = gw.get("/api/v1/debug/heap", limit=5)
    assert off.status_code == 409 and off.json()["error"]["code"] == "not_tracing", off.text
    assert gw.status()["tracemalloc"] is False
    done = gw.ctl("heap")
    assert done.returncode == 1 and "--start" in done.stderr, done.stderr
    first = gw.post("/api/v1/debug/heap", limit=5).json()
    assert first["started_now"] is True and first["frames"] == 1
    assert "only what was allocated since" in first["note"]
    assert gw.status()["tracemalloc"] is True
    assert [gw.chat() for _ in range(5)] == [200] * 5
    heap = gw.get("/api/v1/debug/heap", limit=20).json()
    assert heap["started_now"] is False and heap["frames"] == 1
    assert heap["tracing_since"] == first["tracing_since"]
    top = heap["top"]
    assert 0 < len(top) <= 20
    assert all(WHERE.match(line["where"]) and line["size"] > 0 for line in top), top
    assert any(".py:" in line["where"] for line in top), top
    assert [line["size"] for line in top] == sorted((line["size"] for line in top), reverse=True)
    assert heap["traced_bytes"] >= sum(line["size"] for line in top)
    refused = gw.get("/api/v1/debug/heap", limit=0)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"

    again = gw.post("/api/v1/debug/heap", limit=5).json()  # already on: a summary
    assert again["started_now"] is False and again["tracing_since"] == first["tracing_since"]
    out = gw.ok("heap", "--limit", "3")
    lines = out.splitlines()
    assert lines[0].startswith("traced ") and len(lines) == 5, out
    assert all(re.search(r"\S:\d+$", line) for line in lines[2:]), out
    assert gw.ok("heap", "--stop") == "tracemalloc stopped\n"
    assert gw.status()["tracemalloc"] is False
    assert gw.ok("heap", "--stop") == "tracemalloc was off\n"
    assert gw.ok("heap", "--start", "--limit", "1").startswith("traced ")
    assert gw.status()["tracemalloc"] is True
    assert gw.ok("heap", "--stop") == "tracemalloc stopped\n"
    assert json.loads(gw.ok("--json")) == gw.status()


def test_a_page_on_another_site_can_start_nothing_here(gw: Gateway) -> None:
    """A browser sends what any page asks, with the admin's credentials if it has
    them: every debug route, reads included, is refused when the browser says the
    request comes from another site; GETs of what used to start the profiler or
    tracemalloc start nothing, from any origin."""
    cross_site = (
        {"sec-fetch-site": "cross-site", "origin": "https://evil.example"},
        {"origin": "https://evil.example"},  # an older browser: Origin against Host
        {"sec-fetch-site": "same-site"},  # a sibling subdomain is another origin
    )
    for headers in cross_site:
        for method, path in [*ROUTES, ("GET", "/api/v1/debug/profile?seconds=1")]:
            refused = gw.request(method, path, headers=headers)
            assert refused.status_code == 403, (headers, method, path, refused.text)
            assert refused.json()["error"]["code"] == "cross_site"
    # GETs of the routes that start something start nothing, whoever sends them.
    profile = gw.get("/api/v1/debug/profile", seconds=1)
    assert profile.status_code == 405, profile.text
    assert "POST" in profile.headers["allow"]
    heap = gw.get("/api/v1/debug/heap")
    assert heap.status_code == 409, heap.text
    assert gw.status() == IDLE
    # The browser's own same-origin requests (the operator's page) still pass.
    same = gw.request("GET", "/api/v1/debug", headers={"sec-fetch-site": "same-origin"})
    assert same.status_code == 200 and same.json() == IDLE
    host = gw.admin.removeprefix("http://")
    typed = gw.request("GET", "/api/v1/debug/tasks", headers={"origin": f"http://{host}"})
    assert typed.status_code == 200, typed.text
