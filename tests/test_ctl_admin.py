"""`llmgw-ctl keys`, `usage` and `models` as processes against a real llmgw-server
(SQLite store, one simulated engine), checked through the openai client on the client port."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .procs import BIN, Server, running, server, sim, wait_for

CONFIG = """
[store]
url = "sqlite:///{path}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
[router.admission]
default_band = "silver"
"""

SECRET = re.compile(r"^\s+(llmgw-\S+)\s*$", re.MULTILINE)


def ctl(admin: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    done = subprocess.run(
        [str(BIN / "llmgw-ctl"), "--admin", admin, *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=30,
        # PYTHONPATH passed on: the ctl under test is the tree's, not an installed one.
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
        | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    )
    return done.returncode, done.stdout, done.stderr


def ok(admin: str, *args: str, stdin: str | None = None) -> str:
    code, out, err = ctl(admin, *args, stdin=stdin)
    assert (code, err) == (0, ""), f"llmgw-ctl {' '.join(args)}: exit {code}: {err}"
    return out


def failed(admin: str, *args: str, code: int = 1) -> str:
    """The one error line of a command that must fail with `code`."""
    got, out, err = ctl(admin, *args)
    assert (got, out) == (code, ""), f"llmgw-ctl {' '.join(args)}: exit {got}: {out}{err}"
    assert err.startswith("llmgw-ctl") and err.count("\n") == 1, err
    return err


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def ask(base: str, key: str, model: str = "m") -> str:
    reply = client(base, key).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    return reply.model


def without_key(base: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).status_code


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("ctl-store") / "llmgw.db"
    with (
        sim(model="m") as (_, engine),
        server("--endpoint", f"s0={engine}=m", config=CONFIG.format(path=db)) as s,
    ):
        s.wait_scraped()
        yield s


def test_keys_lifecycle_and_usage(srv: Server) -> None:
    admin = srv.admin
    assert "no API keys" in ok(admin, "keys")
    assert without_key(srv.base) == 200  # no key exists yet: the port is open

    out = ok(admin, "keys", "create", "--name", "alice", "--band", "gold", "--models", "m",
             "--rpm", "100", "--tpm", "100000", "--expires-in", "30d")  # fmt: skip
    (secret,) = SECRET.findall(out)
    assert out.count(secret) == 1
    assert "cannot be shown again" in out
    assert "first usable key" in out and "401" in out
    # Another key, so that revoking alice's leaves the client port guarded.
    keeper = json.loads(ok(admin, "--json", "keys", "create", "--name", "keeper"))
    spare = ok(admin, "keys", "create", "--name", "spare")
    assert "band silver (default); all models" in spare.splitlines()[0]
    assert keeper["secret"].startswith("llmgw-") and keeper["name"] == "keeper"

    # The server checks whether keys exist at most once per auth.cache_ttl (1 s); until
    # it sees one, it neither asks for keys nor attributes requests to the keys sent.
    wait_for(lambda: without_key(srv.base) == 401, "401 without a key", 5)
    assert ask(srv.base, secret) == "m"
    assert ask(srv.base, keeper["secret"]) == "m"
    with pytest.raises(openai.AuthenticationError):
        ask(srv.base, "llmgw-not-a-key")

    listing = ok(admin, "keys")
    alice = next(line for line in listing.splitlines() if "alice" in line)
    prefix = secret[:14]
    for cell in (prefix, "gold", "100 rpm, 100k tpm", "active, expires in 30d"):
        assert cell in alice, (cell, alice)
    assert secret not in listing
    listed = json.loads(ok(admin, "keys", "--json"))["keys"]
    assert [k["name"] for k in listed] == ["alice", "keeper", "spare"]
    # keeper has no band of its own: the server's default band applies, and is shown.
    kept = next(line for line in listing.splitlines() if "keeper" in line)
    assert "silver (default)" in kept and listed[1]["band"] is None
    assert all("secret" not in k for k in listed)

    # Usage reaches the store in batches (every second): wait on the API, then ask llmgw-ctl.
    def alice_usage(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((r for r in rows if r["name"] == "alice" and r["requests"] >= 1), None)

    wait_for(
        lambda: alice_usage(httpx.get(f"{admin}/api/v1/usage", timeout=5).json()["usage"]),
        "alice's request in usage",
        10,
    )
    row = alice_usage(
        json.loads(ok(admin, "--json", "usage", "--by", "key", "--since", "1h"))["usage"]
    )
    assert row is not None and row["completion_tokens"] >= 1 and row["prompt_tokens"] >= 1
    table = ok(admin, "usage", "--by", "key", "--since", "24h")
    line = next(line for line in table.splitlines() if "alice" in line)
    assert row["group"] in line and " ms" in line
    assert "usage by key since" in table and "(no key)" in table  # the request before keys
    assert "total" in table
    by_model = ok(admin, "usage", "--by", "model", "--bucket", "1h")
    assert "usage by model (all recorded), per 1h" in by_model and "bucket (UTC)" in by_model
    assert any(line.split()[2:3] == ["m"] for line in by_model.splitlines())

    # Revoke by name; the server's key cache lets it work for at most a second more.
    out = ok(admin, "keys", "revoke", "alice")
    assert out.startswith("revoked key 'alice' (key_")

    def refused() -> bool:
        try:
            ask(srv.base, secret)
        except openai.AuthenticationError:
            return True
        return False

    wait_for(refused, "alice's revoked key refused", 5)
    assert ask(srv.base, keeper["secret"]) == "m"
    assert "revoked" in next(line for line in ok(admin, "keys").splitlines() if "alice" in line)

    # A name belongs to one key until it is revoked; then it may be used again.
    err = failed(admin, "keys", "revoke", "nobody")
    assert "no key with the id or name 'nobody'" in err
    first = json.loads(ok(admin, "--json", "keys", "create", "--name", "twin"))["id"]
    err = failed(admin, "keys", "create", "--name", "twin")
    assert "409" in err and f"a key named 'twin' exists ({first}) and is not revoked" in err
    assert first in ok(admin, "keys", "revoke", "twin")
    second = json.loads(ok(admin, "--json", "keys", "create", "--name", "twin"))["id"]
    assert ok(admin, "keys", "revoke", "twin").startswith(f"revoked key 'twin' ({second})")
    # Both revoked: the name is no longer ambiguous, revoking again changes nothing.
    assert ok(admin, "keys", "revoke", "twin") == f"key 'twin' ({second}) was already revoked\n"

    # The admin API's own refusals name the value at fault.
    err = failed(admin, "keys", "create", "--name", "x", "--band", "diamond")
    assert "band: no band named 'diamond'" in err
    err = failed(admin, "keys", "create", "--name", "x", "--models", "m,nope")
    assert "models[1]: no model or alias named 'nope'" in err
    err = failed(admin, "usage", "--since", "yesterday", code=2)
    assert "--since" in err


def test_models_add_scale_remove(srv: Server, tmp_path: Path) -> None:
    admin = srv.admin
    entry = tmp_path / "rt.toml"
    entry.write_text('[[models]]\nname = "rt"\naliases = ["rt-alias"]\nfallbacks = ["m"]\n')
    out = ok(admin, "models", "add", str(entry))
    assert out == "added model 'rt' (runtime; aliases rt-alias; fallbacks m)\n"

    listing = ok(admin, "models")
    rt = next(line for line in listing.splitlines() if line.split()[:1] == ["rt"])
    assert rt.split()[1:5] == ["runtime", "rt-alias", "m", "-"] and "none" in rt
    m = next(line for line in listing.splitlines() if line.split()[:1] == ["m"])
    assert "endpoints" in m and "1/1 available: s0" in m
    # Served through its fallback.
    key = json.loads(ok(admin, "--json", "keys", "create", "--name", "models-test"))["secret"]
    assert ask(srv.base, key, "rt-alias") == "m"

    out = ok(admin, "models", "set-replicas", "rt", "3")
    assert out.startswith("model 'rt': 3 replica(s) desired")
    models = {m["name"]: m for m in json.loads(ok(admin, "--json", "models"))["models"]}
    assert models["rt"]["replicas"] == 3 and models["rt"]["source"] == "runtime"

    assert ok(admin, "models", "remove", "rt") == "removed model 'rt'\n"
    assert [m["name"] for m in json.loads(ok(admin, "--json", "models"))["models"]] == ["m"]

    # JSON on standard input, a bare entry.
    out = ok(admin, "models", "add", "-", stdin='{"name": "rt2", "fallbacks": ["m"]}')
    assert out.startswith("added model 'rt2'")
    assert json.loads(ok(admin, "--json", "models", "remove", "rt2")) == {
        "model": "rt2",
        "removed": True,
    }

    # Errors: one line each, saying what is wrong.
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",}')
    err = failed(admin, "models", "add", str(bad), code=2)
    assert f"{bad}: not valid JSON" in err and "line 1, column 14" in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"name": "x", "replica": 2}')
    assert "replica: unknown key" in failed(admin, "models", "add", str(unknown))
    assert "cannot read" in failed(admin, "models", "add", str(tmp_path / "no.toml"), code=2)
    # This server routes only (its models have no profiles): one to deploy is refused.
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(
        '[[models]]\nname = "dep"\n[[models.profiles]]\nname = "p"\nengine = "sim"\n'
        'weights = "sim"\n'
    )
    err = failed(admin, "models", "add", str(deploy))
    assert "409" in err and "no control plane: this server runs as a router only" in err
    assert [m["name"] for m in json.loads(ok(admin, "--json", "models"))["models"]] == ["m"]
    assert "no runtime model 'm'" in failed(admin, "models", "set-replicas", "m", "2")
    assert "no runtime model 'gone'" in failed(admin, "models", "remove", "gone")
    assert "must not be negative" in failed(admin, "models", "set-replicas", "rt", "-1", code=2)


def test_admin_key_off_loopback(tmp_path: Path) -> None:
    """The README's procedure: the first admin key through the loopback admin port, then
    the admin listener bound elsewhere needs it."""
    db = tmp_path / "llmgw.db"
    config = tmp_path / "llmgw.toml"
    # An endpoint nothing listens on: only the admin API matters here.
    endpoint = '[[endpoints]]\nid = "e"\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'
    config.write_text(CONFIG.format(path=db) + endpoint)
    with server("--config", str(config)) as loopback:
        created = json.loads(ok(loopback.admin, "--json", "keys", "create", "--name", "ops",
                                "--role", "admin"))  # fmt: skip
    argv = ("--config", str(config), "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0")
    with running("llmgw-server", *argv, ready=True) as proc:
        (bound,) = proc.ready["admin_listen"]
        assert bound.startswith("0.0.0.0:")
        admin = f"http://127.0.0.1:{bound.rsplit(':', 1)[1]}"
        err = failed(admin, "keys")
        assert "401" in err and "--admin-key" in err
        listed = json.loads(ok(admin, "--admin-key", created["secret"], "--json", "keys"))
        assert [k["name"] for k in listed["keys"]] == ["ops"]
        # the flag after the subcommand too
        assert "ops" in ok(admin, "keys", "--admin-key", created["secret"])


def test_the_default_store_is_sqlite_in_the_working_directory_and_empty_url_means_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a [store] table the server keeps keys in ./llmgw.db (DESIGN §8: SQLite is
    the embedded default), so they survive a restart; `store.url = ""` turns the store
    off, and what would need one is refused with the key to set."""
    monkeypatch.chdir(tmp_path)
    with sim() as (_, engine):
        endpoint = f"e1={engine}=sim-model"
        with server("--endpoint", endpoint) as srv:
            out = ok(srv.admin, "keys", "create", "--name", "first")
            secret = SECRET.search(out)
            assert secret is not None, out
        assert (tmp_path / "llmgw.db").is_file()
        with server("--endpoint", endpoint) as srv:
            assert "first" in ok(srv.admin, "keys")
            # The key from the first run now guards the client port.
            assert httpx.get(f"{srv.base}/v1/models", timeout=5).status_code == 401
            answer = client(srv.base, secret.group(1)).chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.choices[0].message.content
        with server("--endpoint", endpoint, config='[store]\nurl = ""\n') as srv:
            err = failed(srv.admin, "keys", "create", "--name", "second")
            assert "no store is configured" in err and "store.url" in err, err
            # No store, no keys: the client port is open again.
            assert httpx.get(f"{srv.base}/v1/models", timeout=5).status_code == 200
