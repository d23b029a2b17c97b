"""`llmgw-ctl`: admin subcommands against a fake admin API, and `bench` against the simulator."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from llmgw_cli.ctl import main
from tests.procs import BIN, free_port, sim

# ----------------------------------------------------------------- fake admin API


class FakeAdmin:
    """A tiny admin API: fixed JSON per path, and a log of what was asked."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, str | None]] = []
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                admin.requests.append((self.command, self.path, self.headers.get("authorization")))
                path = self.path.split("?", 1)[0]
                status, body = admin.routes.get(
                    (self.command, path), (404, {"error": {"message": f"no route {path}"}})
                )
                raw = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@contextlib.contextmanager
def fake_admin(routes: dict[tuple[str, str], tuple[int, Any]]) -> Iterator[FakeAdmin]:
    admin = FakeAdmin(routes)
    thread = threading.Thread(target=admin.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield admin
    finally:
        admin.server.shutdown()
        admin.server.server_close()
        thread.join(5)


def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


NODES = {
    "nodes": [
        {"id": "gpu-1", "state": "ready", "gpus": 8, "labels": {"zone": "a"}},
        {"id": "gpu-2", "state": "unreachable", "gpus": 4, "fabric": "ib-a"},
    ]
}


def test_listing_as_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_admin({("GET", "/api/v1/nodes"): (200, NODES)}) as admin:
        code, out, err = ctl(capsys, "--admin", admin.url, "nodes")
        assert code == 0, err
        # columns are the union of the records' keys, in first-seen order
        header = next(line for line in out.splitlines() if "state" in line)
        assert header.index("id") < header.index("state") < header.index("fabric")
        assert "gpu-2" in out and "unreachable" in out and "ib-a" in out
        assert '{"zone":"a"}' in out

        # global flags after the subcommand work too
        code, out, err = ctl(capsys, "nodes", "--json", "--admin", admin.url)
        assert code == 0, err
        assert json.loads(out) == NODES


def test_listing_shapes_and_filters(capsys: pytest.CaptureFixture[str]) -> None:
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("GET", "/api/v1/models"): (200, [{"name": "llama", "replicas": 2, "aliases": ["l3"]}]),
        ("GET", "/api/v1/placement"): (
            200,
            {"llama": {"placed": 1, "reasons": ["gpu-3: 2 free GPUs, needs 4"]}},
        ),
        ("GET", "/api/v1/usage"): (200, {"items": []}),
        ("GET", "/api/v1/keys"): (200, {"total": 3, "window": "1h"}),
    }
    with fake_admin(routes) as admin:
        code, out, _ = ctl(capsys, "--admin", admin.url, "models")
        assert code == 0 and "llama" in out and "l3" in out
        code, out, _ = ctl(capsys, "--admin", admin.url, "placement")
        assert code == 0 and "gpu-3: 2 free GPUs, needs 4" in out and "llama" in out
        code, out, _ = ctl(
            capsys, "--admin", admin.url, "--admin-key", "ak", "usage", "--filter", "model=llama"
        )
        assert code == 0 and "no usage" in out
        assert ("GET", "/api/v1/usage?model=llama", "Bearer ak") in admin.requests
        code, out, _ = ctl(capsys, "--admin", admin.url, "keys")
        assert code == 0 and "window" in out and "1h" in out


def test_wide_records_are_shown_one_field_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    wide = {f"field_{i}": f"value-{i}-" + "x" * 20 for i in range(12)}
    with fake_admin(
        {("GET", "/api/v1/replicas"): (200, {"replicas": [{"id": "r1", **wide}]})}
    ) as a:
        code, out, _ = ctl(capsys, "--admin", a.url, "replicas")
    assert code == 0
    assert "replicas (1) id=r1" in out
    for key, value in wide.items():
        assert any(key in line and value in line for line in out.splitlines())


def test_drain(capsys: pytest.CaptureFixture[str]) -> None:
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("POST", "/api/v1/nodes/gpu-1/drain"): (202, None),
        ("POST", "/api/v1/nodes/gpu-2/drain"): (200, {"node": "gpu-2", "draining": 3}),
    }
    with fake_admin(routes) as admin:
        code, out, _ = ctl(capsys, "--admin", admin.url, "drain", "gpu-1")
        assert code == 0 and out.strip() == "drain requested for node gpu-1"
        code, out, _ = ctl(capsys, "--admin", admin.url, "--json", "drain", "gpu-2")
        assert code == 0 and json.loads(out) == {"node": "gpu-2", "draining": 3}
        code, out, err = ctl(capsys, "--admin", admin.url, "drain", "nope")
        assert code == 1 and out == ""
        assert err == (
            f"llmgw-ctl: error: admin API at {admin.url}: "
            "no route /api/v1/nodes/nope/drain (404 Not Found)\n"
        )


def test_missing_api_and_server_errors(capsys: pytest.CaptureFixture[str]) -> None:
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("GET", "/api/v1/replicas"): (500, {"detail": "store unavailable"}),
        ("GET", "/api/v1/keys"): (401, {"error": {"message": "admin key required"}}),
    }
    with fake_admin(routes) as admin:
        # An admin server without this API: 404 with a non-OpenAI body.
        admin.routes[("GET", "/api/v1/models")] = (404, "Not Found")
        code, out, err = ctl(capsys, "--admin", admin.url, "models")
        assert (code, out) == (1, "")
        assert (
            err
            == f"llmgw-ctl: error: admin API at {admin.url}: no /api/v1/models (404 Not Found)\n"
        )
        code, _, err = ctl(capsys, "--admin", admin.url, "replicas")
        assert code == 1
        assert err == (
            "llmgw-ctl: error: admin API answered 500 to GET /api/v1/replicas: store unavailable\n"
        )
        code, _, err = ctl(capsys, "--admin", admin.url, "keys")
        assert code == 1 and "401" in err and "--admin-key" in err and err.count("\n") == 1


def test_unreachable_admin(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = ctl(capsys, "--admin", url, "nodes")
    assert (code, out) == (1, "")
    assert err == f"llmgw-ctl: error: cannot reach admin API at {url}: connection refused\n"


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = ctl(capsys, "bench", "--url", "http://x", "--model", "m", "--concurrency", "0")
    assert code == 2 and err.count("\n") == 1 and "--concurrency" in err
    code, _, err = ctl(
        capsys, "bench", "--url", "http://x", "--model", "m", "--target-ttft", "500ms"
    )
    assert code == 2 and err == (
        "llmgw-ctl: error: --target-ttft needs --sweep C1,C2,... (the concurrencies to measure)\n"
    )
    code, _, err = ctl(capsys, "bench", "--url", "http://x", "--model", "m", "--duration", "soon")
    assert code == 2 and "--duration" in err and err.count("\n") == 1


# ------------------------------------------------------------- bench vs simulator


def _run_ctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-ctl"), *argv], capture_output=True, text=True, timeout=60
    )


def test_bench_against_simulator() -> None:
    with sim(model="sim-a") as (_proc, base):
        # streaming chat, ignore_eos so every response is exactly --output-tokens
        done = _run_ctl(
            "bench", "--url", base, "--model", "sim-a", "--json",
            "--requests", "24", "--concurrency", "4", "--prompt-tokens", "32",
            "--output-tokens", "8", "--shared-prefix-ratio", "0.5", "--prefix-groups", "2",
            "--seed", "7",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # no progress bar when not a TTY / with --json
        report = json.loads(done.stdout)
        s = report["summary"]
        assert (s["requests"], s["ok"], s["failed"], s["errors"]) == (24, 24, 0, {})
        assert s["completion_tokens"] == 24 * 8
        assert s["prompt_tokens"] >= 24 * 32
        assert s["cached_tokens"] > 0, "the shared prefix should hit the simulator's cache"
        assert 0 < s["ttft"]["p50"] <= s["e2e"]["p50"]
        assert s["ttft"]["max"] <= s["e2e"]["max"]
        assert s["ttft"]["min"] <= s["ttft"]["p50"] <= s["ttft"]["p90"] <= s["ttft"]["p99"]
        assert s["itl"]["count"] == 24 * 7
        assert s["request_throughput"] > 0 and s["output_token_throughput"] > 0
        assert report["config"]["workload"]["seed"] == 7

        # plain completions, not streamed
        done = _run_ctl(
            "bench", "--url", base + "/v1", "--model", "sim-a", "--json", "--no-stream",
            "--endpoint", "completions", "--requests", "6", "--concurrency", "3",
            "--prompt-tokens", "16", "--output-tokens", "5",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        s = json.loads(done.stdout)["summary"]
        assert s["ok"] == 6 and s["completion_tokens"] == 30 and s["ttft"] is None

        # a sweep reads the simulator's waiting queue and suggests scoring targets
        done = _run_ctl(
            "bench", "--url", base, "--model", "sim-a", "--json", "--sweep", "1,2",
            "--requests", "6", "--prompt-tokens", "16", "--output-tokens", "4",
            "--target-ttft", "10s",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert [st["concurrency"] for st in report["steps"]] == [1, 2]
        assert all(st["passed"] and st["engine"] is not None for st in report["steps"])
        assert report["suggestion"]["target_inflight"] == 2
        assert report["suggestion"]["target_waiting"] >= 1

        # a wrong model is a runtime failure, reported in one line
        done = _run_ctl("bench", "--url", base, "--model", "nope", "--requests", "2")
        assert done.returncode == 1
        assert done.stderr.startswith("llmgw-ctl: error: no request succeeded (2 x 404")
        assert done.stderr.count("\n") == 1


def test_bench_unreachable_target() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _run_ctl("bench", "--url", url, "--model", "m", "--requests", "3", "--json")
    assert done.returncode == 1
    assert done.stderr.startswith("llmgw-ctl: error: no request succeeded (3 x connect_error")
    assert json.loads(done.stdout)["summary"]["errors"] == {"connect_error": 3}
