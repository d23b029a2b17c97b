"""A kill -9 under load loses at most one flush interval of usage records, on both
store backends (SQLite, and PostgreSQL in the session's cluster: tests/conftest.py).

`llmgw.store.usage` promises that a crash loses only what is still buffered: at most
one flush interval of records while the store keeps up. Here a real llmgw-server with
a store and an API key is driven by a steady, paced load from a few threads,
SIGKILLed in the middle of it, and the store is read back and counted against the
responses the clients received.

The server has no configuration key for the batcher: it builds ``UsageBatcher(store)``
with its defaults (flush every 1 s, batches of 500), so the interval used below is the
constructor's default, read from its signature.
"""

from __future__ import annotations

import inspect
import signal
import threading
import time

import httpx
import trio

from llmgw.store import open_store
from llmgw.store.usage import UsageBatcher

from .procs import server, sim, wait_for

FLUSH_INTERVAL: float = inspect.signature(UsageBatcher).parameters["flush_interval"].default
# Slack for the write after an interval ends (a transaction in a worker thread), the
# scheduler on 2 shared cores, and the gap between the server's record() and the
# client seeing the response.
MARGIN = 1.5
WINDOW = FLUSH_INTERVAL + MARGIN

THREADS = 4
PERIOD = 0.05  # s between one thread's requests: ~80 requests/s in all
PER_THREAD = 130  # bounds the load at ~6.5 s; the kill comes before that
# Answered more than WINDOW before the kill: at the pace above, the kill comes ~4 s in.
ANSWERED_BEFORE = 120

CONFIG = """
[store]
url = "{url}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""
FAST_SIM = (
    "--decode-step-ms", "1",
    "--decode-ms-per-seq", "0.01",
    "--prefill-us-per-token", "1",
)  # fmt: skip


def make_key(url: str) -> str:
    async def create() -> str:
        store = await open_store(url)
        try:
            _, secret = await store.create_key("load")
            return secret
        finally:
            await store.aclose()

    return trio.run(create)


def stored_requests(url: str) -> int:
    async def read() -> int:
        store = await open_store(url)
        try:
            return sum(r.requests for r in await store.usage_summary("model"))
        finally:
            await store.aclose()

    return trio.run(read)


class Load:
    """`THREADS` threads, each sending up to `PER_THREAD` paced requests; the
    monotonic time of every successful response is kept."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.key = key
        self.answered: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(THREADS)]

    def _run(self) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.base, timeout=10, trust_env=False) as client:
            start = time.monotonic()
            for i in range(PER_THREAD):
                if self.stop.is_set():
                    return
                delay = start + i * PERIOD - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the load's pace: one request every PERIOD
                try:
                    r = client.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError as exc:
                    if not self.stop.is_set():
                        with self._lock:
                            self.errors.append(repr(exc))
                    return
                done = time.monotonic()
                if r.status_code == 200:
                    with self._lock:
                        self.answered.append(done)
                elif not self.stop.is_set():
                    with self._lock:
                        self.errors.append(f"{r.status_code}: {r.text[:200]}")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=15)
            assert not t.is_alive(), "a load thread hung"


def test_kill_9_loses_at_most_one_flush_interval_of_usage(store_url: str) -> None:
    assert FLUSH_INTERVAL == 1.0  # the default this test was written against
    key = make_key(store_url)
    with (
        sim(*FAST_SIM, model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(url=store_url)) as srv,
    ):
        srv.wait_scraped()
        load = Load(srv.base, key)
        load.start()
        # The kill comes in the middle of the load, once enough of it was answered
        # long enough ago (more than WINDOW) for the count below to mean something.
        wait_for(
            lambda: sum(t <= time.monotonic() - WINDOW for t in load.answered) >= ANSWERED_BEFORE,
            f"{ANSWERED_BEFORE} requests answered more than {WINDOW:g} s ago",
            30,
            context=lambda: f"{len(load.answered)} answered; errors: {load.errors[:3]}",
        )
        assert any(t.is_alive() for t in load.threads), "the load ended before the kill"
        killed_at = time.monotonic()
        load.stop.set()  # errors from now on are the kill's
        srv.proc.kill(signal.SIGKILL)
        assert srv.proc.popen.wait(10) == -signal.SIGKILL
        load.join()
        assert not load.errors, load.errors[:5]
        answered = sorted(load.answered)
    stored = stored_requests(store_url)

    cutoff = killed_at - WINDOW
    before_cutoff = sum(1 for t in answered if t <= cutoff)
    in_window = len(answered) - before_cutoff  # last WINDOW s, and any reply read after the kill
    missing = len(answered) - stored
    print(
        f"flush interval {FLUSH_INTERVAL:g} s (batcher default), margin {MARGIN:g} s; "
        f"answered {len(answered)} ({before_cutoff} more than {WINDOW:g} s before the kill, "
        f"{in_window} within it), stored {stored}, missing {missing}"
    )
    assert before_cutoff >= ANSWERED_BEFORE, "too little load before the window to mean anything"
    # Nothing counted twice (nor a record of a request no client saw answered).
    assert stored <= len(answered)
    # The batcher writes in order (a FIFO buffer), so the stored records are the
    # oldest ones: at least every request answered before the window is among them...
    assert stored >= before_cutoff
    # ... i.e. what is missing was answered within the last flush interval + margin.
    assert missing <= in_window
