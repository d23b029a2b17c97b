"""Programs run as real processes on loopback, for tests and benchmarks.

Each program runs in its own process group with its output in a log file, so it can
be stopped as a whole (an engine it started goes with it), and a failure to come up
reports what the program printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

__all__ = ["LOOPBACK", "Proc", "free_port"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class Proc:
    """One started program, its output in a log file, in its own process group."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log = log
        self._logf = log.open("wb")
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            # Own group: stopping it reaches its children too, and a Ctrl-C in a
            # terminal reaches only the script, which then stops its children in order.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self, tail: int | None = None) -> str:
        """What the program printed so far (its last `tail` characters)."""
        self._logf.flush()
        text = self.log.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        """Wait until `url` answers 200, or fail with the program's output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited with {self.popen.returncode}:\n{self.output(4000)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{url} not up after {timeout:g}s:\n{self.output(4000)}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group, if the program still runs."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM to the process group, SIGKILL after `timeout`; the exit code."""
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait()
        self._logf.close()
        return self.popen.returncode
