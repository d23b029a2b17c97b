"""Endpoints added and removed at runtime (POST/DELETE /api/v1/endpoints, llmgw-ctl
endpoints): real llmgw-server and llmgw-sim processes, the official openai client."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from .pg_cluster import TempCluster
from .procs import BIN, Server, server, sim, wait_for

FAST = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""


def store_config(db: Path, extra: str = "") -> str:
    return f'{FAST}\n[store]\nurl = "sqlite:///{db}"\n{extra}'


def client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30)


def ask(srv: Server, model: str = "m", **extra: object) -> str:
    """One chat completion through the router; the endpoint that served it."""
    raw = client(srv).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, **extra
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    return raw.headers["x-llmgw-endpoint"]


class Load:
    """At most `limit` requests for `model`, one after another in a thread, streamed and
    not in turn, until stopped: which endpoint served each, and every failure."""

    def __init__(self, srv: Server, model: str = "m", limit: int = 3000) -> None:
        self.srv, self.model, self.limit = srv, model, limit
        self.served: Counter[str] = Counter()
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)

    def _run(self) -> None:
        c = client(self.srv)
        for i in range(self.limit):
            if self.stop.is_set():
                return
            try:
                if i % 2:
                    self.served[ask(self.srv, self.model)] += 1
                    continue
                raw = c.chat.completions.with_raw_response.create(
                    model=self.model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    stream=True,
                )
                text = "".join(
                    ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices
                )
                assert text, "an empty stream"
                self.served[raw.headers["x-llmgw-endpoint"]] += 1
            except Exception as exc:  # every failure is the test's to report
                self.failures.append(f"request {i}: {exc!r}")

    def count(self, endpoint: str) -> int:
        return self.served[endpoint]

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.thread.join(60)
        assert not self.thread.is_alive()


def post(srv: Server, body: object) -> httpx.Response:
    return httpx.post(f"{srv.admin}/api/v1/endpoints", json=body, timeout=10)


def delete(srv: Server, ident: str) -> httpx.Response:
    return httpx.delete(f"{srv.admin}/api/v1/endpoints/{ident}", timeout=10)


def error(r: httpx.Response) -> dict[str, object]:
    body: dict[str, dict[str, object]] = r.json()
    return body["error"]


def test_endpoints_added_and_removed_under_load(tmp_path: Path) -> None:
    with (
        sim(model="m") as (_, a),
        sim(model="m") as (_, b),
        sim("--decode-step-ms", "30", model="slow") as (_, slow),
        server("--endpoint", f"a={a}=m", config=store_config(tmp_path / "llmgw.db")) as srv,
    ):
        srv.wait_scraped()
        with Load(srv).running() as load:
            wait_for(lambda: load.count("a") >= 5, "requests served by a")
            added = post(srv, {"id": "b", "url": b, "models": ["m"], "weight": 2.0})
            assert added.status_code == 201, added.text
            view = added.json()
            assert view["id"] == "b" and view["source"] == "runtime" and view["weight"] == 2.0
            assert added.headers["location"] == "/api/v1/endpoints/b"
            wait_for(lambda: load.count("b") >= 5, "requests served by the added b")

            gone = delete(srv, "b")
            assert gone.status_code == 204, gone.text
            wait_for(lambda: "b" not in srv.endpoints(), "b removed")
            after = load.count("b")
            mark = load.count("a")
            wait_for(lambda: load.count("a") >= mark + 10, "requests served by a after")
            assert load.count("b") == after
        assert not load.failures, load.failures[:5]

        # A model only a new endpoint serves resolves at once, and goes with it; a
        # stream in flight to it when it is removed finishes whole.
        assert post(srv, {"id": "s", "url": slow, "models": ["slow"]}).status_code == 201
        assert "slow" in [m.id for m in client(srv).models.list()]
        stream = client(srv).chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "hi"}], max_tokens=60, stream=True
        )
        chunks = iter(stream)
        first = next(chunks)
        assert delete(srv, "s").status_code == 204
        state = srv.endpoints()["s"]
        assert state["draining"] is True and state["inflight"] == 1
        rest = list(chunks)
        finished = [ch.choices[0].finish_reason for ch in [first, *rest] if ch.choices]
        assert finished[-1] == "length"
        wait_for(lambda: "s" not in srv.endpoints(), "s removed once its stream ended")
        try:
            client(srv).chat.completions.create(
                model="slow", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        except openai.NotFoundError:
            pass
        else:
            raise AssertionError("model 'slow' still served after its one endpoint left")


def test_changes_are_checked_and_conflicts_refused(tmp_path: Path) -> None:
    with (
        sim(model="m") as (_, a),
        server("--endpoint", f"a={a}=m", config=store_config(tmp_path / "llmgw.db")) as srv,
    ):
        body = {"id": "b", "url": a, "models": ["m"]}
        # The configuration's rules, each naming its key.
        bad = post(srv, {**body, "url": "ftp://x"})
        assert bad.status_code == 400 and error(bad)["param"] == "url", bad.text
        bad = post(srv, {**body, "weight": 0})
        assert bad.status_code == 400 and error(bad)["param"] == "weight", bad.text
        bad = post(srv, {**body, "colour": "red"})
        assert bad.status_code == 400 and "colour" in str(error(bad)["message"]), bad.text
        bad = post(srv, {**body, "models": "m"})
        assert bad.status_code == 400 and error(bad)["param"] == "models", bad.text
        bad = post(srv, {**body, "kv_events": "tcp://127.0.0.1:5557"})
        assert bad.status_code == 400 and error(bad)["param"] == "kv_events", bad.text
        bad = httpx.post(f"{srv.admin}/api/v1/endpoints", content=b"[1]", timeout=10)
        assert bad.status_code == 415
        # Ids any source has.
        taken = post(srv, {**body, "id": "a"})
        assert taken.status_code == 409 and "configuration file" in str(error(taken)["message"])
        assert post(srv, body).status_code == 201
        again = post(srv, body)
        assert again.status_code == 409 and error(again)["code"] == "endpoint_exists"
        # Only runtime endpoints are removed here.
        configured = delete(srv, "a")
        assert configured.status_code == 409 and error(configured)["code"] == "endpoint_in_config"
        assert delete(srv, "nope").status_code == 404
        assert delete(srv, "b").status_code == 204
        assert delete(srv, "b").status_code == 404
        assert set(srv.endpoints()) == {"a"}

    with (
        sim(model="m") as (_, a),
        server("--endpoint", f"a={a}=m", config=FAST + '[store]\nurl = ""\n') as srv,
    ):
        refused = post(srv, {"id": "b", "url": a, "models": ["m"]})
        assert refused.status_code == 409 and error(refused)["code"] == "no_store", refused.text


def ctl(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-ctl"), "--admin", srv.admin, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_runtime_endpoints_are_kept_across_a_restart(tmp_path: Path) -> None:
    config = store_config(tmp_path / "llmgw.db", "[discovery]\nstart_empty = true\n")
    with sim(model="m") as (_, a):
        with server(config=config) as srv:
            assert srv.endpoints() == {}
            done = ctl(srv, "endpoints", "add", "a", a, "--model", "m", "--weight", "2")
            assert done.returncode == 0, done.stderr
            assert "added endpoint 'a'" in done.stdout
            srv.wait_scraped()
            assert ask(srv) == "a"
        with server(config=config) as srv:
            kept = srv.endpoints()["a"]
            assert kept["source"] == "runtime" and kept["weight"] == 2.0
            srv.wait_scraped()
            assert ask(srv) == "a"
            done = ctl(srv, "endpoints", "remove", "a")
            assert done.returncode == 0, done.stderr
            wait_for(lambda: srv.endpoints() == {}, "a removed")
        with server(config=config) as srv:
            assert srv.endpoints() == {}


def test_worker_processes_serve_runtime_endpoints(tmp_path: Path) -> None:
    config = store_config(tmp_path / "llmgw.db")
    with (
        sim(model="m") as (_, a),
        sim(model="m") as (_, b),
        sim(model="w") as (_, w),
        # The flag: tests/conftest.py sets LLMGW_WORKERS=1, over the file's key.
        server("--endpoint", f"a={a}=m", "--workers", "2", config=config) as srv,
    ):
        srv.wait_scraped()
        assert srv.metric("llmgw_workers") == 2
        assert post(srv, {"id": "w", "url": w, "models": ["w"]}).status_code == 201
        # Each request on a connection of its own: the kernel spreads them over both
        # workers (SO_REUSEPORT); every one must know the new endpoint and its model.
        assert {ask(srv, "w") for _ in range(20)} == {"w"}
        with Load(srv).running() as load:
            wait_for(lambda: load.count("a") >= 5, "requests served by a")
            assert post(srv, {"id": "b", "url": b, "models": ["m"]}).status_code == 201
            wait_for(lambda: load.count("b") >= 5, "requests served by the added b")
            assert delete(srv, "b").status_code == 204
            wait_for(lambda: "b" not in srv.endpoints(), "b removed")
            mark = load.count("a")
            wait_for(lambda: load.count("a") >= mark + 10, "requests served by a after")
        assert not load.failures, load.failures[:5]
        assert delete(srv, "w").status_code == 204

        def refused_everywhere() -> bool:
            for _ in range(10):
                try:
                    ask(srv, "w")
                except openai.NotFoundError:
                    continue
                return False
            return True

        wait_for(refused_everywhere, "every worker forgot w")


def test_instances_on_one_postgresql_see_each_others_endpoints(pg_cluster: TempCluster) -> None:
    url = pg_cluster.new_database()
    config = f'{FAST}\n[store]\nurl = "{url}"\n[discovery]\nstart_empty = true\n'
    with (
        sim(model="m") as (_, a),
        server(config=config) as one,
        server(config=config) as two,
    ):
        assert post(one, {"id": "a", "url": a, "models": ["m"]}).status_code == 201
        wait_for(lambda: "a" in two.endpoints(), "the other instance took a")
        two.wait_scraped()
        assert ask(two) == "a"
        # Removed through the other: gone from both.
        assert delete(two, "a").status_code == 204
        wait_for(lambda: "a" not in one.endpoints(), "the first instance let a go")
