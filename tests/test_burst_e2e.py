"""A burst through real processes (issue #22): llmgw-server in control-plane mode, an
llmgw-agent over gRPC, simulators with four sequence slots each, and streams from the
official openai client.

An autoscaled model (1 to 3 replicas) gets a burst of twelve concurrent streams: its
one replica is full by its engine's account, so the autoscaler adds replicas up to
three. The burst then falls to two streams, and the model drains back to one replica.
Every stream of the whole run arrives whole (every token, a finish reason, usage):
no request fails and no stream is cut, by the scale-up nor by the drains.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from tests.procs import FleetServer, agent, fleet_server
from tests.test_fleet_e2e import client, control_config

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

# Four slots and 40 ms steps: a 40-token stream holds a slot for about 1.6 s.
BURSTY = """
[[models]]
name = "bursty"
replicas = 1

[models.autoscale]
min_replicas = 1
max_replicas = 3
target_saturation = 0.7
scale_up_window = "1s"
scale_down_window = "2s"
idle_timeout = "10m"

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
args = ["--max-num-seqs", "4", "--decode-step-ms", "40", "--decode-ms-per-seq", "0"]
"""
TOKENS = 40


class Streams:
    """Clients that each stream one chat completion after another until told to stop,
    checking every stream is whole. Bounded: each stops at its own deadline too."""

    def __init__(self, srv: FleetServer, pool: ThreadPoolExecutor, deadline: float) -> None:
        self.srv, self.pool, self.deadline = srv, pool, deadline
        self.lock = threading.Lock()
        self.whole = 0
        self.problems: list[str] = []
        self.running: list[tuple[threading.Event, Future[None]]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            stop = threading.Event()
            self.running.append((stop, self.pool.submit(self._loop, stop)))

    def stop(self, count: int) -> None:
        """Stop `count` clients (each after the stream it is in finishes)."""
        for stop, done in self.running[:count]:
            stop.set()
            done.result(timeout=60)
        del self.running[:count]

    def _loop(self, stop: threading.Event) -> None:
        openai = client(self.srv)
        while not stop.is_set() and time.monotonic() < self.deadline:
            try:
                chunks = list(
                    openai.chat.completions.create(
                        model="bursty",
                        messages=[{"role": "user", "content": "a burst"}],
                        max_tokens=TOKENS,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices]
                usage = chunks[-1].usage
                ok = (
                    finish[-1] == "length"
                    and usage is not None
                    and usage.completion_tokens == TOKENS
                    and bool(text)
                )
                with self.lock:
                    if ok:
                        self.whole += 1
                    else:
                        self.problems.append(f"cut: finish={finish[-1:]} usage={usage}")
            except Exception as exc:  # every failure is the finding
                with self.lock:
                    self.problems.append(f"{type(exc).__name__}: {exc}")


def test_a_burst_scales_one_to_three_and_back_with_every_stream_whole() -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(control_config([BURSTY])))
        node = stack.enter_context(
            agent(srv.agent_address, "n1", address="127.0.0.31", gpus="4x80GB")
        )
        srv.wait(lambda: srv.ready_replicas("bursty", 1), "one replica", logs=[node.proc])
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=12))
        streams = Streams(srv, pool, deadline=time.monotonic() + 120)
        stack.callback(lambda: streams.stop(len(streams.running)))

        def active() -> int:
            return sum(r["state"] in ("starting", "ready") for r in srv.replicas("bursty"))

        def settled(count: int) -> Callable[[], bool]:
            # `count` replicas, all ready, and none left draining.
            return lambda: (
                len(srv.replicas("bursty")) == count and bool(srv.ready_replicas("bursty", count))
            )

        streams.start(12)
        srv.wait(settled(3), "three ready replicas under the burst", timeout=60)
        assert active() == 3  # never above max_replicas
        streams.stop(10)
        srv.wait(settled(1), "back to one replica after the burst", timeout=60)
        streams.stop(2)

        assert streams.problems == []
        assert streams.whole >= 12
        events = "llmgw_fleet_scale_events_total"
        assert srv.metric(events, model="bursty", direction="up", cause="load") >= 1
        assert srv.metric(events, model="bursty", direction="down", cause="cool") == 2
        # The drains cut nothing: no request failed, from the router's side either.
        assert srv.metric("llmgw_requests_total", model="bursty", status="200") == streams.whole
