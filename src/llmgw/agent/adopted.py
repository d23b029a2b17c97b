"""An engine adopted from a previous agent (llmgw.agent.supervisor, "Adoption"):
watched through a pidfd, its output read again from its pipe."""

from __future__ import annotations

import contextlib
import os
import signal
import stat

import trio

from llmgw.agent.adapters.base import LaunchSpec
from llmgw.agent.launcher import signal_group
from llmgw.agent.records import start_time

__all__ = ["Adopted"]


class _NoOutput(trio.abc.ReceiveStream):
    """The output of an adopted engine whose pipe could not be opened again."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class Adopted:
    """A :class:`~llmgw.agent.launcher.LaunchedEngine` a previous agent started: not
    our child, so its exit is watched through a pidfd (which names that process, not
    a later one given its pid) and its exit status is unknown (None)."""

    def __init__(self, pid: int, pidfd: int, spec: LaunchSpec, output: trio.abc.ReceiveStream):
        self.pid = pid
        self.spec = spec
        self.output = output
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._gone = False

    @classmethod
    def open(cls, pid: int, start: int | None, spec: LaunchSpec) -> Adopted | None:
        """The engine `pid` as recorded (`start`), or None when it is gone. OSError
        when this system cannot watch a process that is not its child (no pidfds)."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            raise OSError("this system has no pidfd_open")
        try:
            pidfd = pidfd_open(pid)
        except ProcessLookupError:
            return None
        if start is not None and start_time(pid) != start:
            os.close(pidfd)  # exited and its pid reused since the records were read
            return None
        return cls(pid, pidfd, spec, _reopen_output(pid))

    async def wait(self) -> int | None:
        if not self._gone:
            try:
                await trio.lowlevel.wait_readable(self._pidfd)  # readable: it exited
            finally:
                if not self._gone:
                    with contextlib.suppress(OSError):
                        os.close(self._pidfd)
                    self._gone = True
        return None

    def signal(self, sig: signal.Signals) -> None:
        signal_group(self.pid, sig)


def _reopen_output(pid: int) -> trio.abc.ReceiveStream:
    """A new read end of the pipe the engine writes its output to (the previous agent
    held the old one), so its output reaches the tail and the log again."""
    path = f"/proc/{pid}/fd/1"
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return _NoOutput()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _NoOutput()
    return trio.lowlevel.FdStream(fd)
