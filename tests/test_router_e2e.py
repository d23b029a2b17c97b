"""The router end to end: real llmgw-server and llmgw-sim processes, the official client."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

import llmgw

from .procs import Server, server, set_faults, sim, sim_metric, wait_for

FAST = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""


def client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30)


def chat(srv: Server, content: str = "hello", **extra: object) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    body.update(extra)
    return httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=30)


@contextlib.contextmanager
def fleet(n: int, *sim_args: str, config: str = FAST) -> Iterator[tuple[Server, list[str]]]:
    """`n` simulators serving model `m` (ids s0..), behind one router."""
    with contextlib.ExitStack() as stack:
        bases = [stack.enter_context(sim(*sim_args, model="m"))[1] for _ in range(n)]
        flags = [arg for i, b in enumerate(bases) for arg in ("--endpoint", f"s{i}={b}=m")]
        srv = stack.enter_context(server(*flags, config=config))
        srv.wait_scraped()
        yield srv, bases


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, list[str]]]:
    with fleet(2) as f:
        yield f


def test_chat_completions_embeddings_and_models(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    c = client(srv)
    reply = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 5

    chunks = list(
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip()

    done = c.completions.create(model="m", prompt="once upon a time", max_tokens=3)
    assert done.usage is not None and done.usage.completion_tokens == 3

    emb = c.embeddings.create(model="m", input="some text")
    assert len(emb.data[0].embedding) > 0

    assert [m.id for m in c.models.list()] == ["m"]


def test_usage_is_injected_counted_and_stripped(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    before = srv.metric("llmgw_completion_tokens_total", model="m")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "count me"}],
        "max_tokens": 7,
        "stream": True,
    }
    with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    assert events[-1] == "data: [DONE]"
    # The client did not ask for usage: the injected usage chunk never reaches it.
    assert all(not p.get("usage") for p in payloads)
    assert srv.metric("llmgw_completion_tokens_total", model="m") - before == 7

    # A client that asks gets the engine's usage chunk, consistent with the stream.
    c = client(srv)
    chunks = list(
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "count me"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert srv.metric("llmgw_estimated_usage_requests_total") == 0


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": []}', 400, None),
        (b'{"model": "nope", "messages": []}', 404, "model_not_found"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    pair: tuple[Server, list[str]], raw: bytes, status: int, code: str | None
) -> None:
    srv, _ = pair
    r = httpx.post(f"{srv.base}/v1/chat/completions", content=raw, timeout=10)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]


def test_openai_client_sees_not_found(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    with pytest.raises(openai.NotFoundError):
        client(srv).chat.completions.create(model="nope", messages=[])


def test_body_over_the_limit_is_413() -> None:
    with (
        sim(model="m") as (_, base),
        server("--endpoint", f"s0={base}=m", config='[router]\nmax_body_bytes = "1KiB"\n') as srv,
    ):
        r = chat(srv, "x" * 2000)
        assert r.status_code == 413
        assert "exceeds the limit of 1024 bytes" in r.json()["error"]["message"]
        assert chat(srv, "small").status_code == 200


def test_alias_and_fallback() -> None:
    config = (
        FAST
        + """
[[models]]
name = "m"
aliases = ["mm"]
fallbacks = ["backup"]

[[models]]
name = "backup"
"""
    )
    with (
        sim(model="m") as (p_main, main),
        sim(model="backup") as (_, backup),
        server(
            "--endpoint", f"main={main}=m", "--endpoint", f"bk={backup}=backup", config=config
        ) as srv,
    ):
        srv.wait_scraped()
        r = httpx.post(
            f"{srv.base}/v1/chat/completions",
            json={"model": "mm", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
            timeout=30,
        )
        assert r.status_code == 200
        assert r.headers["x-llmgw-model"] == "m" and r.json()["model"] == "m"
        assert sorted(m.id for m in client(srv).models.list()) == ["backup", "m", "mm"]

        p_main.kill()
        p_main.popen.wait()
        r = chat(srv, "x")
        assert r.status_code == 200
        assert r.headers["x-llmgw-model"] == "backup" and r.json()["model"] == "backup"
        assert srv.metric("llmgw_fallbacks_total", model="m", fallback="backup") >= 1


def test_a_killed_engine_is_routed_around() -> None:
    with fleet(2) as (srv, bases):
        stopped = False
        with contextlib.ExitStack():
            # Find and kill the process behind s0 by making it exit on its next request.
            set_faults(bases[0], exit_after=1)
            for _ in range(12):
                r = chat(srv)
                assert r.status_code == 200, r.text
                stopped = True
        assert stopped
        assert srv.metric("llmgw_requests_total", endpoint="s1", status="200") >= 10


def test_errors_before_the_first_byte_are_retried_and_open_the_breaker() -> None:
    with contextlib.ExitStack() as stack:
        bases = [stack.enter_context(sim(model="m"))[1] for _ in range(2)]
        # s0 first (priority 0), s1 the fallback tier: every request tries s0 while its
        # breaker lets it, whatever the scores (an equal pair was chosen between at
        # random, or by scrape age under load, and s0 could miss its second failure).
        endpoints = "".join(
            f'[[endpoints]]\nid = "s{i}"\nurl = "{b}"\nmodels = ["m"]\npriority = {i}\n'
            for i, b in enumerate(bases)
        )
        config = FAST + 'failure_threshold = 2\ncooldown = "1s"\n' + endpoints
        srv = stack.enter_context(server(config=config))
        srv.wait_scraped()
        set_faults(bases[0], error_rate=1.0, error_status=500)
        seen = Counter(chat(srv).headers.get("x-llmgw-endpoint") for _ in range(10))
        assert seen == {"s1": 10}
        assert srv.metric("llmgw_retries_total", model="m") >= 1
        # It opened; by now it may be half-open already (ten requests can outlast the 1 s
        # cooldown), never closed: every probe so far failed.
        assert srv.metric("llmgw_breaker_transitions_total", endpoint="s0", state="open") >= 1
        assert srv.endpoints()["s0"]["breaker"] in ("open", "half_open")

        # Healthy again: after the cooldown one probe closes the breaker.
        set_faults(bases[0], error_rate=0.0)
        wait_for(lambda: srv.endpoints()["s0"]["breaker"] == "half_open", "the cooldown over", 5)
        for _ in range(10):
            assert chat(srv).status_code == 200
        assert srv.endpoints()["s0"]["breaker"] == "closed"
        assert srv.metric("llmgw_breaker_transitions_total", endpoint="s0", state="closed") >= 1


def test_open_breakers_everywhere_give_503_with_retry_after() -> None:
    config = FAST + 'failure_threshold = 1\ncooldown = "30s"\nretries = 0\n'
    with fleet(1, config=config) as (srv, bases):
        set_faults(bases[0], error_rate=1.0, error_status=503)
        first = chat(srv)
        assert first.status_code == 502
        assert first.json()["error"]["code"] == "upstream_error"
        second = chat(srv)
        assert second.status_code == 503
        assert second.json()["error"]["code"] == "no_healthy_replica"
        assert int(second.headers["retry-after"]) >= 1


def test_a_stream_broken_after_the_first_byte_ends_with_an_error_event() -> None:
    with fleet(2, "--fault-abort-after-chunks", "3") as (srv, bases):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 20,
            "stream": True,
        }
        with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[-1][6:])["error"]["code"] == "upstream_error"
        assert "data: [DONE]" not in events
        # No retry once bytes reached the client: one engine saw one request.
        assert srv.metric("llmgw_retries_total") == 0
        prompts = [sim_metric(b, "vllm:prompt_tokens_total") or 0.0 for b in bases]
        assert sorted(p > 0 for p in prompts) == [False, True]
        assert srv.metric("llmgw_upstream_errors_total", kind="broken_stream") == 1
        with pytest.raises(openai.APIError):
            list(
                client(srv).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], stream=True
                )
            )


def test_slow_first_token_moves_to_the_next_replica() -> None:
    config = FAST + '[router.timeouts]\nfirst_token = "500ms"\n'
    with fleet(2, config=config) as (srv, bases):
        set_faults(bases[0], first_token_delay=5.0)
        # Replicas that tie are picked at random: ask until s0 was tried (six picks
        # all of s1 happen once in 64 runs; forty, once in 10^12), at least six times.
        for sent in range(40):
            if sent >= 6 and srv.metric("llmgw_timeouts_total", endpoint="s0", phase="first_token"):
                break
            t0 = time.monotonic()
            with httpx.stream(
                "POST",
                f"{srv.base}/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 2,
                    "stream": True,
                },
                timeout=30,
            ) as r:
                assert r.headers["x-llmgw-endpoint"] == "s1"
                r.read()
            assert time.monotonic() - t0 < 4
        assert srv.metric("llmgw_timeouts_total", endpoint="s0", phase="first_token") >= 1


def test_sessions_stick_to_one_replica(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    for session in ("alice", "bob", "carol"):
        seen = {
            httpx.post(
                f"{srv.base}/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": f"turn {i}"}],
                    "max_tokens": 2,
                },
                headers={"x-session-id": session},
                timeout=30,
            ).headers["x-llmgw-endpoint"]
            for i in range(8)
        }
        assert len(seen) == 1, (session, seen)
    assert srv.metric("llmgw_routing_decisions_total", tier="session") >= 3 * 7


ACME = "You are a careful assistant for the tenant ACME. " * 60


def ask_tenant(srv: Server, i: int, system: str = ACME) -> httpx.Response:
    """Question `i` under a tenant's long system prompt (many prefix blocks)."""
    return ask_at(srv.base, i, system)


def ask_at(base: str, i: int, system: str = ACME) -> httpx.Response:
    """`ask_tenant` at `base`: a router, or an engine directly."""
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i}"},
            ],
            "max_tokens": 2,
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def test_shared_prefix_lands_on_one_replica(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    seen = Counter()
    for i in range(10):
        seen[ask_tenant(srv, i).headers["x-llmgw-endpoint"]] += 1
    assert len(seen) == 1, seen
    assert srv.metric("llmgw_routing_decisions_total", tier="prefix") >= 9


def test_a_prompt_sent_away_from_its_home_is_counted_with_the_reason() -> None:
    """The prefix's home answers 429: the retry serves it elsewhere, and the next
    request, which the prefix table still sends home, is passed over to a replica
    that holds none of it, counted as a spill for that reason."""
    with fleet(2) as (srv, bases):
        home = ask_tenant(srv, 0).headers["x-llmgw-endpoint"]
        assert ask_tenant(srv, 1).headers["x-llmgw-endpoint"] == home
        assert srv.metric("llmgw_affinity_spills_total", affinity="prefix") == 0
        set_faults(bases[int(home[1:])], error_rate=1.0, error_status=429)
        for i in (2, 3):
            assert ask_tenant(srv, i).headers["x-llmgw-endpoint"] != home
        spills = srv.metric(
            "llmgw_affinity_spills_total", model="m", affinity="prefix", reason="throttled"
        )
        assert spills >= 1


def test_client_disconnect_frees_the_engine_slot() -> None:
    with fleet(1) as (srv, bases):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 5000,
            "stream": True,
        }
        with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            assert sim_metric(bases[0], "vllm:num_requests_running") == 1
        # The router counts the disconnect once it is done with the request (the
        # upstream call cut, the request accounted); the engine frees its slot when it
        # sees the cut, in its own time. (The default bound: 5 s was too short once, in
        # a run beside a second copy of the suite on the same 2 cores.)
        wait_for(
            lambda: srv.metric("llmgw_client_disconnects_total", model="m") == 1,
            "the disconnect counted",
        )
        wait_for(
            lambda: sim_metric(bases[0], "vllm:num_requests_running") == 0,
            "the engine's slot freed",
        )
        assert srv.endpoints()["s0"]["inflight"] == 0
        # The cut stream was still accounted, as an estimate.
        assert srv.metric("llmgw_estimated_usage_requests_total", model="m") == 1


def test_admin_endpoints_view_and_metrics(pair: tuple[Server, list[str]]) -> None:
    srv, _ = pair
    views = srv.endpoints()
    assert set(views) == {"s0", "s1"}
    for view in views.values():
        assert view["engine"] == "vllm"
        assert view["breaker"] in ("closed", "open", "half_open")
        assert set(view["scores"]) == {"chat", "batch", "cache_aware"}
        assert view["stale"] is False
    text = httpx.get(f"{srv.admin}/metrics", timeout=5).text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert len({f for f in families if f.startswith("llmgw_")}) >= 20
    # The serving process itself: prometheus-client's process, platform and GC
    # collectors, and what runs.
    assert {
        "process_resident_memory_bytes",
        "python_info",
        "python_gc_collections_total",
    } <= families
    assert srv.metric("llmgw_build_info", version=llmgw.__version__) == 1
    assert httpx.get(f"{srv.admin}/readyz", timeout=5).status_code == 200


def test_sigterm_drains_streams_in_flight_then_exits_0() -> None:
    with fleet(1) as (srv, _):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "drain me"}],
            "max_tokens": 60,
            "stream": True,
        }
        with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            srv.proc.kill(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert srv.proc.popen.wait(timeout=20) == 0
        # Draining means no new work: the listener is closed.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{srv.base}/v1/models", timeout=2)


def test_clients_see_endpoints_without_the_leaders_fencing_token() -> None:
    """A replica's id carries its leader's fencing token in its epoch (token << 41):
    x-llmgw-endpoint and error messages name it without (`m-r3`, the third placement),
    while the admin API and /metrics keep the whole id, and show the name beside it."""
    from llmgw.control.leadership import epoch_floor

    live, dead = f"m-r{epoch_floor(2) + 3}", f"d-r{epoch_floor(7) + 12}"
    # Port 9 (discard) on loopback: nothing listens there, so `dead` refuses.
    flags = ("--endpoint", f"{dead}=http://127.0.0.1:9=d")
    with (
        sim(model="m") as (_, base),
        server("--endpoint", f"{live}={base}=m", *flags, config=FAST + "retries = 0\n") as srv,
    ):
        wait_for(lambda: srv.endpoints()[live]["engine"] == "vllm", "the live replica scraped", 10)
        r = chat(srv)
        assert r.status_code == 200 and r.headers["x-llmgw-endpoint"] == "m-r3", r.headers
        body = {"model": "d", "messages": [{"role": "user", "content": "hi"}]}
        failed = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=30)
        assert failed.status_code == 502, failed.text
        message = failed.json()["error"]["message"]
        assert "endpoint 'd-r12'" in message and str(epoch_floor(7)) not in message, message
        views = srv.endpoints()
        assert views[live]["name"] == "m-r3" and views[dead]["name"] == "d-r12"
        assert srv.metric("llmgw_requests_total", model="m", endpoint=live) >= 1

    from llmgw.domain.endpoints import EPOCH_TOKEN_SHIFT, public_name

    assert epoch_floor(2) == 2 << EPOCH_TOKEN_SHIFT  # the control plane's layout
    assert public_name("m-r1796601234567") == "m-r1796601234567"  # no leader: as is
    assert public_name("s0") == "s0" and public_name("x-r") == "x-r"


def test_the_prefix_tables_predictions_are_weighed_against_the_engines_answers() -> None:
    """The engine's cached_tokens against the router's prediction: a prompt sent again
    is a predicted hit the engine confirms; after the engine's cache is reset (as a
    restart would), the table still says held and the engine's answer shows it was
    wrong, counted as `over`."""
    with fleet(1) as (srv, bases):

        def ask(i: int) -> None:
            ask_tenant(srv, i)

        def counted(outcome: str) -> float:
            return srv.metric("llmgw_prefix_predictions_total", model="m", outcome=outcome)

        ask(0)  # the first: nothing predicted, nothing cached
        assert counted("miss") == 1
        for i in range(1, 4):
            ask(i)
        assert counted("hit") == 3
        assert counted("over") == 0
        httpx.post(f"{bases[0]}/reset_prefix_cache", timeout=10).raise_for_status()
        ask(4)
        assert counted("over") == 1
        ask(5)  # computed again by the engine just now: held, as predicted
        assert counted("hit") == 4
