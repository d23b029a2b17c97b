"""Scheduler plugins by name (issue #35): routing profiles name filters, scorers and a
picker in the configuration; a name that resolves to nothing is refused, never ignored;
an installed package's plugin is found by its entry point, in worker processes too."""

from __future__ import annotations

import functools
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

import llmgw
from llmgw.config import ConfigError, RoutingProfile, ScoringConfig
from llmgw.router.scheduling import Candidate, Context, Decision, registry
from llmgw.router.scheduling.hooks import Ask, Done

from .procs import BIN, scratch_dir, server, sim

SCORING = ScoringConfig()


def candidate(endpoint_id: str) -> Candidate:
    # Freshly scraped and idle: equal on every built-in term.
    return Candidate(endpoint_id, waiting=0, running=0, kv_usage=0.0, inflight=0, age=0.1)


class Prefer:
    """Costs 1 on every replica but `endpoint_id`."""

    def __init__(self, endpoint_id: str) -> None:
        self.endpoint_id = endpoint_id

    def cost(self, ctx: Context, i: int) -> float:
        return 0.0 if ctx.candidates[i].endpoint_id == self.endpoint_id else 1.0


class OnlyLast:
    def filter(self, ctx: Context, survivors: list[int]) -> list[int]:
        return survivors[-1:]


@pytest.fixture
def registered() -> Iterator[None]:
    registry.register("scorer", "test-prefer-b", lambda settings: Prefer("b"))
    registry.register("filter", "test-only-last", lambda settings: OnlyLast())
    try:
        yield
    finally:
        registry.unregister("scorer", "test-prefer-b")
        registry.unregister("filter", "test-only-last")


def picks(profile: RoutingProfile, n: int = 50) -> set[str]:
    (scheduler,) = registry.build(SCORING, {"p": profile}, stale_after=10.0).values()
    rng = random.Random(7)
    chosen = set()
    for _ in range(n):
        d = scheduler.pick(
            [candidate("a"), candidate("b"), candidate("c")],
            session_endpoint=None,
            prefix_matches={},
            rng=rng,
        )
        assert d is not None
        chosen.add(d.endpoint_id)
    return chosen


def test_a_registered_scorer_named_in_a_profile_decides(registered: None) -> None:
    assert picks(RoutingProfile()) == {"a", "b", "c"}  # idle and equal: ties at random
    assert picks(RoutingProfile(scorers={"test-prefer-b": 2.0})) == {"b"}
    # Weight 0: named, but it weighs nothing.
    assert picks(RoutingProfile(scorers={"test-prefer-b": 0.0})) == {"a", "b", "c"}


def test_named_filters_run_after_the_rules_and_rule_none_runs_only_them(
    registered: None,
) -> None:
    work, only = registry.build(
        SCORING,
        {
            "work": RoutingProfile(filters=("test-only-last",)),
            "only": RoutingProfile(rule="none", filters=("test-only-last",)),
        },
        stale_after=10.0,
    ).values()
    assert [type(f).__name__ for f in work.filters] == [
        "Fresh",
        "SessionAffinity",
        "PrefixAffinity",
        "Room",
        "Rendezvous",
        "OnlyLast",
    ]
    assert [type(f).__name__ for f in only.filters] == ["OnlyLast"]
    assert picks(RoutingProfile(rule="none", filters=("test-only-last",))) == {"c"}


def test_unknown_names_are_configuration_errors_naming_their_keys() -> None:
    profile = RoutingProfile(filters=("nope-filter",), scorers={"nope": 1.0}, picker="nope-pick")
    with pytest.raises(ConfigError) as caught:
        registry.build(SCORING, {"chat": profile}, stale_after=10.0)
    problems = caught.value.problems
    assert len(problems) == 3
    assert problems[0].startswith("router.profiles.chat.filters[0]: no filter named 'nope-filter'")
    assert "rendezvous" in problems[0]  # the names there are
    assert problems[1].startswith("router.profiles.chat.scorers.nope: no scorer named 'nope'")
    assert problems[2].startswith("router.profiles.chat.picker: no picker named 'nope-pick'")
    # A built-in scorer has its weight field; naming it again is a mistake, not a sum.
    (problem,) = registry.problems({"chat": RoutingProfile(scorers={"queue": 2.0})})
    assert "'queue' is built in: its weight is the profile's `queue`" in problem


def test_a_plugin_registered_in_one_process_is_refused_when_workers_build_profiles(
    registered: None,
) -> None:
    profiles = {"chat": RoutingProfile(scorers={"test-prefer-b": 1.0})}
    assert registry.problems(profiles) == []
    (problem,) = registry.problems(profiles, portable=True)
    assert "registered in this process only" in problem and "llmgw.scorers" in problem


def test_a_scheduler_for_a_profile_the_configuration_lacks_is_refused() -> None:
    config = llmgw.load_config(data={}, environ={})
    scheduler = registry.default_scheduler(SCORING, RoutingProfile(), 10.0)
    with pytest.raises(ValueError, match="latency"):
        llmgw.Router(config, schedulers={"latency": scheduler})


def test_a_negative_plugin_weight_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"router\.profiles\.chat\.scorers\.x: weights must be 0"):
        llmgw.load_config(
            data={"router": {"profiles": {"chat": {"scorers": {"x": -1}}}}}, environ={}
        )


# -- a package's plugin, in real llmgw-server processes ---------------------------------

PLUGIN = """
class PreferEndpoint:
    def __init__(self, endpoint_id):
        self.endpoint_id = endpoint_id

    def cost(self, ctx, i):
        return 0.0 if ctx.candidates[i].endpoint_id == self.endpoint_id else 1.0


def prefer_b(settings):
    return PreferEndpoint("b")
"""


def installed_plugin() -> Path:
    """A directory holding an installed distribution (as pip leaves one in
    site-packages) whose entry point offers scorer `prefer-b`."""
    root = scratch_dir("llmgw-plugin-")
    (root / "llmgw_test_plugin.py").write_text(PLUGIN)
    info = root / "llmgw_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llmgw-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[llmgw.scorers]\nprefer-b = llmgw_test_plugin:prefer_b\n"
    )
    return root


def config(a: str, b: str, scorer: str, workers: int) -> str:
    return f"""
workers = {workers}
[store]
url = ""
[[endpoints]]
id = "a"
url = "{a}"
models = ["m"]
[[endpoints]]
id = "b"
url = "{b}"
models = ["m"]
[router.profiles.chat.scorers]
{scorer} = 5.0
"""


def with_path(root: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_scorer_from_an_installed_package_is_named_in_toml(workers: int) -> None:
    root = installed_plugin()
    with (
        sim(model="m") as (_, a),
        sim(model="m") as (_, b),
        server(config=config(a, b, "prefer-b", workers), env=with_path(root)) as srv,
    ):
        srv.wait_scraped()
        served = []
        with httpx.Client(base_url=srv.base, timeout=10) as client:
            for i in range(16):
                # A prompt of its own each: no prefix affinity, no session.
                body = {"model": "m", "prompt": f"request {i} " * (i + 1), "max_tokens": 1}
                r = client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                served.append(r.headers["x-llmgw-endpoint"])
        assert served == ["b"] * 16


def test_an_unknown_plugin_name_stops_the_server_with_the_key() -> None:
    root = installed_plugin()
    path = scratch_dir("llmgw-config-") / "llmgw.toml"
    path.write_text(config("http://127.0.0.1:9", "http://127.0.0.1:9", "prefer-c", 1))
    done = subprocess.run(
        [str(BIN / "llmgw-server"), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **with_path(root)},
    )
    assert done.returncode == 2, done.stderr
    assert "router.profiles.chat.scorers.prefer-c: no scorer named 'prefer-c'" in done.stderr
    assert "prefer-b" in done.stderr  # the installed package's is among the names there are


def test_profiles_keep_their_built_in_composition() -> None:
    """What every profile ran before names existed: the same plugins, the same order."""
    chat = RoutingProfile()
    (scheduler,) = registry.build(SCORING, {"chat": chat}, stale_after=10.0).values()
    assert [(type(s).__name__, w) for s, w in scheduler.scorers] == [
        ("Queue", chat.queue),
        ("Load", chat.inflight),
        ("Prefill", chat.prefill),
        ("KvCache", chat.kv),
        ("Staleness", chat.staleness),
        ("Unknown", 1.0),
        ("Stale", 1.0),
        ("Throttle", 1.0),
        ("PrefixBonus", chat.prefix),
    ]
    assert type(scheduler.picker).__name__ == "LowestCost"


class LeastPicked:
    """A stateful scorer: costs what it has picked of each replica, learnt through its
    hooks (pre_request counts a pick, complete sees the answer and the pick's note)."""

    def __init__(self) -> None:
        self.picked: dict[str, int] = {}
        self.completed: list[tuple[str, str, int, int | None, object]] = []

    def cost(self, ctx: Context, i: int) -> float:
        return float(self.picked.get(ctx.candidates[i].endpoint_id, 0))

    def pre_request(self, ask: Ask, decision: Decision, now: float) -> object:
        self.picked[decision.endpoint_id] = self.picked.get(decision.endpoint_id, 0) + 1
        return ("note", decision.endpoint_id)

    def complete(self, ask: Ask, done: Done, note: object) -> str | None:
        tokens = None if done.usage is None else done.usage.completion_tokens
        self.completed.append((ask.model, done.endpoint_id, done.status, tokens, note))
        return None


async def test_a_named_plugins_hooks_keep_its_state_through_each_request() -> None:
    made: list[LeastPicked] = []

    def factory(settings: registry.Settings) -> LeastPicked:
        made.append(LeastPicked())
        return made[-1]

    registry.register("scorer", "test-least-picked", factory)
    try:
        with sim(model="m") as (_, a), sim(model="m") as (_, b):
            (client_socket,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = client_socket.socket.getsockname()[1]
            profile = {"scorers": {"test-least-picked": 100.0}}
            config = llmgw.load_config(
                data={
                    "listen": "127.0.0.1:0",
                    "admin_listen": "127.0.0.1:0",
                    "endpoints": [
                        {"id": "a", "url": a, "models": ["m"]},
                        {"id": "b", "url": b, "models": ["m"]},
                    ],
                    # Two profiles name it: one object, one table.
                    "router": {"profiles": {"chat": profile, "other": profile}},
                },
                environ={},
            )
            stop = trio.Event()
            served = []
            async with (
                llmgw.assemble(
                    config, client_listeners=[client_socket], admin_listeners=[]
                ) as gateway,
                trio.open_nursery() as nursery,
            ):
                await nursery.start(
                    functools.partial(llmgw.serve, gateway, shutdown=stop, handle_signals=False)
                )
                # Both scraped: equal on every built-in term, so the plugin alone decides.
                with trio.fail_after(10):
                    while any(s.sample is None for s in gateway.router.endpoints.all()):
                        await gateway.router.scraper.next_pass()
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    for i in range(6):
                        body = {"model": "m", "prompt": f"request {i}", "max_tokens": 2}
                        r = await client.post("/v1/completions", json=body)
                        assert r.status_code == 200, r.text
                        served.append(r.headers["x-llmgw-endpoint"])
                stop.set()
    finally:
        registry.unregister("scorer", "test-least-picked")
    (plugin,) = made
    # Each pick raised the picked replica's cost: every second pick goes to the other
    # replica (after a tie, broken at random).
    assert [set(served[i : i + 2]) for i in range(0, 6, 2)] == [{"a", "b"}] * 3
    assert plugin.picked == {"a": 3, "b": 3}
    # complete heard of every request, at the replica that served it, with its usage
    # and the note its own pre_request returned.
    assert plugin.completed == [("m", ep, 200, 2, ("note", ep)) for ep in served]
