"""`llmgw-server --demo`, the README's main job, as a real process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from .procs import engine_port_range, running, wait_for


def test_demo_serves_a_fleet_and_stops_its_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    base, last = engine_port_range(51)
    with running(
        "llmgw-server",
        "--demo",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--agent-listen",
        "127.0.0.1:0",
        env={"LLMGW_CONTROL__PORT_RANGE": f"[{base}, {last}]"},
        ready=True,
    ) as proc:
        port, admin = (int(proc.ready[k][0].rsplit(":", 1)[1]) for k in ("listen", "admin_listen"))

        def served() -> set[str]:
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
            ids = {m["id"] for m in models}
            return ids if {"demo-chat", "demo-small"} <= ids else set()

        ids = wait_for(served, "both demo models served", 30, context=proc.output)
        assert {"demo-chat", "chat", "demo-small", "small"} <= ids, proc.output()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.model == "demo-chat" and reply.usage and reply.usage.completion_tokens == 4
        nodes = httpx.get(f"http://127.0.0.1:{admin}/api/v1/nodes").json()["nodes"]
        assert [n["id"] for n in nodes] == ["demo-node"] and len(nodes[0]["gpus"]) == 4
        # The dashboard it announces shows the node.
        assert f"dashboard: http://127.0.0.1:{admin}/" in proc.output()
        fleet = httpx.get(f"http://127.0.0.1:{admin}/fleet")
        assert fleet.status_code == 200 and 'data-node="demo-node"' in fleet.text
        # A store of its own, gone with it: keys work, and the working directory (the
        # default store's place) stays clean.
        key = httpx.post(f"http://127.0.0.1:{admin}/api/v1/keys", json={"name": "demo"})
        assert key.status_code == 201, key.text
        assert proc.stop() == 0
    assert list(tmp_path.iterdir()) == []
    # The demo's engines went with it.
    sims = subprocess.run(["pgrep", "-af", "llmgw_cli.sim"], capture_output=True, text=True)
    ours = [
        line
        for line in sims.stdout.splitlines()
        if any(f"--port {p} " in line + " " for p in range(base, base + 51))
    ]
    assert ours == []


def test_the_demo_binds_loopback_unless_told_otherwise() -> None:
    """Its client port has no keys: not on every interface by default (issue #33)."""
    from llmgw_cli.server import build_parser, load_config

    plain = load_config(build_parser().parse_args(["--demo"]), demo=True)
    assert plain.listen == "127.0.0.1:8080"
    chosen = build_parser().parse_args(["--demo", "--listen", "0.0.0.0:8080"])
    assert load_config(chosen, demo=True).listen == "0.0.0.0:8080"
    # Not the demo: the configured default stays.
    assert load_config(build_parser().parse_args([])).listen == ":8080"
