"""A real engine through the whole control plane: `llmgw-server` in control-plane mode,
two `llmgw-agent` processes (one with a pretended GPU, one a CPU node) and two
`llama-server` replicas of the tiny generated GGUF model (llmgw.testing.gguf), served
to the official `openai` client.

These tests need the llama-server binary (scripts/llama_server.sh builds it; CI runs
that before the tests) and fail, not skip, without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.adapters.llamacpp import BUILD_HINT, LLAMA_CPP_BUILD, find_llama_server
from llmgw.router.scraper import capacity_in
from llmgw.testing.gguf import write_tiny_gguf
from tests.procs import (
    BIN,
    AgentProc,
    FleetServer,
    agent,
    engine_port_range,
    fleet_server,
    running,
    wait_for,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

# Deterministic generation of exactly max_tokens tokens (the tiny model's text is noise).
EXACT = {"seed": 7, "ignore_eos": True}


def require_llama_server() -> str:
    found = find_llama_server()
    if found is None:
        pytest.fail(
            "llama-server not found ($LLAMA_SERVER_BIN, the build cache, PATH): "
            f"{BUILD_HINT}; CI's .ci/run does this before `make test`",
            pytrace=False,
        )
    return found


def config(*models: tuple[str, Path, int]) -> str:
    """A control-plane config serving each (name, weights, replicas) on llama.cpp."""
    low, high = engine_port_range()
    head = f"""
[router]
scrape_interval = "300ms"
scrape_timeout = "300ms"

[control]
interval = "200ms"
base_backoff = "1s"
max_backoff = "4s"
unreachable_after = "3s"
lost_after = "8s"
port_range = [{low}, {high}]
"""
    return head + "".join(
        f"""
[[models]]
name = "{name}"
replicas = {replicas}

[[models.profiles]]
name = "cpu"
engine = "llamacpp"
weights = {json.dumps(str(weights))}
args = ["-np", "2", "-c", "8192", "-t", "1"]
"""
        for name, weights, replicas in models
    )


def client(srv: FleetServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30)


def procs(*agents: AgentProc) -> list[Any]:
    return [a.proc for a in agents]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetServer, AgentProc, AgentProc]]:
    require_llama_server()
    weights = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config(("tiny", weights, 2))))
        gpu = stack.enter_context(agent(srv.agent_address, "g1", address="127.0.0.81"))
        cpu = stack.enter_context(agent(srv.agent_address, "c1", address="127.0.0.82", gpus=None))
        srv.wait(
            lambda: srv.ready_replicas("tiny", 2),
            "two ready llama.cpp replicas",
            timeout=60,
            logs=procs(gpu, cpu),
        )
        yield srv, gpu, cpu


def test_two_replicas_are_placed_one_per_node_and_scraped_as_llamacpp(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    srv, gpu, cpu = fleet
    nodes = srv.nodes()
    for node in nodes.values():
        engines = {e["name"]: e["version"] for e in node["engines"]}
        assert engines.get("llamacpp") == f"b{LLAMA_CPP_BUILD}", node
    assert nodes["g1"]["gpus_total"] == 1 and nodes["g1"]["gpus_allocated"] == 1
    assert nodes["c1"]["gpus_total"] == 0
    replicas = srv.ready_replicas("tiny", 2)
    assert {r["nodes"][0]["node_id"] for r in replicas} == {"g1", "c1"}
    for a in (gpu, cpu):
        ((name, _pid),) = a.engines().items()
        log = next(p for p in a.engine_logs() if p.stem.startswith(name))
        assert "llama" in log.read_text(errors="replace")
    # The router reads llama.cpp's own metrics page for both.
    srv.wait_scraped(timeout=10)
    ids = {r["id"] for r in replicas}
    endpoints = srv.endpoints()
    assert ids <= set(endpoints)
    assert {endpoints[i]["engine"] for i in ids} == {"llamacpp"}, endpoints
    # llama.cpp exports no KV-cache gauge, so KV usage is unknown: null in the admin
    # view and no gauge sample, never a 0 that would read as an empty cache.
    gauges = endpoint_gauges(srv)
    for i in ids:
        page = httpx.get(f"{endpoints[i]['url']}/metrics", timeout=5).text
        assert "llamacpp:requests_deferred" in page and "kv_cache" not in page, page
        assert endpoints[i]["kv_usage"] is None, endpoints[i]
        assert endpoints[i]["waiting"] is not None and endpoints[i]["running"] is not None
        assert i in gauges["llmgw_endpoint_waiting_requests"], gauges
        # Its capacity is the -np its agent launched it with (reported over gRPC), and
        # the real engine's /props says the same, as the scraper reads it for static
        # llama.cpp endpoints.
        assert endpoints[i]["capacity"] == 2, endpoints[i]
        props = httpx.get(f"{endpoints[i]['url']}/props", timeout=5)
        assert capacity_in(props.content, "total_slots") == 2, props.text[:500]
        assert i not in gauges.get("llmgw_endpoint_kv_cache_usage_ratio", {}), gauges


def endpoint_gauges(srv: FleetServer) -> dict[str, dict[str, float]]:
    """The router's per-endpoint gauges: name -> {endpoint: value}, only samples present
    (srv.metric would sum an absent one to 0)."""
    text = httpx.get(f"{srv.admin}/metrics", timeout=5).text
    gauges: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("llmgw_endpoint_"):
                gauges.setdefault(sample.name, {})[sample.labels["endpoint"]] = sample.value
    return gauges


def test_chat_and_completions_through_the_openai_client(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    srv, _, _ = fleet
    c = client(srv)
    assert "tiny" in [m.id for m in c.models.list()]

    chat = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        extra_body=EXACT,
    )
    assert chat.model == "tiny" and chat.choices[0].finish_reason == "length"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.usage.prompt_tokens > 5  # the ChatML template wrapped the message

    stream = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=EXACT,
    )
    usage, finish, chunks = None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
    assert finish == "length" and chunks >= 2
    assert usage is not None and usage.completion_tokens == 8

    done = c.completions.create(model="tiny", prompt="hello", max_tokens=4, extra_body=EXACT)
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 4


def test_usage_is_injected_counted_and_stripped_against_the_real_engine(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    srv, _, _ = fleet
    before = srv.metric("llmgw_completion_tokens_total", model="tiny")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "count me"}],
        "max_tokens": 7,
        "stream": True,
        **EXACT,
    }
    with httpx.stream("POST", f"{srv.base}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    assert events[-1] == "data: [DONE]"
    # The client did not ask for usage: the usage chunk llmgw asked for never reaches it...
    assert payloads and all(not p.get("usage") for p in payloads), payloads[-2:]
    # ...but was counted, from the engine's own numbers (no estimate).
    assert srv.metric("llmgw_completion_tokens_total", model="tiny") - before == 7
    assert srv.metric("llmgw_estimated_usage_requests_total") == 0


def test_a_corrupt_gguf_fails_at_start_and_a_missing_one_without_launching(
    tmp_path: Path,
) -> None:
    """One agent, two broken models: a corrupt GGUF reaches llama-server, which fails
    with its own error; a missing one is refused by the agent before any launch."""
    require_llama_server()
    broken = tmp_path / "broken.gguf"
    good = write_tiny_gguf(tmp_path / "good.gguf").read_bytes()
    broken.write_bytes(good[:4096])  # a valid header, then the file ends mid-metadata
    missing = tmp_path / "missing.gguf"
    with (
        fleet_server(config(("broken", broken, 1), ("missing", missing, 1))) as srv,
        agent(srv.agent_address, "c9", address="127.0.0.89", gpus=None) as a,
    ):

        def failed(model: str) -> list[dict[str, Any]]:
            return [
                s
                for s in srv.nodes().get("c9", {}).get("shards", [])
                if s["state"] == "failed" and s["model"] == model
            ]

        (crash, *_) = srv.wait(
            lambda: failed("broken"), "a failed llama.cpp shard", timeout=30, logs=[a.proc]
        )
        assert crash["exit_code"] not in (None, 0), crash
        assert "before it was ready" in crash["message"], crash
        tail = "\n".join(crash["output_tail"])
        assert "error loading model" in tail and "failed to load model" in tail, tail
        assert "gguf" in tail.lower(), tail
        assert srv.ready_replicas("broken") == []

        (refused, *_) = srv.wait(
            lambda: failed("missing"), "a refused llama.cpp shard", timeout=30, logs=[a.proc]
        )
        assert refused["message"] == (
            f"not started: weights {str(missing)!r}: no such file on this node"
        ), refused
        assert refused["exit_code"] is None and refused["output_tail"] == [], refused
        assert srv.ready_replicas("missing") == []
        # Never launched, in any attempt: no engine log or pid record for it (the
        # corrupt model's launches left theirs, so a launch would show).
        logs = [p.stem for p in a.engine_logs()]
        assert any(name.startswith("broken-r") for name in logs), logs
        for name in logs + list(a.engines()):
            assert not name.startswith("missing-r"), name


def chat_body(content: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        **EXACT,
    }


def engine_of(agents: tuple[AgentProc, ...], replica: str) -> tuple[AgentProc, int]:
    """The agent running `replica` and its llama-server's pid (from its pid records)."""
    for a in agents:
        for name, pid in a.engines().items():
            if name.startswith(f"{replica}-r"):
                return a, pid
    raise AssertionError(f"no engine recorded for {replica}: {[a.engines() for a in agents]}")


def test_killing_the_engine_mid_stream_sends_an_error_event_and_the_next_request_is_retried(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    srv, gpu, cpu = fleet
    ids = {
        r["id"]
        for r in srv.wait(lambda: srv.ready_replicas("tiny", 2), "two ready replicas", timeout=60)
    }
    srv.wait_scraped(timeout=10)
    url = f"{srv.base}/v1/chat/completions"
    # One session for both requests: the second one's first choice is then the replica
    # the first was on, the one killed, so its retry is not left to chance.
    session = {"x-session-id": "killed-mid-stream"}
    # 4,000 tokens take the tiny model about 9 s here (1,000 took 0.8 s, and under load
    # a stream that short could end before the kill): the kill lands mid-stream.
    body = chat_body("a long answer please", 4000, stream=True)
    paused: int | None = None
    try:
        with httpx.stream("POST", url, json=body, headers=session, timeout=30) as r:
            assert r.status_code == 200
            killed = r.headers["x-llmgw-endpoint"]
            owner, pid = engine_of((gpu, cpu), killed)
            errors_before = srv.metric("llmgw_upstream_errors_total", endpoint=killed)
            retries_before = srv.metric("llmgw_retries_total", model="tiny")
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "error" not in json.loads(first[6:]), first
            # Its agent is paused first: it would report the death at once, and the
            # control plane would withdraw the replica before the next request came.
            paused = owner.proc.pid
            os.kill(paused, signal.SIGSTOP)
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        errors = [json.loads(e[6:]) for e in rest if e != "data: [DONE]" and '"error"' in e]
        assert errors and errors[-1]["error"]["message"], rest[-3:]
        # ...and it did not pretend to finish.
        assert '"finish_reason":"length"' not in "".join(rest).replace(" ", ""), rest[-3:]

        # Still published: the next request tries the dead replica, fails to connect,
        # and is served by the other one.
        after = httpx.post(url, json=chat_body("after the crash", 3), headers=session, timeout=30)
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
    assert after.status_code == 200, after.text
    assert after.headers["x-llmgw-endpoint"] == (ids - {killed}).pop(), (killed, ids)
    assert srv.metric("llmgw_retries_total", model="tiny") - retries_before == 1
    # Two failures on the killed replica: the broken stream, then the refused attempt.
    assert srv.metric("llmgw_upstream_errors_total", endpoint=killed) - errors_before == 2

    # Once the agent reports the death, requests go to the live replica without a retry.
    srv.wait(lambda: killed not in srv.endpoints(), "the dead replica withdrawn", timeout=10)
    retries_before = srv.metric("llmgw_retries_total", model="tiny")
    for i in range(3):
        ok = httpx.post(url, json=chat_body(f"later {i}", 3), headers=session, timeout=30)
        assert ok.status_code == 200, ok.text
    assert srv.metric("llmgw_retries_total", model="tiny") == retries_before

    # The control plane restarts it (later tests in this module want both replicas).
    srv.wait(
        lambda: srv.ready_replicas("tiny", 2),
        "the replica back",
        timeout=60,
        logs=[gpu.proc, cpu.proc],
    )


def test_a_replica_busy_with_direct_requests_is_scraped_as_waiting_and_avoided(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    """Load replica A straight (bypassing the router): with 2 slots, 6 clients keep
    requests deferred there; the scraper reads llamacpp:requests_deferred as `waiting`
    and the router sends its own requests to B."""
    srv, gpu, cpu = fleet
    (a_id, b_id) = sorted(
        r["id"]
        for r in srv.wait(lambda: srv.ready_replicas("tiny", 2), "two ready replicas", timeout=60)
    )
    srv.wait_scraped(timeout=10)
    a_url = srv.endpoints()[a_id]["url"]
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=30) as h:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    h.post(f"{a_url}/v1/chat/completions", json=chat_body("busy", 1000))

    workers = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    for w in workers:
        w.start()
    try:
        busy = srv.wait(
            lambda: (e := srv.endpoints()[a_id])["waiting"] and e,
            "replica A scraped with waiting requests",
            timeout=15,
            logs=[gpu.proc, cpu.proc],
        )
        assert busy["running"] and busy["running"] >= 1, busy
        assert srv.endpoints()[b_id]["waiting"] == 0
        chosen = []
        for i in range(10):
            r = httpx.post(
                f"{srv.base}/v1/chat/completions", json=chat_body(f"route {i}", 2), timeout=30
            )
            assert r.status_code == 200, r.text
            chosen.append(r.headers["x-llmgw-endpoint"])
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert chosen.count(b_id) >= 8, (chosen, a_id, b_id)


def test_the_llamacpp_demo_serves_a_chat_from_a_cpu_node() -> None:
    require_llama_server()
    low, high = engine_port_range()
    with running(
        "llmgw-server",
        "--demo",
        "--engine",
        "llamacpp",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--agent-listen",
        "127.0.0.1:0",
        env={"LLMGW_CONTROL__PORT_RANGE": f"[{low}, {high}]"},
        ready=True,
    ) as proc:
        c = openai.OpenAI(base_url=f"{proc.url('listen')}/v1", api_key="x", max_retries=0)

        def answer() -> Any:
            with contextlib.suppress(openai.APIError):
                return c.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    extra_body=EXACT,
                )
            return None

        reply = wait_for(answer, "a chat from the llama.cpp demo", 60, context=proc.output)
        assert reply.model == "demo-chat" and reply.usage.completion_tokens == 4
        (node,) = httpx.get(f"{proc.url('admin_listen')}/api/v1/nodes", timeout=5).json()["nodes"]
        assert node["gpus_total"] == 0, node
        assert {e["name"]: e["version"] for e in node["engines"]}["llamacpp"] == (
            f"b{LLAMA_CPP_BUILD}"
        )
        assert proc.stop() == 0


def test_the_llamacpp_demo_without_the_binary_says_how_to_build_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "llmgw-server"), "--demo", "--engine", "llamacpp"],
        env={**os.environ, "LLAMA_SERVER_BIN": str(tmp_path / "missing")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1, result
    (line,) = result.stderr.strip().splitlines()
    assert "scripts/llama_server.sh" in line, line


def test_engine_paths_and_messages_against_the_real_engine(
    fleet: tuple[FleetServer, AgentProc, AgentProc],
) -> None:
    """What llama-server serves beside chat (issue #19), through llmgw: tokenize and
    detokenize as llama.cpp shapes them, a path it does not serve refused by llmgw
    before any replica, and the Anthropic Messages API, which it serves itself (the
    client's request passed through, whole, streamed and counted)."""
    import anthropic

    srv, _, _ = fleet
    with httpx.Client(base_url=srv.base, timeout=30) as http:
        tokens = http.post("/tokenize", json={"model": "tiny", "content": "hello world"})
        assert tokens.status_code == 200, tokens.text
        ids = tokens.json()["tokens"]
        assert ids and all(isinstance(t, int) for t in ids)
        text = http.post("/detokenize", json={"model": "tiny", "tokens": ids})
        assert text.status_code == 200, text.text
        assert "hello" in text.json()["content"]
        score = http.post("/v1/score", json={"model": "tiny", "text_1": "a", "text_2": "b"})
        assert score.status_code == 404
        assert score.json()["error"]["code"] == "unsupported_endpoint"
    messages = anthropic.Anthropic(base_url=srv.base, api_key="unused", max_retries=0)
    reply = messages.messages.create(
        model="tiny",
        max_tokens=4,
        messages=[{"role": "user", "content": "hello"}],
        extra_body={"top_k": 1},
    )
    assert reply.stop_reason in ("max_tokens", "end_turn") and reply.usage.output_tokens <= 4
    assert reply.usage.input_tokens > 0
    # llama-server counts them itself (its /v1/messages/count_tokens, passed through).
    counted = messages.messages.count_tokens(
        model="tiny", messages=[{"role": "user", "content": "hello"}]
    )
    # Anthropic's input_tokens leaves out what the prompt cache read (another test here
    # sent the same prompt first).
    assert counted.input_tokens == reply.usage.input_tokens + (
        reply.usage.cache_read_input_tokens or 0
    )
    # Streams go translated (paths.MESSAGES_NATIVE_STREAM): llama-server's own leave out
    # message_start when the first token ends inside a multi-byte character, which the
    # tiny model's random bytes often do (about a third of seeds, here):
    engine = srv.endpoints()[srv.ready_replicas("tiny", 2)[0]["id"]]["url"]
    ask = [{"role": "user", "content": "hello"}]
    broken = 0
    for seed in range(16):
        with httpx.stream(
            "POST",
            f"{engine}/v1/messages",
            json={"model": "tiny", "stream": True, "messages": ask, "max_tokens": 3, "seed": seed},
            timeout=30,
        ) as raw:
            events = [line for line in raw.iter_lines() if line.startswith("event:")]
        broken += bool(events) and events[0] != "event: message_start"
    assert broken, "llama-server now starts every stream with message_start: stream natively"
    # Through llmgw, at the engine's default temperature (Anthropic's API takes no seed),
    # every stream is whole: a dozen at that rate meet the engine's fault all but surely.
    for _ in range(12):
        with messages.messages.stream(model="tiny", messages=ask, max_tokens=3) as stream:
            final = stream.get_final_message()
        assert final.usage.output_tokens <= 3 and final.usage.input_tokens > 0
