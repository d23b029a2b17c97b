"""Start llmgw's command-line programs as real processes on loopback for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A running command with its output captured to a file."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log = log
        self._logf = log.open("wb")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._logf.flush()
        return self.log.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        """Wait until `url` answers 200, or fail with the process's output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited with {self.popen.returncode}:\n{self.output()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{url} not up after {timeout}s:\n{self.output()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait()
        self._logf.close()
        return self.popen.returncode


@contextlib.contextmanager
def running(
    program: str,
    *args: str,
    health: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> Iterator[Proc]:
    """Run `program` (an installed console script) until the block ends."""
    logdir = Path(tempfile.mkdtemp(prefix=f"{program}-"))
    proc = Proc([str(BIN / program), *args], logdir / "output.log", env)
    try:
        if health is not None:
            proc.wait_http(health, timeout)
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def sim(*args: str, model: str = "sim-model") -> Iterator[tuple[Proc, str]]:
    """A simulator on a free loopback port; yields the process and its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running(
        "llmgw-sim", "--host", "127.0.0.1", "--port", str(port), "--model", model, *args,
        health=f"{base}/health",
    ) as proc:
        yield proc, base
