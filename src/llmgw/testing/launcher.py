"""A :class:`~llmgw.agent.launcher.Launcher` that runs ``llmgw-sim`` in the caller's trio
run, for tests and harnesses (:mod:`llmgw.testing`).

The real agent and supervisor run around it: they build the simulator's command line
through its adapter, health-check it, drain it through its ``/metrics`` and stop it with
SIGTERM, SIGKILL after the grace period. Only the process is missing. So:

* The command line is read with ``llmgw-sim``'s own parser: an engine runs as its
  argv says (``--personality``, ``--max-num-seqs``, ``--sleep-mode``, ...), and argv
  it refuses exits with status 2 and the error in the output, as the program would.
  Anything but the simulator cannot be started (OSError).
* It listens on the port the command names if it can, else on a port the kernel
  picks (port 0: tests share the machine, and nothing else can take a port between
  choosing and binding it); the engine's URLs then name the port it got. So
  :meth:`InProcessLauncher.launch` returns once it listens (after any
  ``--startup-delay``).
* SIGTERM (or SIGINT) shuts it down as the program does on that signal, and it exits
  0; SIGKILL cancels it at once (exit -9). It leaves the process's signals alone.
* Its output is the line the program prints when it listens, and the traceback when
  it fails; it has no pid (nothing to record or adopt) and ignores the environment
  (its logs go to this process's logging).
* ``--fault-exit-after`` (or ``exit_after`` through ``/sim/faults``) would end this
  whole process, as it ends the program's: do not use it in-process.
"""

from __future__ import annotations

import argparse
import errno
import signal
import traceback
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import PurePath

import attrs
import trio
import trio.testing

from llmgw.agent.adapters.base import LaunchSpec, base_url
from llmgw.agent.launcher import LaunchedEngine
from llmgw.sim.config import SimConfig
from llmgw.sim.server import describe
from llmgw.sim.server import serve as serve_sim
from llmgw_cli._common import EXIT_RUNTIME, EXIT_USAGE, find_error, os_error_line
from llmgw_cli.sim import PROG, build_parser, config_from_args

__all__ = ["InProcessLauncher"]


class InProcessLauncher:
    """Runs simulator engines as tasks of :meth:`run` (start it before the agent that
    launches through it; cancelling it kills what still runs)."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def launch(self, spec: LaunchSpec, env: Mapping[str, str]) -> LaunchedEngine:
        if self._nursery is None:
            raise RuntimeError("the in-process launcher is not running")
        args = _sim_args(spec.argv)
        if args is None:
            raise OSError(errno.ENOEXEC, f"only {PROG} runs in-process")
        engine = _SimEngine(spec)
        try:
            config, startup_delay = _parse(args)
        except (argparse.ArgumentError, ValueError) as exc:
            engine.say(f"{PROG}: error: {exc}")
            engine.exited(EXIT_USAGE)
            return engine
        await self._nursery.start(engine.run, config, startup_delay)
        return engine


def _sim_args(argv: Sequence[str]) -> list[str] | None:
    """The simulator's arguments in `argv` (as the sim adapter runs it, or as the
    ``llmgw-sim`` program); None when it runs something else."""
    if list(argv[1:3]) == ["-m", "llmgw_cli.sim"]:
        return list(argv[3:])
    if argv and PurePath(argv[0]).name == PROG:
        return list(argv[1:])
    return None


def _parse(args: list[str]) -> tuple[SimConfig, float]:
    parser = build_parser()
    parser.exit_on_error = False  # an error is the engine's exit, not this process's
    parsed, extra = parser.parse_known_args(args)
    if extra:
        raise ValueError(f"unrecognized arguments: {' '.join(extra)}")
    return config_from_args(parsed), parsed.startup_delay


class _SimEngine:
    """One simulator, as the supervisor sees an engine process."""

    pid = None

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.output = trio.testing.MemoryReceiveStream()
        self.returncode: int | None = None
        self._done = trio.Event()
        self._shutdown = trio.Event()  # SIGTERM: the program's graceful shutdown
        self._kill = trio.CancelScope()  # SIGKILL

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def signal(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._shutdown.set()
        elif sig == signal.SIGKILL:
            self._kill.cancel()

    def say(self, text: str) -> None:
        self.output.put_data(f"{text}\n".encode())

    def exited(self, code: int) -> None:
        self.returncode = code
        self.output.put_eof()
        self._done.set()

    async def run(
        self, config: SimConfig, startup_delay: float, *, task_status: trio.TaskStatus[None]
    ) -> None:
        code = -signal.SIGKILL  # unless it ends by itself: cancelled is killed
        try:
            with self._kill:
                # As the program: a loading engine binds its port only once loaded.
                await trio.sleep(startup_delay)
                code = await self._serve(config, task_status)
        finally:
            self.exited(code)

    async def _serve(self, config: SimConfig, task_status: trio.TaskStatus[None]) -> int:
        """Serve until shut down; its exit code. Reports started once it listens, or
        once it has failed to."""
        started = False
        for port in (config.port, 0):
            try:
                async with trio.open_nursery() as nursery:
                    urls = await nursery.start(
                        partial(serve_sim, shutdown=self._shutdown), attrs.evolve(config, port=port)
                    )
                    self.say(describe(config, urls))
                    self.spec = _moved(self.spec, base_url(config.host, config.port), urls[0])
                    started = True
                    task_status.started()
                return 0
            except Exception as exc:
                error = find_error(exc, OSError)
                if not started and error is not None and error.errno == errno.EADDRINUSE and port:
                    continue  # taken (by another test, say): any free port will do
                if started or error is None:
                    self.say("".join(traceback.format_exception(exc)).rstrip())
                    code = 1
                else:
                    where = f"{config.host}:{port}"
                    self.say(f"{PROG}: error: {os_error_line(error, f'cannot listen on {where}')}")
                    code = EXIT_RUNTIME
                if not started:
                    task_status.started()  # it ran, and failed: the supervisor reports that
                return code
        raise AssertionError("unreachable: port 0 is never in use")


def _moved(spec: LaunchSpec, asked: str, got: str) -> LaunchSpec:
    """`spec` with the URLs under `asked` (scheme, host and port) moved to `got`."""
    if asked == got:
        return spec

    def move(url: str | None) -> str | None:
        return got + url.removeprefix(asked) if url and url.startswith(asked) else url

    return attrs.evolve(
        spec,
        health_url=move(spec.health_url),
        endpoint_url=move(spec.endpoint_url),
        metrics_url=move(spec.metrics_url),
    )
