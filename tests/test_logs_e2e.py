"""Logs through real processes (issue #21): llmgw-server in front of a real llmgw-sim,
driven by the official openai client, with its standard error parsed. In JSON, every
line is one object; the access log has a line per request (the client's x-request-id,
or the one llmgw made and echoed) whose fields match what the client got; a refusal's
reason is logged at DEBUG; --log-level and ``[log] access`` decide what is written.
Under a real agent, an engine killed or failing to start is logged by the server with
the end of its output, as the agent reported it; a node gone silent, as a sentence."""

from __future__ import annotations

import json
import os
import signal
from contextlib import ExitStack
from typing import Any

import openai
import pytest

from llmgw.testing.procs import Proc
from tests.procs import agent, fleet_server, server, sim
from tests.test_fleet_e2e import control_config, model
from tests.waiting import wait_for

CONFIG = """
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"

[store]
url = ""
"""

HELLO = [{"role": "user", "content": "hello there"}]


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=30)


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    """Every line the program wrote, each parsed as the one JSON object it must be."""
    lines = []
    # The last piece is "" or a line still being written: not one yet.
    for line in proc.log.read_text(errors="replace").split("\n")[:-1]:
        parsed = json.loads(line)  # a line that is not JSON fails the test here
        assert isinstance(parsed, dict), line
        assert {"ts", "level", "logger", "message"} <= parsed.keys(), line
        lines.append(parsed)
    return lines


def access_lines(proc: Proc) -> dict[str, dict[str, Any]]:
    """The access log's lines so far, by request id (each id once)."""
    found: dict[str, dict[str, Any]] = {}
    for line in json_lines(proc):
        if line["logger"] == "llmgw.access":
            assert line["request_id"] not in found, line
            found[line["request_id"]] = line
    return found


def test_the_json_access_log_has_a_line_per_request_matching_what_the_client_got() -> None:
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s1={engine}=m", "--log-format", "json", config=CONFIG) as srv,
    ):
        srv.wait_scraped()
        c = client(srv.base)
        # The client's own id, kept.
        raw = c.chat.completions.with_raw_response.create(
            model="m",
            messages=HELLO,
            max_tokens=5,
            extra_headers={"x-request-id": "client-chosen.id-1"},
        )
        assert raw.headers["x-request-id"] == "client-chosen.id-1"
        unary = raw.parse()
        # Streamed: the id llmgw made, as echoed.
        raw_stream = c.chat.completions.with_raw_response.create(
            model="m",
            messages=HELLO,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed_id = raw_stream.headers["x-request-id"]
        chunks = list(raw_stream.parse())
        stream_usage = chunks[-1].usage
        assert stream_usage is not None and stream_usage.completion_tokens == 7
        # Refused before any engine: an unknown model.
        with pytest.raises(openai.NotFoundError) as refused:
            c.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=1)
        refused_id = refused.value.response.headers["x-request-id"]
        ids = {"client-chosen.id-1", streamed_id, refused_id}
        assert len(ids) == 3

        lines = wait_for(
            lambda: (found := access_lines(srv.proc)).keys() >= ids and found,
            "an access line for each of the three requests",
            timeout=10,
            context=lambda: srv.proc.output(4000),
        )
        assert set(lines) == ids  # one line per request, and none for anything else
        assert srv.proc.stop() == 0
        assert access_lines(srv.proc).keys() == ids  # nothing more at the end either

    one = lines["client-chosen.id-1"]
    assert unary.usage is not None
    assert one["level"] == "INFO"
    assert one["message"] == "/v1/chat/completions 200"
    assert (one["status"], one["model"], one["endpoint"], one["path"]) == (
        200,
        "m",
        "s1",
        "/v1/chat/completions",
    )
    assert one["prompt_tokens"] == unary.usage.prompt_tokens
    assert one["completion_tokens"] == unary.usage.completion_tokens == 5
    assert one["retries"] == 0 and one["error"] is None and one["key_id"] is None
    assert one["key_name"] is None
    # Who asked, and for what: the name sent, no fallback, the client's address.
    assert (one["asked"], one["fallback"]) == ("m", False)
    assert one["client"].startswith("127.0.0.1:"), one["client"]
    assert one["band"] is not None and one["queue_wait"] >= 0
    assert one["ttft"] is None  # an answer in one piece has no first token of its own
    assert one["duration"] > 0

    two = lines[streamed_id]
    assert (two["status"], two["model"], two["endpoint"]) == (200, "m", "s1")
    assert two["prompt_tokens"] == stream_usage.prompt_tokens
    assert two["completion_tokens"] == 7
    assert 0 < two["ttft"] <= two["duration"]

    three = lines[refused_id]
    assert (three["status"], three["error"], three["endpoint"], three["model"]) == (
        404,
        "model_not_found",
        None,
        None,  # a name the client made up is not written as a model
    )
    assert three["prompt_tokens"] == three["completion_tokens"] == 0


def _text_run(level: str, config: str = CONFIG) -> str:
    """A request served and one refused by a server at `level` (text format); all it
    logged, once it has exited."""
    with sim(model="m") as (_, engine):
        with server("--endpoint", f"s1={engine}=m", "--log-level", level, config=config) as srv:
            srv.wait_scraped()
            c = client(srv.base)
            c.chat.completions.create(model="m", messages=HELLO, max_tokens=2)
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(model="nope", messages=HELLO, max_tokens=1)
            assert srv.proc.stop() == 0
        return srv.proc.log.read_text(errors="replace")


def test_log_level_debug_shows_refusals_and_warning_hides_the_access_log() -> None:
    debug = _text_run("debug")
    assert "DEBUG llmgw.router: refused 404: the model 'nope' does not exist" in debug
    assert "error=model_not_found" in debug
    assert debug.count(" INFO llmgw.access: /v1/chat/completions 200 ") == 1
    assert debug.count(" INFO llmgw.access: /v1/chat/completions 404 ") == 1
    # --log-level debug is llmgw's: the HTTP libraries' byte-level debug stays out.
    assert "httpcore" not in debug

    warning = _text_run("warning")
    assert "received SIGTERM: draining" in warning  # it does log, at WARNING
    assert "llmgw.access" not in warning and " INFO " not in warning
    assert "refused" not in warning


def test_the_access_log_can_be_turned_off() -> None:
    out = _text_run("info", CONFIG + "\n[log]\naccess = false\n")
    assert "INFO llmgw.server: client API listening on" in out  # INFO is on
    assert "llmgw.access" not in out


def test_the_server_logs_failed_engines_with_their_output_and_a_silent_node_readably() -> None:
    config = control_config([model("m"), model("bad", args=["--no-such-flag"])])
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config, "--log-format", "json"))
        a = stack.enter_context(agent(srv.agent_address, "n1", address="127.0.0.61", gpus="2x80GB"))

        def failures() -> dict[str, dict[str, Any]]:
            return {
                line["replica_id"]: line
                for line in json_lines(srv.proc)
                if line["logger"] == "llmgw.control" and "exit_code" in line
            }

        (ready,) = srv.wait(lambda: srv.ready_replicas("m", 1), "m ready", logs=[a.proc])
        # A failed start: the engine rejects its flags.
        bad = srv.wait(
            lambda: [f for f in failures().values() if f["model"] == "bad"],
            "the failed start of bad logged",
            logs=[a.proc],
        )[0]
        assert bad["level"] == "WARNING" and bad["node_id"] == "n1"
        assert bad["exit_code"] == 2 and "before it was ready" in bad["message"], bad
        assert any("--no-such-flag" in line for line in bad["output_tail"]), bad

        # An engine killed while serving.
        (pid,) = [p for name, p in a.engines().items() if name.startswith(ready["id"] + "-")]
        os.kill(pid, signal.SIGKILL)
        killed = srv.wait(
            lambda: failures().get(ready["id"]), "the killed engine logged", logs=[a.proc]
        )
        assert killed["model"] == "m" and killed["exit_code"] == -signal.SIGKILL, killed
        assert "unexpectedly" in killed["message"], killed
        assert f"replica {ready['id']} of m (rank 0) on node n1 failed" in killed["message"]
        # The engine's own output: the simulator's banner, as it printed it.
        assert any("llmgw-sim" in line and "listening on" in line for line in killed["output_tail"])

        # The node falling silent is a sentence with fields, not an event's repr.
        a.proc.kill(signal.SIGKILL)
        silent = srv.wait(
            lambda: [
                line
                for line in json_lines(srv.proc)
                if line["logger"] == "llmgw.control" and "silent_for" in line
            ],
            "n1 logged unreachable",
        )[0]
        assert silent["message"].startswith("node n1 unreachable: silent for "), silent
        assert silent["node_id"] == "n1" and silent["silent_for"] >= 2, silent
        text = srv.proc.output()
        assert "ShardStatus(" not in text and "NodeBecameUnreachable(" not in text
