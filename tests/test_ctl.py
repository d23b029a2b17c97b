"""`llmgw-ctl`: admin subcommands against a fake admin API, and `bench` against the simulator."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing_procs import reserve_port
from llmgw_cli import ctl_views
from llmgw_cli.ctl import main, read_model_entry
from llmgw_cli.ctl_views import render
from tests.procs import BIN, sim

# ----------------------------------------------------------------- fake admin API


class FakeAdmin:
    """A tiny admin API: fixed JSON per path, and a log of what was asked."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, str | None]] = []
        self.bodies: list[Any] = []  # the JSON bodies sent, in order
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                admin.requests.append((self.command, self.path, self.headers.get("authorization")))
                length = int(self.headers.get("content-length") or 0)
                if length:
                    admin.bodies.append(json.loads(self.rfile.read(length)))
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

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

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
    with reserve_port() as port:  # held, so nothing listens there
        url = f"http://127.0.0.1:{port}"
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


# ------------------------------------------------------------- keys, usage, models


def _key(id: str, name: str, **kw: Any) -> dict[str, Any]:
    key = {
        "id": id, "name": name, "prefix": "llmgw-abcdefgh", "band": None, "models": None,
        "rpm": None, "tpm": None, "admin": False, "status": "active",
        "created_at": 1000.0, "expires_at": None, "revoked_at": None,
    }  # fmt: skip
    return {**key, **kw}


def test_keys_create_prints_the_secret_once(capsys: pytest.CaptureFixture[str]) -> None:
    created = _key("key_1", "ci", band="silver", models=["a", "b"], rpm=60, admin=True)
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("POST", "/api/v1/keys"): (201, {**created, "secret": "llmgw-SECRET"}),
        ("GET", "/api/v1/keys"): (200, {"keys": [created]}),
    }
    with fake_admin(routes) as admin:
        argv = ["--admin", admin.url, "keys", "create", "--name", "ci", "--band", "silver",
                "--models", "a,b", "--rpm", "60", "--tpm", "5000", "--admin",
                "--expires-in", "30d"]  # fmt: skip
        code, out, err = ctl(capsys, *argv)
        assert (code, err) == (0, "")
        assert admin.bodies == [
            {"name": "ci", "band": "silver", "models": ["a", "b"], "rpm": 60, "tpm": 5000,
             "expires_in_seconds": 30 * 86400.0, "admin": True}
        ]  # fmt: skip
        assert "\n    llmgw-SECRET\n" in out and out.count("llmgw-SECRET") == 1
        assert "cannot be shown again" in out
        assert "first usable key" in out  # the only active key in the listing

        admin.bodies.clear()
        code, out, _ = ctl(capsys, "--admin", admin.url, "keys", "create", "--name", "ci", "--json")
        assert code == 0 and json.loads(out)["secret"] == "llmgw-SECRET"
        assert admin.bodies == [{"name": "ci"}]

    code, _, err = ctl(capsys, "keys", "create", "--name", "x", "--models", "a,,b")
    assert code == 2 and "--models" in err and err.count("\n") == 1
    code, _, err = ctl(capsys, "keys", "create", "--band", "gold")
    assert code == 2 and "--name" in err and err.count("\n") == 1


def test_keys_revoke_resolves_names(capsys: pytest.CaptureFixture[str]) -> None:
    keys = [
        _key("key_old", "ci", status="revoked", revoked_at=2000.0),
        _key("key_new", "ci"),
        _key("key_a", "twin"),
        _key("key_b", "twin"),
        _key("key_gone", "gone", status="revoked", revoked_at=2000.0),
    ]
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("GET", "/api/v1/keys"): (200, {"keys": keys}),
        **{("DELETE", f"/api/v1/keys/{k['id']}"): (200, {**k, "status": "revoked"}) for k in keys},
    }
    with fake_admin(routes) as admin:
        # a name matching a revoked key and a live one means the live one
        code, out, _ = ctl(capsys, "--admin", admin.url, "keys", "revoke", "ci")
        assert code == 0 and out.startswith("revoked key 'ci' (key_new)")
        assert ("DELETE", "/api/v1/keys/key_new", None) in admin.requests
        code, out, _ = ctl(capsys, "--admin", admin.url, "keys", "revoke", "key_old")
        assert code == 0 and "already revoked" in out
        code, out, _ = ctl(capsys, "--admin", admin.url, "keys", "revoke", "gone")
        assert code == 0 and "already revoked" in out
        code, out, err = ctl(capsys, "--admin", admin.url, "keys", "revoke", "twin")
        assert (code, out) == (1, "")
        assert err == (
            "llmgw-ctl: error: 2 keys are named 'twin' (key_a, key_b): revoke one by its id\n"
        )
        code, _, err = ctl(capsys, "--admin", admin.url, "keys", "revoke", "nobody")
        assert code == 1 and "no key with the id or name 'nobody'" in err
        deletes = [r for r in admin.requests if r[0] == "DELETE"]
        assert [r[1] for r in deletes] == [
            "/api/v1/keys/key_new",
            "/api/v1/keys/key_old",
            "/api/v1/keys/key_gone",
        ]


def test_api_errors_name_the_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    error = {"message": "no key 'k'", "type": "not_found_error", "param": "id", "code": "x"}
    bad = {"message": "models[0]: no model named 'z'", "param": "models[0]", "code": "y"}
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("GET", "/api/v1/keys"): (200, {"keys": [_key("k", "k")]}),
        ("DELETE", "/api/v1/keys/k"): (404, {"error": error}),
        ("POST", "/api/v1/keys"): (400, {"error": bad}),
    }
    with fake_admin(routes) as admin:
        code, _, err = ctl(capsys, "--admin", admin.url, "keys", "revoke", "k")
        assert code == 1
        assert err == (
            f"llmgw-ctl: error: admin API at {admin.url}: no key 'k' (param id) (404 Not Found)\n"
        )
        code, _, err = ctl(capsys, "--admin", admin.url, "keys", "create", "--name", "n")
        assert code == 1
        assert err == (
            "llmgw-ctl: error: admin API answered 400 to POST /api/v1/keys: "
            "models[0]: no model named 'z'\n"
        )


def test_usage_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    report = {
        "group_by": "model", "since": 1700000000.0, "until": None, "bucket_seconds": 3600.0,
        "usage": [
            {"group": "llama", "name": None, "bucket": 1700002800.0, "requests": 1200,
             "prompt_tokens": 1234567, "completion_tokens": 89, "cached_tokens": 0,
             "errors": 3, "mean_latency": 1.5, "mean_ttft": 0.25},
            {"group": "qwen", "name": None, "bucket": 1700002800.0, "requests": 800,
             "prompt_tokens": 10, "completion_tokens": 11, "cached_tokens": 5,
             "errors": 0, "mean_latency": 0.5, "mean_ttft": None},
        ],
    }  # fmt: skip
    with fake_admin({("GET", "/api/v1/usage"): (200, report)}) as admin:
        argv = ["--admin", admin.url, "usage", "--by", "model", "--since", "2023-11-14T22:13:20",
                "--until", "1h", "--bucket", "1h"]  # fmt: skip
        code, out, err = ctl(capsys, *argv)
        assert (code, err) == (0, "")
        assert admin.requests[-1][1] == (
            "/api/v1/usage?group_by=model&since=1700000000&until=1h&bucket=1h"
        )
        assert "usage by model since 2023-11-14 22:13:20 UTC, per 1h" in out
        llama = next(line for line in out.splitlines() if "llama" in line)
        assert llama.split() == [
            "2023-11-14", "23:00", "llama", "1,200", "1,234,567", "89", "0", "3", "1.50", "s",
            "250", "ms",
        ]  # fmt: skip
        qwen = next(line for line in out.splitlines() if "qwen" in line)
        assert qwen.split()[-3:] == ["500", "ms", "-"]
        total = next(line for line in out.splitlines() if "total" in line)
        assert total.split() == ["total", "2,000", "1,234,577", "100", "5", "3", "1.10", "s"]

        code, _, _ = ctl(capsys, "--admin", admin.url, "usage", "--since", "2023-11-15T00:00+01:00")
        assert code == 0 and admin.requests[-1][1] == "/api/v1/usage?since=1700002800"
    for bad in (("--since", "last week"), ("--bucket", "500ms"), ("--by", "band")):
        code, _, err = ctl(capsys, "usage", *bad)
        assert code == 2 and bad[0] in err and err.count("\n") == 1


def test_readable_keys_and_models() -> None:
    from rich.console import Console

    def text(view: Any) -> str:
        console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(view)
        return console.export_text()

    now = 1_000_000.0
    keys = {
        "keys": [
            _key("key_1", "ops", admin=True, rpm=1500, tpm=2_000_000),
            _key("key_2", "old", status="revoked", revoked_at=now - 7200),
            _key("key_3", "temp", status="expired", expires_at=now - 90),
            _key("key_4", "ci", band="gold", models=["a"], expires_at=now + 30 * 86400),
        ]
    }
    out = text(ctl_views.keys(keys, now=now))
    rows = {line.split()[0]: line for line in out.splitlines()[3:] if line.strip()}
    assert "1.5k rpm, 2M tpm" in rows["ops"] and "yes" in rows["ops"]
    assert rows["old"].rstrip().endswith("revoked 2.0h ago")
    assert rows["temp"].rstrip().endswith("expired 90s ago")
    assert "gold" in rows["ci"] and rows["ci"].rstrip().endswith("active, expires in 30d")
    assert "no API keys" in text(render("keys", {"keys": []}))

    models = {
        "models": [
            {"name": "llama", "aliases": ["l"], "fallbacks": [], "source": "config",
             "status": {"model": "llama", "desired": 2, "ready": 1}, "replicas": 2,
             "routing": {"endpoints": ["r1"], "available": 1}},
            {"name": "rt", "aliases": [], "fallbacks": ["llama"], "source": "runtime",
             "status": None, "routing": {"endpoints": [], "available": 0}},
        ]
    }  # fmt: skip
    out = text(render("models", models))
    llama = next(line for line in out.splitlines() if line.split()[:1] == ["llama"])
    assert llama.split() == ["llama", "config", "l", "-", "1/2", "1/1", "available:", "r1"]
    rt = next(line for line in out.splitlines() if line.split()[:1] == ["rt"])
    assert rt.split() == ["rt", "runtime", "-", "llama", "-", "none"]


def test_model_entries_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw_cli._common import CliError

    entry = {"name": "m", "fallbacks": ["base"], "replicas": 2}
    files = {
        "table.toml": '[[models]]\nname = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
        "bare.toml": 'name = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
        "bare.json": json.dumps(entry),
        "list.json": json.dumps({"models": [entry]}),
        "noext": json.dumps(entry),
        "noext-toml": 'name = "m"\nfallbacks = ["base"]\nreplicas = 2\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert read_model_entry(str(tmp_path / name)) == entry, name
    monkeypatch.setattr("sys.stdin", io.StringIO('name = "m"\nfallbacks = ["base"]\nreplicas = 2'))
    assert read_model_entry("-") == entry

    bad = {
        "two.toml": ('[[models]]\nname = "a"\n[[models]]\nname = "b"\n', "found 2 in 'models'"),
        "list.json": ("[1, 2]", "expected a catalog entry (an object), got list"),
        "empty.json": ("{}", "the catalog entry is empty"),
        "broken.toml": ("name = ", "not valid TOML"),
        "broken.json": ('{"name": "x",}', "not valid JSON"),
    }
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(CliError, match=re.escape(message)) as info:
            read_model_entry(str(tmp_path / name))
        assert info.value.code == 2 and "\n" not in str(info.value)


def test_models_changes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    routing = {"endpoints": [], "available": 0}
    model = {"name": "org/m", "aliases": [], "fallbacks": ["base"], "source": "runtime",
             "status": None, "profiles": [], "routing": routing}  # fmt: skip
    routes: dict[tuple[str, str], tuple[int, Any]] = {
        ("POST", "/api/v1/models"): (201, model),
        ("PATCH", "/api/v1/models/org%2Fm"): (200, {**model, "replicas": 0}),
        ("DELETE", "/api/v1/models/org%2Fm"): (204, None),
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "org/m", "fallbacks": ["base"]}))
    with fake_admin(routes) as admin:
        code, out, _ = ctl(capsys, "--admin", admin.url, "models", "add", str(path))
        assert code == 0 and out == "added model 'org/m' (runtime; fallbacks base)\n"
        code, out, _ = ctl(capsys, "--admin", admin.url, "models", "set-replicas", "org/m", "0")
        assert code == 0 and out.startswith("model 'org/m': 0 replica(s) desired")
        code, out, _ = ctl(capsys, "--admin", admin.url, "--json", "models", "remove", "org/m")
        assert code == 0 and json.loads(out) == {"model": "org/m", "removed": True}
        assert admin.bodies == [{"name": "org/m", "fallbacks": ["base"]}, {"replicas": 0}]


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
    with reserve_port() as port:  # held, so nothing listens there
        url = f"http://127.0.0.1:{port}"
        done = _run_ctl("bench", "--url", url, "--model", "m", "--requests", "3", "--json")
    assert done.returncode == 1
    assert done.stderr.startswith("llmgw-ctl: error: no request succeeded (3 x connect_error")
    assert json.loads(done.stdout)["summary"]["errors"] == {"connect_error": 3}
