"""Priority bands through a real llmgw-server in front of a simulator."""

from __future__ import annotations

import contextlib
import time

import httpx

from .procs import server, sim

CONFIG = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
[router.scoring]
target_inflight = 2.0
[router.admission]
queue_ttl = "1s"
"""


def request(base: str, band: str | None, max_tokens: int = 2) -> httpx.Response:
    headers = {"x-llmgw-band": band} if band else {}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_bands_queue_and_expire_by_their_ceilings() -> None:
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG) as srv,
    ):
        srv.wait_scraped()
        r = request(srv.base, "iron")
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "unknown_band"
        assert "valid bands: platinum, gold, silver, bronze" in r.json()["error"]["message"]

        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 3000,
            "stream": True,
        }
        with contextlib.ExitStack() as streams:
            # Two gold streams hold the pool at saturation 2/2 = 1.0. (Their line
            # iterators are kept: a collected iterator closes its stream.)
            held = []
            for _ in range(2):
                s = streams.enter_context(
                    httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30)
                )
                held.append(s.iter_lines())
                next(line for line in held[-1] if line.startswith("data: "))
            t0 = time.monotonic()
            r = request(srv.base, "bronze")
            waited = time.monotonic() - t0
            assert r.status_code == 429
            assert r.json()["error"]["code"] == "expired"
            assert int(r.headers["retry-after"]) >= 1
            assert 0.9 <= waited < 5
            assert (
                srv.metric("llmgw_admission_rejected_total", band="bronze", reason="expired") == 1
            )
            snapshot = httpx.get(f"{srv.admin}/api/v1/admission", timeout=5).json()
            assert snapshot  # live view exists while the pool is saturated
        # The streams are gone: bronze flows again.
        deadline = time.monotonic() + 10
        while (r := request(srv.base, "bronze")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 200
        assert (
            srv.metric("llmgw_admission_wait_seconds_count", band="bronze", outcome="expired") == 1
        )
