"""Routing on the engines' own KV-cache index, end to end: real llmgw-sim processes
publishing vLLM's KV-cache events over ZMQ, a real llmgw-server subscribed to them."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterator

import httpx

from .procs import Server, server, set_faults, sim, wait_for
from .test_router_e2e import ACME, ask_at, ask_tenant

CONFIG = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[router.affinity]
kv_events_timeout = "{timeout}"
"""

_fresh = itertools.count()


def direct(base: str, content: str, max_tokens: int = 2) -> None:
    """A chat request straight to one engine (the router does not see it)."""
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        timeout=30,
    )
    r.raise_for_status()


def fresh_prompt() -> str:
    """A prompt no engine holds (several whole blocks of tokens)."""
    return f"fresh prompt number {next(_fresh)} " * 20


@contextlib.contextmanager
def publishing_fleet(
    n: int,
    timeout: str = "10s",
    *,
    replay: bool = False,
    before_router: Callable[[list[str]], None] | None = None,
) -> Iterator[tuple[Server, list[str]]]:
    """`n` sims publishing KV-cache events (with `replay`, answering replay requests
    too), behind one router subscribed to them (`before_router` is called with their
    base URLs before it starts); yields once every feed is up (each engine asked
    directly until its events arrive: a SUB socket connects asynchronously, and what
    is published before it has is not received)."""
    with contextlib.ExitStack() as stack:
        extra = ("--kv-events-replay-endpoint", "tcp://127.0.0.1:0") if replay else ()
        sims = [
            stack.enter_context(sim("--kv-events-endpoint", "tcp://127.0.0.1:0", *extra, model="m"))
            for _ in range(n)
        ]
        bases = [url for _, url in sims]
        if before_router is not None:
            before_router(bases)
        config = CONFIG.format(timeout=timeout)
        for i, (proc, url) in enumerate(sims):
            config += (
                f'\n[[endpoints]]\nid = "s{i}"\nurl = "{url}"\nmodels = ["m"]\n'
                f'kv_events = "{proc.ready["kv_events"][0]}"\n'
            )
            if replay:
                config += f'kv_events_replay = "{proc.ready["kv_events_replay"][0]}"\n'
        srv = stack.enter_context(server(config=config))
        srv.wait_scraped()
        for i, base in enumerate(bases):

            def up(i: int = i, base: str = base) -> bool:
                if srv.metric("llmgw_kv_events_up", endpoint=f"s{i}") == 1:
                    return True
                direct(base, fresh_prompt())
                return False

            wait_for(up, f"s{i}'s KV-cache events up", 20, interval=0.1)
        yield srv, bases


def test_the_router_follows_the_engines_index_over_its_estimate() -> None:
    """The estimated table is made wrong: the tenant's prefix went to one replica (its
    home by the table), whose cache is then reset, while the other replica is given
    the prefix directly, unseen by the router. The engines' events say where it is,
    and every next request of the tenant goes there."""
    with publishing_fleet(2) as (srv, bases):
        home = ask_tenant(srv, 0).headers["x-llmgw-endpoint"]
        other = "s1" if home == "s0" else "s0"
        base_of = {"s0": bases[0], "s1": bases[1]}

        def stored(ep: str) -> float:
            return srv.metric("llmgw_kv_events_total", endpoint=ep, kind="stored")

        def cleared(ep: str) -> float:
            return srv.metric("llmgw_kv_events_total", endpoint=ep, kind="cleared")

        before = stored(other)
        httpx.post(f"{base_of[home]}/reset_prefix_cache", timeout=10).raise_for_status()
        # The tenant's first question again, straight to the other replica.
        r = httpx.post(
            f"{base_of[other]}/v1/chat/completions",
            json={
                "model": "m",
                "messages": [
                    {"role": "system", "content": ACME},
                    {"role": "user", "content": "question 0"},
                ],
                "max_tokens": 2,
            },
            timeout=30,
        )
        r.raise_for_status()
        wait_for(
            lambda: cleared(home) >= 1 and stored(other) > before,
            "the reset and the other replica's blocks announced",
            10,
            interval=0.05,
        )
        exact_before = srv.metric("llmgw_kv_lookups_total", model="m", outcome="exact")
        seen = Counter(ask_tenant(srv, i).headers["x-llmgw-endpoint"] for i in range(1, 9))
        assert seen == Counter({other: 8}), (home, seen)
        assert srv.metric("llmgw_kv_lookups_total", model="m", outcome="exact") >= exact_before + 8
        # The engine that served them confirms: the prefix was cached there.
        assert srv.metric("llmgw_cached_prompt_tokens_total", endpoint=other) > 0


def test_silent_events_fall_back_to_the_estimate_and_say_so() -> None:
    """A replica's publisher stops (the sim drops its batches) while it serves
    requests that store blocks: past kv_events_timeout its feed is down (the gauge,
    one log line) and the router routes on the estimated table for it; when the
    events come back, so does the feed, and the lost messages are counted."""
    with publishing_fleet(2, timeout="1s") as (srv, bases):
        set_faults(bases[0], kv_events_paused=True)

        def down() -> bool:
            if srv.metric("llmgw_kv_events_up", endpoint="s0") == 0:
                return True
            # New prompts, through the router: those that land on s0 owe it events.
            r = httpx.post(
                f"{srv.base}/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": fresh_prompt()}],
                    "max_tokens": 2,
                },
                timeout=30,
            )
            r.raise_for_status()
            return False

        wait_for(down, "s0's KV-cache events down", 20, interval=0.2)
        assert srv.metric("llmgw_kv_events_up", endpoint="s1") == 1
        wait_for(
            lambda: "endpoint s0 (" in srv.proc.output() and "silent for" in srv.proc.output(),
            "the transition logged",
            5,
            interval=0.05,
        )
        # Requests still route (s0 on its estimate), and the lookup for s1 stays exact.
        ask_tenant(srv, 100)

        set_faults(bases[0], kv_events_paused=False)
        direct(bases[0], fresh_prompt())
        wait_for(
            lambda: srv.metric("llmgw_kv_events_up", endpoint="s0") == 1,
            "s0's KV-cache events up again",
            10,
            interval=0.05,
        )
        assert srv.metric("llmgw_kv_events_total", endpoint="s0", kind="missed") >= 1
        lines = srv.proc.output().splitlines()
        assert sum("endpoint s0 (" in line and "silent for" in line for line in lines) == 1
        assert sum("endpoint s0 (" in line and ": up;" in line for line in lines) == 2


BETA = "You answer for the tenant BETA, briefly and politely. " * 60


def test_replay_fills_what_the_router_missed() -> None:
    """With the engines' replay sockets, what an engine cached before the router
    connected, and what it announced while its messages were lost, are asked for and
    learnt: the router sends each tenant to the replica that holds its prefix."""
    with publishing_fleet(
        2, replay=True, before_router=lambda bases: ask_at(bases[1], 0, ACME)
    ) as (srv, bases):

        def counted(ep: str, kind: str) -> float:
            return srv.metric("llmgw_kv_events_total", endpoint=ep, kind=kind)

        assert counted("s1", "replayed") >= 1
        seen = Counter(ask_tenant(srv, i).headers["x-llmgw-endpoint"] for i in range(1, 7))
        assert seen == Counter({"s1": 6}), seen

        # s0's messages are lost on the way (kept in its replay buffer) while it caches
        # BETA's prefix; its next message shows the gap, and the replay fills it.
        replayed = counted("s0", "replayed")
        set_faults(bases[0], kv_events_paused=True)
        ask_at(bases[0], 0, BETA)
        set_faults(bases[0], kv_events_paused=False)
        direct(bases[0], fresh_prompt())
        wait_for(
            lambda: counted("s0", "replayed") > replayed, "s0's gap replayed", 10, interval=0.05
        )
        assert counted("s0", "missed") == 0
        seen = Counter(
            ask_tenant(srv, i, system=BETA).headers["x-llmgw-endpoint"] for i in range(1, 7)
        )
        assert seen == Counter({"s0": 6}), seen
