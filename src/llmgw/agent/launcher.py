"""Where the supervisor starts and ends an engine: the :class:`Launcher` seam.

The supervisor (:mod:`llmgw.agent.supervisor`) decides everything about a shard: when
it starts, what its output and health say, how it is stopped, drained, reported.
Only the engine itself comes through a :class:`Launcher`: started from a
:class:`LaunchSpec`, waited for, signalled, its output read. The agent uses
:class:`ProcessLauncher`, an OS process per engine. The seam exists so that tests
and embedders can run engines in their own process instead
(:mod:`llmgw.testing.launcher` runs the simulator in the caller's trio run) and still
exercise the real agent and supervisor around them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Protocol

import trio

from llmgw.agent.adapters.base import LaunchSpec

__all__ = ["LaunchedEngine", "Launcher", "ProcessLauncher", "signal_group"]


class LaunchedEngine(Protocol):
    """One started engine, as the supervisor watches and ends it."""

    @property
    def spec(self) -> LaunchSpec:
        """The spec it runs as: its URLs are where it actually serves (an in-process
        engine may have had to take another port than the one asked for)."""
        ...

    @property
    def pid(self) -> int | None:
        """Its process id, recorded so that a restarted agent can find it as an orphan;
        None when it is no process of its own (nothing to record or adopt)."""
        ...

    @property
    def output(self) -> trio.abc.ReceiveStream:
        """Its stdout and stderr, merged; at its end once it exits."""
        ...

    @property
    def returncode(self) -> int | None:
        """None while it runs; then its exit code (negative: killed by that signal),
        or still None when that is unknown (an engine adopted from a previous agent:
        its exit status goes to its parent, which is not this agent)."""
        ...

    async def wait(self) -> int | None:
        """Until it exits; its return code (None: unknown, as for `returncode`)."""
        ...

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to it and everything it started (SIGTERM: stop gracefully, SIGKILL:
        at once). One already gone is fine: this is also how what it left is ended."""
        ...


class Launcher(Protocol):
    """Starts engines for the supervisor."""

    async def launch(self, spec: LaunchSpec, env: Mapping[str, str]) -> LaunchedEngine:
        """Start `spec`'s engine with `env` as its whole environment; OSError when it
        cannot be started at all (an engine that starts and fails exits instead)."""
        ...


class ProcessLauncher:
    """Each engine a child process in a session (and so a process group) of its own,
    so that signals reach the workers it forks too."""

    async def launch(self, spec: LaunchSpec, env: Mapping[str, str]) -> LaunchedEngine:
        process = await trio.lowlevel.open_process(
            list(spec.argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SIGPIPE stays ignored (as in this Python process): an engine that outlives
            # its agent (killed; the next one adopts it) writes into a pipe nobody reads
            # for a while, which must cost it that output, not its life.
            restore_signals=False,
        )
        return _Process(spec, process)


class _Process:
    def __init__(self, spec: LaunchSpec, process: trio.Process) -> None:
        assert process.stdout is not None
        self.spec = spec
        self._process = process
        self.output = process.stdout

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def signal(self, sig: signal.Signals) -> None:
        signal_group(self._process.pid, sig)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; a group that is gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
