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
        "llmgw-sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        *args,
        health=f"{base}/health",
    ) as proc:
        yield proc, base


class Server:
    """A running llmgw-server with its client and admin base URLs."""

    def __init__(self, proc: Proc, base: str, admin: str) -> None:
        self.proc = proc
        self.base = base
        self.admin = admin

    def endpoints(self) -> dict[str, dict[str, object]]:
        data = httpx.get(f"{self.admin}/api/v1/endpoints", timeout=5).json()
        return {e["id"]: e for e in data["endpoints"]}

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include `labels` (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        text = httpx.get(f"{self.admin}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def wait_scraped(self, timeout: float = 10.0) -> None:
        """Wait until every endpoint has been scraped once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(e["engine"] is not None for e in self.endpoints().values()):
                return
            time.sleep(0.05)
        raise TimeoutError(f"endpoints not scraped: {self.endpoints()}")


@contextlib.contextmanager
def server(
    *args: str, config: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """llmgw-server on free loopback ports, optionally with a TOML config text."""
    port, admin_port = free_port(), free_port()
    extra: list[str] = []
    if config is not None:
        path = Path(tempfile.mkdtemp(prefix="llmgw-config-")) / "llmgw.toml"
        path.write_text(config)
        extra = ["--config", str(path)]
    with running(
        "llmgw-server",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin_port}",
        *extra,
        *args,
        health=f"http://127.0.0.1:{admin_port}/healthz",
        env=env,
    ) as proc:
        yield Server(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")


def sim_metric(base: str, name: str) -> float | None:
    """One unlabelled-sum sample from a simulator's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    found = None
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name:
                found = (found or 0.0) + sample.value
    return found


def set_faults(base: str, **faults: object) -> None:
    httpx.post(f"{base}/sim/faults", json=faults, timeout=5).raise_for_status()
