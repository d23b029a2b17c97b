"""Programs run as real processes on loopback, for tests and benchmarks.

Each program runs in its own process group with its output in a log file, so it can
be stopped as a whole (an engine it started goes with it), and a failure to come up
reports what the program printed.

Ports are never probed and handed over (another process can take a port between the
probe's close and the program's bind): llmgw's programs listen on port 0 and name the
port they got in their ``--ready-file`` (:meth:`Proc.wait_ready_file`); a port that
must be chosen before a program starts (an engine port the control plane assigns, a
server restarted in place, a port where nothing listens) is held by
:func:`reserve_port` for as long as it is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = ["LOOPBACK", "Proc", "reserve_port"]

LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def reserve_port(host: str = LOOPBACK) -> Iterator[int]:
    """A TCP port on `host` that nothing else is given while the block runs.

    For a port that must be named before a program starts. A socket stays bound to it
    with SO_REUSEADDR but does not listen. On Linux the kernel then never picks the
    port for anyone's port-0 bind or outgoing connection, and connecting to it is
    refused (nothing listens), while a program that binds it by number with
    SO_REUSEADDR, as llmgw's listeners (trio's and gRPC's), llmgw-sim and most servers
    do, can still listen on it, and bind it again after a restart. (A program binding
    without SO_REUSEADDR gets EADDRINUSE.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])


class Proc:
    """One started program, its output in a log file, in its own process group."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log = log
        #: What the program wrote to its ready file, once :meth:`wait_ready_file` saw it.
        self.ready: dict[str, Any] = {}
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

    def wait_ready_file(self, path: Path, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the program has written `path` (its ``--ready-file``: every
        listener bound) and return what it says, e.g. ``{"listen": ["127.0.0.1:41234"]}``
        (kept as :attr:`ready`); or fail with the program's output."""
        deadline = time.monotonic() + timeout
        while True:
            # Written by a rename: the file is complete once it exists.
            with contextlib.suppress(FileNotFoundError):
                self.ready = dict(json.loads(path.read_text()))
                return self.ready
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited with {self.popen.returncode}:\n{self.output(4000)}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self.argv[0]} wrote no {path} in {timeout:g}s:\n{self.output(4000)}"
                )
            time.sleep(0.02)

    def url(self, listener: str = "listen") -> str:
        """``http://HOST:PORT`` of the first address of `listener` in :attr:`ready`."""
        return f"http://{self.ready[listener][0]}"

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
