"""The shipped Grafana dashboard and Prometheus rules, proven against a real Prometheus.

A real llmgw-server in control-plane mode (SQLite store with keys) runs two real
agents: gpu-1 with four H100s as its `nvidia-smi` reports them (a script standing in
for the driver, so GPU memory and utilisation are reported), gpu-2 with an L4 that no
model may use, frozen with SIGSTOP so it goes unreachable. Its models run on
simulators: `m` (two replicas), `crashy` (its engine exits after two requests) and
`broken` (its agent refuses to start it). Debian's `prometheus` scrapes the admin
/metrics every second with deploy/prometheus/llmgw-rules.yml loaded, and a dead
target beside it, while the test drives traffic and failures: served, streamed and
slow requests, 401, 404 (unknown model), 429 (a key's rate limit), 502 (every engine
failing), 503 (no ready replica), queued bronze requests.

Then: `promtool check rules` and `promtool test rules` (the `for:` timings, in
tests/prometheus/llmgw-rules.test.yml) pass; every rule loads and evaluates in
Prometheus; each alert expression that the induced failures should make true returns
series (and the node-lost one, which they should not, returns none), and the alerts
are pending or firing; every PromQL expression of deploy/grafana/llmgw.json, with
Grafana's variables substituted, returns series.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from llmgw.testing.procs import Proc, reserve_port

from .procs import (
    FleetPorts,
    FleetServer,
    agent,
    engine_port_range,
    fleet_server,
    scratch_dir,
    set_faults,
)
from .test_keys_e2e import create_keys
from .waiting import wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "llmgw-rules.yml"
RULES_TEST = ROOT / "tests" / "prometheus" / "llmgw-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "llmgw.json"

# What Grafana puts in place of its variables: every server and model, 1m windows.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "5m",
    "$instance": ".*",
    "$model": ".*",
}

# Alerts the failures below make true, and the one they must not.
EXPECTED_ALERTS = {
    "LlmgwReplicasNotReady": {"model": "broken"},
    "LlmgwReplicaStartsFailing": {"model": "broken"},
    "LlmgwEngineExited": {"model": "crashy", "reason": "error"},
    "LlmgwNodeUnreachable": {"node": "gpu-2"},
    "LlmgwDown": {"job": "llmgw-gone"},
    "LlmgwHighServerErrorRate": {"model": "m"},
    "LlmgwHighRefusalRate": {"job": "llmgw"},
    "LlmgwTtftSloBurn": {"model": "m"},
}
QUIET_ALERTS = ("LlmgwNodeLost",)

# Four H100s with readings, in nvidia-smi's csv,noheader,nounits answer to the
# agent's query (the format of tests/data/nvidia-smi).
NVIDIA_SMI = "\n".join(
    f"{i}, GPU-00000000-0000-4000-8000-00000000000{i}, NVIDIA H100 80GB HBM3, 81559, "
    f"{1024 * (i + 1)}, 0, {10 * (i + 1)}"
    for i in range(4)
)
DEADLINE = 40.0  # for everything Prometheus has to see, together


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install Debian's prometheus package "
            "(apt-get install prometheus; scripts/test_deps.sh does it when run as root)"
        )
    return path


def sim_model(name: str, replicas: int, *args: str) -> str:
    return textwrap.dedent(f"""
        [[models]]
        name = "{name}"
        replicas = {replicas}

        [[models.profiles]]
        name = "sim"
        engine = "sim"
        weights = "sim"
        gpu_name = "H100"
        args = {json.dumps(list(args))}
        """)


def server_config(db: Path) -> str:
    low, high = engine_port_range()
    return (
        textwrap.dedent(f"""
        [store]
        url = "sqlite:///{db}"

        [router]
        scrape_interval = "200ms"
        scrape_timeout = "200ms"
        # The 502s below must not open breakers: later requests still need m.
        failure_threshold = 1000
        drain_timeout = "2s"

        [control]
        interval = "200ms"
        base_backoff = "300ms"
        max_backoff = "600ms"
        unreachable_after = "2s"
        lost_after = "10m"
        port_range = [{low}, {high}]
        mgmt_interface = "lo"
        """)
        # Two sequences per engine: four slow streams fill m, and bronze queues.
        + sim_model("m", 2, "--max-num-seqs", "2")
        + sim_model("crashy", 1, "--fault-exit-after", "2")
        # The agent refuses it at once (the port is the placement's): costs no process.
        + sim_model("broken", 1, "--port", "1")
    )


@contextlib.contextmanager
def prometheus(binary: str, targets: dict[str, str], port: int) -> Iterator[str]:
    """A Prometheus on `port` scraping `targets` (job -> host:port) every second, with
    the shipped rules; yields its base URL at once (it gets ready while the fleet comes
    up; the test waits for its targets)."""
    home = scratch_dir("prometheus-")
    scrape = [
        {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
        for job, target in targets.items()
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": scrape,
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    argv = [
        binary,
        f"--config.file={home / 'prometheus.yml'}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = Proc(argv, home / "output.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's series; an expression Prometheus refuses fails the test."""
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    assert body["data"]["resultType"] == "vector", (expr, body["data"]["resultType"])
    return list(body["data"]["result"])


def api(base: str, path: str) -> Any:
    r = httpx.get(f"{base}{path}", timeout=5)
    r.raise_for_status()
    return r.json()["data"]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(what, PromQL) of every target of every panel and of every variable's query
    (``label_values(SELECTOR, LABEL)`` as ``count by (LABEL) (SELECTOR)``), Grafana's
    variables substituted."""
    pattern = re.compile("|".join(re.escape(v) for v in sorted(GRAFANA_VARIABLES, key=len)[::-1]))
    dashboard = json.loads(DASHBOARD.read_text())
    raw = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            values = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
            assert values, f"variable {variable['name']}: {variable['query']!r}"
            selector, label = values.groups()
            raw.append((f"variable {variable['name']}", f"count by ({label}) ({selector})"))
    for panel in dashboard["panels"]:
        raw += [(panel["title"], target["expr"]) for target in panel.get("targets", [])]
    found = []
    for what, expr in raw:
        expr = pattern.sub(lambda m: GRAFANA_VARIABLES[m.group(0)], expr)
        assert "$" not in expr, f"{what}: a variable left in {expr!r}"
        found.append((what, expr))
    return found


def rules() -> dict[str, str]:
    """Alert name -> expression, from the shipped rules file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def client(srv: FleetServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key=key, max_retries=0, timeout=30)


def complete(srv: FleetServer, key: str, model: str = "m") -> None:
    done = client(srv, key).completions.create(model=model, prompt="hello", max_tokens=3)
    assert done.usage is not None and done.usage.completion_tokens == 3


def stream(srv: FleetServer, key: str) -> None:
    chunks = client(srv, key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    assert any(c.choices and c.choices[0].delta.content for c in chunks)


def refused(srv: FleetServer, key: str, model: str, status: int) -> None:
    r = httpx.post(
        f"{srv.base}/v1/completions",
        json={"model": model, "prompt": "x", "max_tokens": 1},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == status, (model, r.status_code, r.text)


def scraped(base: str, expr: str) -> None:
    """Wait until Prometheus has a sample of `expr`. A counter's series that appears
    between two scrapes at its final value shows no increase to rate(): each kind of
    failure is sent once, seen, then sent again (as steady traffic would)."""
    wait_for(lambda: query(base, expr), f"Prometheus scraped {expr}", 10, interval=0.2)


def failures(srv: FleetServer, keys: dict[str, str], engines: list[str], n: int) -> None:
    """`n` of each failure: 502 (every engine of m failing: each request is retried on
    the other, then answered 502), and llmgw's own refusals: a wrong key, an unknown
    model, a key over its rate limit, a model with no ready replica."""
    good = keys["good"]
    for url in engines:
        set_faults(url, error_rate=1.0, error_status=500)
    for _ in range(n):
        refused(srv, good, "m", 502)
    for url in engines:
        set_faults(url, error_rate=0.0)
    for _ in range(n):
        refused(srv, "llmgw-not-a-key", "m", 401)
        refused(srv, good, "no-such-model", 404)
        refused(srv, keys["limited"], "m", 429)
        refused(srv, good, "broken", 503)


def drive(srv: FleetServer, keys: dict[str, str], base: str) -> None:
    """Traffic with every failure the dashboard and the alerts are about."""
    good = keys["good"]
    engines = [r["url"] for r in srv.ready_replicas("m", 2)]
    complete(srv, keys["limited"])  # its one request a minute: the rest are 429
    for _ in range(6):
        complete(srv, good)
        stream(srv, good)
    scraped(base, 'llmgw_time_to_first_token_seconds_count{model="m"}')
    # Slow first tokens on both engines: four streams fill their two sequences each,
    # and the bronze key's requests queue for admission behind them.
    for url in engines:
        set_faults(url, first_token_delay=2.6)
    with ThreadPoolExecutor(8) as pool:
        slow = [pool.submit(stream, srv, good) for _ in range(4)]
        wait_for(  # over the bronze band's ceiling (0.30)
            lambda: srv.metric("llmgw_admission_pool_saturation_ratio", model="m") >= 0.5,
            "the slow streams filling m",
            10,
        )
        queued = [pool.submit(complete, srv, keys["bronze"]) for _ in range(2)]
        for f in (*slow, *queued):
            f.result()
    for url in engines:
        set_faults(url, first_token_delay=0)
    failures(srv, keys, engines, 1)
    for reason in ("invalid_api_key", "model_not_found", "no_healthy_replica"):
        scraped(base, f'llmgw_rejected_requests_total{{reason="{reason}"}}')
    scraped(base, 'llmgw_requests_total{model="m", status="502"}')
    failures(srv, keys, engines, 3)
    # crashy's engine answers two requests, then exits with status 1.
    for _ in range(2):
        complete(srv, good, "crashy")


def test_dashboard_and_alert_rules_against_a_real_prometheus() -> None:
    prom, promtool = tool("prometheus"), tool("promtool")
    for argv in (
        [promtool, "check", "rules", str(RULES)],
        [promtool, "test", "rules", str(RULES_TEST)],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{' '.join(argv[1:3])}:\n{done.stdout}{done.stderr}"
    exprs = dashboard_exprs()
    alerts = rules()
    assert set(EXPECTED_ALERTS) | set(QUIET_ALERTS) <= set(alerts)

    db = scratch_dir("llmgw-store-") / "llmgw.db"
    made = create_keys(db, good={}, bronze={"band": "bronze"}, limited={"rpm": 1})
    keys = {name: secret for name, (_record, secret) in made.items()}
    bin_dir = scratch_dir("nvidia-smi-")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI}\nEOF\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    smi_path = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    with contextlib.ExitStack() as stack:
        ports = stack.enter_context(FleetPorts.reserved())
        gone = stack.enter_context(reserve_port())  # nothing listens there
        scrape = {"llmgw": f"127.0.0.1:{ports.admin}", "llmgw-gone": f"127.0.0.1:{gone}"}
        base = stack.enter_context(prometheus(prom, scrape, stack.enter_context(reserve_port())))
        srv = stack.enter_context(fleet_server(server_config(db), ports=ports))
        gpu1 = stack.enter_context(
            agent(srv.agent_address, "gpu-1", address="127.0.0.2", gpus=None, env=smi_path)
        )
        gpu2 = stack.enter_context(
            agent(srv.agent_address, "gpu-2", address="127.0.0.3", gpus="1x24GB:L4")
        )
        agents = [gpu1.proc, gpu2.proc]
        srv.wait(lambda: "gpu-2" in srv.nodes(), "gpu-2 registered", logs=agents)
        # gpu-2 stops heartbeating (its agent frozen), and is thawed before it is stopped.
        os.kill(gpu2.proc.pid, signal.SIGSTOP)
        stack.callback(os.kill, gpu2.proc.pid, signal.SIGCONT)
        srv.wait(lambda: srv.ready_replicas("m", 2), "m ready", logs=agents)
        srv.wait(lambda: srv.ready_replicas("crashy", 1), "crashy ready", logs=agents)

        def targets_seen() -> bool:
            active = api(base, "/api/v1/targets")["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in active}
            return health == {"llmgw": "up", "llmgw-gone": "down"} and bool(
                query(base, 'llmgw_build_info{job="llmgw"}')
            )

        wait_for(targets_seen, "Prometheus scraping llmgw (and failing the dead target)", 20)

        drive(srv, keys, base)
        # Refusals carry the configured model they were for, never a name a client made up.
        text = httpx.get(f"{srv.admin}/metrics", timeout=5).text
        assert "no-such-model" not in text
        for reason, model in (
            ("model_not_found", ""),
            ("invalid_api_key", ""),
            ("no_healthy_replica", "broken"),
            ("upstream_error", "m"),
        ):
            assert srv.metric("llmgw_rejected_requests_total", reason=reason, model=model) == 4

        def expected_alerts_true() -> list[str] | None:
            missing = []
            for name, labels in EXPECTED_ALERTS.items():
                series = query(base, alerts[name])
                if not any(labels.items() <= s["metric"].items() for s in series):
                    missing.append(name)
            return None if missing else ["ok"]

        wait_for(
            expected_alerts_true,
            "every alert expression the failures make true returning series",
            DEADLINE,
            interval=0.5,
            context=lambda: (
                "still false: "
                + ", ".join(n for n in EXPECTED_ALERTS if not query(base, alerts[n]))
            ),
        )
        for name in QUIET_ALERTS:
            assert query(base, alerts[name]) == [], name
        # Every shipped rule loaded and evaluates cleanly; the expected ones are active.
        loaded = [r for g in api(base, "/api/v1/rules")["groups"] for r in g["rules"]]
        assert {r["name"] for r in loaded} == set(alerts)
        assert all(r["health"] == "ok" for r in loaded), [
            (r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"
        ]
        wait_for(
            lambda: (
                set(EXPECTED_ALERTS)
                <= {a["labels"]["alertname"] for a in api(base, "/api/v1/alerts")["alerts"]}
            ),
            "the expected alerts pending or firing in Prometheus",
            10,
            interval=0.5,
            context=lambda: f"alerts: {api(base, '/api/v1/alerts')['alerts']}",
        )

        def empty_panels() -> list[str]:
            return [f"{title}: {expr}" for title, expr in exprs if not query(base, expr)]

        wait_for(
            lambda: not empty_panels(),
            "every dashboard expression returning series",
            DEADLINE,
            interval=0.5,
            context=lambda: "no series:\n" + "\n".join(empty_panels()),
        )
        # What the fleet panels show: gpu-1's four GPUs as its driver reported them;
        # nothing for the unreachable gpu-2 (a stale reading is absent, never 0).
        utilisation = {
            (s["metric"]["node"], s["metric"]["gpu"]): float(s["value"][1])
            for s in query(base, 'llmgw_fleet_gpu_utilization_ratio{job="llmgw"}')
        }
        assert utilisation == {("gpu-1", str(i)): (i + 1) / 10 for i in range(4)}
        nodes = {
            s["metric"]["state"]: float(s["value"][1])
            for s in query(base, 'llmgw_fleet_nodes{job="llmgw"}')
        }
        assert nodes == {"ready": 1, "unreachable": 1, "lost": 0}
