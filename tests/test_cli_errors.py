"""Every CLI, as a real process, meets a port in use, a missing file or a bad address
with one line on stderr naming it, no traceback, and the exit code of DESIGN §9: 1 for
what goes wrong while running (a port taken, an address this host cannot bind, a host
that does not resolve), 2 for what the command line got wrong (a file it names that is
not there, an address that is not one)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import BIN

# TEST-NET-1 (RFC 5737): never an address of this host, so binding it always fails.
FOREIGN = "192.0.2.1"
ENDPOINT = ("--endpoint", "e=http://127.0.0.1:9=m")
LOOPBACK_ANY = ("--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")


def run(program: str, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `program` to its end (each case here fails before it would serve)."""
    done = subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        # The tree under test (PYTHONPATH), no proxy or color settings of the caller's.
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd or "/nonexistent")}
        | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    )
    return done.returncode, done.stdout, done.stderr


def one_line(program: str, code: int, *args: str, cwd: Path | None = None) -> str:
    """The one error line of a run that must exit `code`, without ``PROG: error: ``
    (``PROG SUBCOMMAND: error: `` for a subcommand's usage error)."""
    got, out, err = run(program, *args, cwd=cwd)
    assert "Traceback" not in err and "Exception" not in err, err
    assert got == code, (got, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    prog, sep, line = err.removesuffix("\n").partition(": error: ")
    assert sep and prog.split()[0] == program, err
    return line


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another socket listens on for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def closed() -> Iterator[int]:
    """A loopback port that is bound but not listening: a connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# -- llmgw-server --------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--listen", "--admin-listen"])
def test_server_port_in_use(taken: int, flag: str, tmp_path: Path) -> None:
    other = "--admin-listen" if flag == "--listen" else "--listen"
    line = one_line(
        "llmgw-server", 1, *ENDPOINT, flag, f"127.0.0.1:{taken}", other, "127.0.0.1:0",
        cwd=tmp_path,
    )  # fmt: skip
    assert line == f"cannot listen on 127.0.0.1:{taken}: address already in use"


def test_server_agent_port_in_use(taken: int, tmp_path: Path) -> None:
    """The control plane's gRPC listener: grpc alone says "Failed to bind" and its C core
    logs a second line of its own."""
    config = tmp_path / "llmgw.toml"
    config.write_text(
        f'agent_listen = "127.0.0.1:{taken}"\n[store]\nurl = ""\n'
        '[[models]]\nname = "m"\n[[models.profiles]]\nname = "p"\nengine = "sim"\n'
        'weights = "sim"\n'
    )
    line = one_line("llmgw-server", 1, "--config", str(config), *LOOPBACK_ANY, cwd=tmp_path)
    assert line == f"cannot listen on 127.0.0.1:{taken}: address already in use"


def test_server_demo_port_in_use(taken: int, tmp_path: Path) -> None:
    line = one_line(
        "llmgw-server", 1, "--demo", "--listen", f"127.0.0.1:{taken}", "--admin-listen",
        "127.0.0.1:0", "--agent-listen", "127.0.0.1:0", cwd=tmp_path,
    )  # fmt: skip
    assert line == f"cannot listen on 127.0.0.1:{taken}: address already in use"


def test_server_address_it_cannot_bind(tmp_path: Path) -> None:
    line = one_line(
        "llmgw-server", 1, *ENDPOINT, "--listen", f"{FOREIGN}:8080", "--admin-listen",
        "127.0.0.1:0", cwd=tmp_path,
    )  # fmt: skip
    assert line == f"cannot listen on {FOREIGN}:8080: cannot assign requested address"


def test_server_missing_files_and_malformed_addresses(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    line = one_line("llmgw-server", 2, "--config", str(missing), cwd=tmp_path)
    assert line == f"config file {missing}: not found"
    ready = tmp_path / "no-dir" / "ready.json"
    line = one_line(
        "llmgw-server", 1, *ENDPOINT, *LOOPBACK_ANY, "--ready-file", str(ready), cwd=tmp_path
    )  # exit 1 as when writing it fails, only before serving: no log lines first
    assert line == f"cannot write the ready file {ready}: no directory {ready.parent}"
    line = one_line("llmgw-server", 2, *ENDPOINT, "--listen", "8080", cwd=tmp_path)
    assert line == "listen: expected HOST:PORT or :PORT, got '8080'"


# -- llmgw-sim -----------------------------------------------------------------------------


def test_sim_port_in_use_and_bad_addresses(taken: int, tmp_path: Path) -> None:
    line = one_line("llmgw-sim", 1, "--port", str(taken))
    assert line == f"cannot listen on 127.0.0.1:{taken}: address already in use"
    line = one_line("llmgw-sim", 1, "--host", FOREIGN, "--port", "0")
    assert line == f"cannot listen on {FOREIGN}:0: cannot assign requested address"
    ready = tmp_path / "no-dir" / "ready.json"
    line = one_line("llmgw-sim", 1, "--port", "0", "--ready-file", str(ready))
    assert line == f"cannot write the ready file {ready}: no directory {ready.parent}"


# -- llmgw-agent ---------------------------------------------------------------------------


def test_agent_missing_file_and_bad_server_address(tmp_path: Path) -> None:
    missing = tmp_path / "agent.toml"
    line = one_line("llmgw-agent", 2, "--config", str(missing))
    assert line == f"config file {missing}: not found"
    line = one_line("llmgw-agent", 2, "--server", "7443")
    assert line == "--server: expected HOST:PORT or :PORT, got '7443'"
    state = str(tmp_path / "state")
    # .invalid never resolves (RFC 6761); a resolver that is down fails too, as one line.
    line = one_line("llmgw-agent", 1, "--server", "nohost.invalid:7443", "--state-dir", state)
    assert line.startswith("cannot resolve the server's host 'nohost.invalid': "), line


# -- llmgw-ctl -----------------------------------------------------------------------------


def test_ctl_missing_file_and_bad_addresses(closed: int, tmp_path: Path) -> None:
    admin = f"http://127.0.0.1:{closed}"
    line = one_line("llmgw-ctl", 1, "--admin", admin, "keys")
    assert line == f"cannot reach admin API at {admin}: connection refused"
    missing = tmp_path / "entry.toml"
    line = one_line("llmgw-ctl", 2, "--admin", admin, "models", "add", str(missing))
    assert line == f"cannot read {missing}: no such file or directory"
    line = one_line("llmgw-ctl", 2, "--admin", "127.0.0.1:9090", "keys")
    assert line == "invalid --admin URL '127.0.0.1:9090': use http:// or https://"
    # bench checks its --url before sending anything (it reported each failed request).
    line = one_line("llmgw-ctl", 2, "bench", "--url", "127.0.0.1:8080", "--model", "m")
    assert line.startswith("argument --url: invalid URL '127.0.0.1:8080': use http://"), line
