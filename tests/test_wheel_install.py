"""The production install path: `python -m build --wheel`, the wheel into a fresh venv
(first alone, with none of the extras and `llmgw-server` naming the one it needs, then
with `[server]`), and `llmgw-server --demo` from that venv serving a chat completion,
then stopping on SIGTERM (docs/operations.md).

The wheel is built from a copy of the working tree's files (tracked, and new ones not
ignored), so the build writes nothing into the checkout. The fresh venv has nothing
but what pip resolves for the wheel (its dependencies from the package index): no
PYTHONPATH, no working directory holding the sources, so a file the wheel lacks fails
here as it would for an operator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from llmgw.testing.procs import Proc

from .procs import engine_port_range, wait_for

ROOT = Path(__file__).resolve().parent.parent
# A fresh resolve of every dependency: minutes on a slow index, seconds from a cache.
INSTALL_TIMEOUT = 600.0


def _run(
    argv: list[str],
    timeout: float,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{out[-4000:]}"
    return out


def _sources() -> list[str]:
    """The working tree's files as git sees them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # A tracked file deleted in the working tree is listed but not there.
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _clean_env(**extra: str) -> dict[str, str]:
    # The test session runs with the checkout's sources first on PYTHONPATH; the
    # installed program must not see them.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    sources = _sources()
    for name in sources:
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / name).read_bytes())
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(tree)],
        INSTALL_TIMEOUT,
        cwd=tree,
        env=_clean_env(),
    )
    (built,) = dist.glob("llmgw-*-py3-none-any.whl")
    return built


def test_the_wheel_carries_every_source_file_and_the_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    meta = {n for n in names if ".dist-info/" in n}
    # Every file under src/ (modules, generated protobuf code and stubs, migrations,
    # the simulator, dashboard templates and static files, py.typed) and nothing else.
    shipped = {n.removeprefix("src/") for n in _sources() if n.startswith("src/")}
    assert names - meta == shipped
    (license_file,) = (n for n in meta if n.endswith(".dist-info/licenses/LICENSE"))
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(license_file) == (ROOT / "LICENSE").read_bytes()
        metadata = archive.read(next(n for n in meta if n.endswith("/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata


def test_the_wheel_installs_and_serves_the_demo(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    # No pip of its own: this interpreter's pip installs into it (`--python`), which
    # saves bootstrapping one; what lands in the venv is the wheel and its dependencies.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120)
    python = venv / "bin" / "python"

    def install(requirement: str) -> None:
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        _run([*pip, requirement], INSTALL_TIMEOUT, env=_clean_env())

    # The base install first: the library and the data plane, none of the extras.
    install(str(wheel))
    rundir = tmp_path / "run"
    rundir.mkdir()
    where = _run(
        [str(python), "-c", "import llmgw, llmgw_cli; print(llmgw.__file__, llmgw_cli.__file__)"],
        60,
        cwd=rundir,
        env=_clean_env(),
    )
    site = str(venv / "lib")
    assert all(path.startswith(site) for path in where.split()), where
    missing = (
        "import json, llmgw.extras as e; print(json.dumps({x: e.missing(x) for x in e.EXTRAS}))"
    )
    assert json.loads(_run([str(python), "-c", missing], 60, cwd=rundir, env=_clean_env())) == {
        "server": ["quart-trio", "hypercorn", "jinja2"],
        "postgres": ["psycopg"],
        "ctl": ["rich"],
        "profiling": ["pyinstrument"],
        "tracing": ["opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"],
    }
    refused = subprocess.run(
        [str(venv / "bin" / "llmgw-server"), "--demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=rundir,
        env=_clean_env(),
    )
    assert (refused.returncode, refused.stderr) == (
        1,
        "llmgw-server: error: llmgw-server needs quart-trio, hypercorn, jinja2, not "
        "installed: pip install 'llmgw[server]'\n",
    )
    # What the docs tell an operator to install (docs/operations.md).
    install(f"{wheel}[server]")

    base, last = engine_port_range(51)
    ready = rundir / "ready.json"
    monkeypatch.chdir(rundir)  # the server and the engines it starts run from here
    proc = Proc(
        [
            str(venv / "bin" / "llmgw-server"),
            "--demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--agent-listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
        ],
        rundir / "output.log",
        # Proc adds to this process's environment; an empty PYTHONPATH is no path.
        env={"PYTHONPATH": "", "LLMGW_CONTROL__PORT_RANGE": f"[{base}, {last}]"},
    )
    try:
        proc.wait_ready_file(ready, 30)
        client, admin = proc.url("listen"), proc.url("admin_listen")

        def answered() -> dict[str, object] | None:
            r = httpx.post(
                f"{client}/v1/chat/completions",
                json={
                    "model": "chat",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
                timeout=10,
            )
            return dict(r.json()) if r.status_code == 200 else None

        # The demo's engines (llmgw-sim processes of the venv) become ready within
        # seconds; until then the model has no replica.
        reply = wait_for(answered, "a chat completion from the demo", 60, context=proc.output)
        assert reply["model"] == "demo-chat"
        assert reply["usage"]["completion_tokens"] == 3  # type: ignore[index]
        # The dashboard (templates, static files) and the fleet over gRPC (the
        # generated protocol code) from the installed package.
        page = httpx.get(f"{admin}/fleet", timeout=10)
        assert page.status_code == 200 and 'data-node="demo-node"' in page.text
        css = httpx.get(f"{admin}/static/dashboard.css", timeout=10)
        assert css.status_code == 200 and css.text.strip()
        # The demo's store (SQLite, migrated at start) takes a key.
        key = httpx.post(f"{admin}/api/v1/keys", json={"name": "wheel"}, timeout=10)
        assert key.status_code == 201, key.text

        proc.kill(signal.SIGTERM)
        assert proc.popen.wait(60) == 0, proc.output()
        assert "received SIGTERM: draining" in proc.output()
        # Its engines went with it: no process of the venv is left.
        left = subprocess.run(
            ["pgrep", "-f", str(venv)], capture_output=True, text=True, check=False
        )
        assert left.stdout == "", left.stdout
    finally:
        proc.stop()
