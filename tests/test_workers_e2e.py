"""Every core, through real processes (issue #20): llmgw-server --workers 2 in front of
two simulators, a SQLite store, the official openai client on fresh connections.

Both workers serve (the kernel spreads connections over their SO_REUSEPORT sockets);
the control process's /metrics, usage and admission views add up what they served; a
prompt has one home replica whichever worker takes it; a worker killed with SIGKILL
is started again while the other keeps serving; the client port's /admin pages are
the control process's; SIGTERM drains a stream in flight.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from tests.procs import Server, server, sim, wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def workers_of(srv: Server) -> list[int]:
    """The worker processes' pids (the server's children running llmgw.workers.worker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == srv.proc.pid and b"llmgw.workers.worker" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def fresh_client(srv: Server) -> openai.OpenAI:
    # A client per request: a new connection each time, which the kernel may give to
    # either worker.
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[str]]]:
    store = tmp_path_factory.mktemp("workers") / "llmgw.db"
    with ExitStack() as stack:
        engines = [stack.enter_context(sim("--max-num-seqs", "64", model="m"))[1] for _ in "ab"]
        args = [f"--endpoint=e{i}={url}=m" for i, url in enumerate(engines)]
        config = f'[store]\nurl = "sqlite:///{store}"\n'
        srv = stack.enter_context(server(*args, "--workers", "2", config=config))
        srv.wait_scraped()
        yield srv, engines


def test_both_workers_serve_and_the_control_process_adds_them_up(
    pool: tuple[Server, list[str]],
) -> None:
    srv, _ = pool
    pids = workers_of(srv)
    assert len(pids) == 2
    before = {pid: cpu_ticks(pid) for pid in pids}
    served = 0
    for i in range(120):
        done = fresh_client(srv).completions.create(model="m", prompt=f"p{i}", max_tokens=2)
        assert done.usage is not None and done.usage.completion_tokens == 2
        served += 1
    # Each worker did its share of the work (CPU time, in ticks of 10 ms).
    spent = {pid: cpu_ticks(pid) - before[pid] for pid in pids}
    assert all(t >= 5 for t in spent.values()), spent
    # One /metrics: the workers' counts added up.
    wait_for(
        lambda: srv.metric("llmgw_requests_total", model="m", status="200") >= served,
        "every request in the merged metrics",
    )
    assert srv.metric("llmgw_workers") == 2

    # One usage store: every worker's records (batched, then written by the batcher).
    def usage() -> float:
        r = httpx.get(f"{srv.admin}/api/v1/usage", params={"group_by": "model"}, timeout=5)
        return sum(row["requests"] for row in r.json()["usage"])

    wait_for(lambda: usage() >= served, "every request in the store's usage")


def test_a_prompt_has_one_home_whichever_worker_takes_it(pool: tuple[Server, list[str]]) -> None:
    srv, _ = pool
    homes: dict[int, Counter[str]] = {}
    block = "lorem ipsum dolor sit amet " * 40  # longer than one prefix block
    for round_ in range(6):
        for tenant in range(8):
            rid = f"t{tenant}r{round_}"
            fresh_client(srv).completions.create(
                model="m",
                prompt=f"tenant {tenant} " + block + f" question {round_}",
                max_tokens=1,
                extra_headers={"x-request-id": rid},
            )
    log = srv.proc.output()
    for line in log.splitlines():
        if "llmgw.access" not in line or "request_id=t" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        tenant = int(fields["request_id"][1:].split("r")[0])
        homes.setdefault(tenant, Counter())[fields["endpoint"]] += 1
    assert len(homes) == 8
    for tenant, where in homes.items():
        assert len(where) == 1, f"tenant {tenant} served by {dict(where)}"


def test_the_client_port_admin_pages_are_the_control_processes(
    pool: tuple[Server, list[str]],
) -> None:
    srv, _ = pool
    with httpx.Client(base_url=srv.base, timeout=5) as browser:
        page = browser.get("/admin/login")
        assert page.status_code == 200 and "Log in" in page.text
        token = browser.cookies["llmgw_csrf"]  # the cookie came back through the worker
        # Failed logins are limited by the client's address, which the worker forwards:
        # five, then 429 (one limit for all clients would have been reached by now, or
        # never, by the workers' own addresses).
        for _ in range(5):
            r = browser.post("/admin/login", data={"csrf": token, "key": "wrong"})
            assert r.status_code == 401, r.text
        r = browser.post("/admin/login", data={"csrf": token, "key": "wrong"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def test_a_killed_worker_is_started_again_while_the_other_serves(
    pool: tuple[Server, list[str]],
) -> None:
    srv, _ = pool
    victim, survivor = workers_of(srv)
    restarts = srv.metric("llmgw_worker_restarts_total")
    os.kill(victim, signal.SIGKILL)
    # Meanwhile the other worker takes every new connection.
    ok = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and ok < 20:
        try:
            fresh_client(srv).completions.create(model="m", prompt="again", max_tokens=1)
            ok += 1
        except openai.APIConnectionError:
            pass  # a connection the kernel queued on the dead worker's socket
    assert ok == 20
    wait_for(lambda: len(workers_of(srv)) == 2, "a new worker in the dead one's place")
    assert survivor in workers_of(srv) and victim not in workers_of(srv)
    assert srv.metric("llmgw_worker_restarts_total") == restarts + 1
    wait_for(lambda: srv.metric("llmgw_workers") == 2, "two workers counted")


def test_sigterm_drains_a_stream_in_flight() -> None:
    with (
        sim("--decode-step-ms", "50", model="m") as (_, engine),
        server(f"--endpoint=e={engine}=m", "--workers", "2") as srv,
    ):
        srv.wait_scraped()
        chunks: list[object] = []
        errors: list[BaseException] = []

        def stream() -> None:
            try:
                for chunk in fresh_client(srv).completions.create(
                    model="m", prompt="long", max_tokens=40, stream=True
                ):
                    chunks.append(chunk)
            except BaseException as exc:  # the finding if any
                errors.append(exc)

        t = threading.Thread(target=stream)
        t.start()
        wait_for(lambda: len(chunks) >= 3, "the stream under way")
        srv.proc.popen.send_signal(signal.SIGTERM)
        t.join(30)
        assert not errors
        texts = [c for c in chunks if c.choices and c.choices[0].text]  # type: ignore[attr-defined]
        assert len(texts) == 40
        assert chunks[-1].choices[0].finish_reason == "length"  # type: ignore[attr-defined]
        assert srv.proc.popen.wait(30) == 0
        assert workers_of(srv) == []


def test_a_keys_rpm_holds_across_workers(tmp_path: Path) -> None:
    """Each worker admits from the same minute (the store's grants), not one each."""
    config = f'[store]\nurl = "sqlite:///{tmp_path / "llmgw.db"}"\n'
    with (
        sim(model="m") as (_, engine),
        server(f"--endpoint=e={engine}=m", "--workers", "2", config=config) as srv,
    ):
        srv.wait_scraped()
        made = httpx.post(f"{srv.admin}/api/v1/keys", json={"name": "k", "rpm": 40}, timeout=5)
        assert made.status_code == 201, made.text
        secret = made.json()["secret"]
        codes: Counter[int] = Counter()
        for _ in range(100):
            client = openai.OpenAI(
                base_url=f"{srv.base}/v1", api_key=secret, max_retries=0, timeout=30
            )
            try:
                client.completions.create(model="m", prompt="x", max_tokens=1)
                codes[200] += 1
            except openai.RateLimitError:
                codes[429] += 1
        # 40 a minute between both workers (less at most a lease each: 1 of 40 here).
        assert 38 <= codes[200] <= 40, codes
        assert codes[200] + codes[429] == 100


def test_the_engines_are_scraped_once_for_all_workers() -> None:
    """The control process scrapes each engine and passes what it found to the
    workers (wire.Samples): an engine sees one scraper, not one per worker."""
    with (
        sim(model="m") as (_, engine),
        server(f"--endpoint=e={engine}=m", "--workers", "2") as srv,
    ):
        srv.wait_scraped()

        def scrapes() -> float:
            # Every process's scrapes, added up by the control process's /metrics.
            return srv.metric("llmgw_scrapes_total")

        started, first = time.monotonic(), scrapes()
        wait_for(lambda: scrapes() >= first + 6, "six more scrapes", timeout=30)
        rate = (scrapes() - first) / (time.monotonic() - started)
        # One scraper at scrape_interval (1 s): about one a second; three scrapers
        # (the control process and two workers) would make three.
        assert rate < 1.8, f"{rate:.1f} scrapes a second: the workers scrape too"
        # And the workers route by what was passed on: a request is served.
        r = httpx.post(
            f"{srv.base}/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 1},
            timeout=10,
        )
        assert r.status_code == 200, r.text
