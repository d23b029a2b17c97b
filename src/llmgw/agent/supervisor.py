"""Engine processes: launch, keep the output, wait for health, stop, drain.

Every shard is an engine started through a :class:`~llmgw.agent.launcher.Launcher`
(by default a child process in a session, and so a process group, of its own),
watched by one task of the supervisor's nursery. Rules:

* **Output**: stdout and stderr, merged, go line by line into a ring of the last
  ``tail_lines`` lines (ANSI colours stripped, long lines cut) and, verbatim, to
  ``<state_dir>/logs/<replica>-r<rank>-e<epoch>.log`` (rotated once to ``.1`` past
  ``log_max_bytes``).
* **Ready**: the shard is STARTING until its health URL answers 200 (polled from
  every 20 ms, doubling up to every ``health_interval``), then READY with its
  endpoint URL. A shard without a health URL (a headless rank) is READY once
  launched. The agent sets no start timeout: a
  large model loads for tens of minutes, and the controller owns that deadline.
* **Exit**: a process that exits without being asked to is FAILED, with its exit
  code (negative: killed by that signal), a message naming it, and the output tail,
  so a crash at start is reported with the engine's own error. Whatever is left of
  its process group is then killed, so a dead engine's workers do not hold GPUs.
* **Stop**: SIGTERM to the process group, SIGKILL to the group after ``grace``; a
  second stop with an earlier deadline brings the SIGKILL forward. STOPPED.
* **Drain**: DRAINING; the engine's ``/metrics`` is read every ``drain_interval``
  until it has no running and no waiting request (or the deadline passes), then the
  shard is stopped. A stop during a drain cuts it short. A shard without a metrics
  URL (a headless rank) waits for its deadline or a stop.
* **Shutdown**: when the supervisor is cancelled (the agent stops), every engine is
  stopped as above with ``shutdown_grace``, all at once: no orphans.
* **Adoption**: each running engine is recorded under ``<state_dir>/run`` (pid, the
  process's start time, command line, the StartShard it runs and where it serves).
  An agent that died without stopping its engines (SIGKILL, a crash) leaves them
  serving; the next agent with that state directory finds the records before it
  registers. An engine still there (same pid, start time and command line: not a
  reused pid) that answers its health check within ``ADOPT_WITHIN`` (or has no
  health URL) is *adopted*: supervised again as READY (exit watched through a
  pidfd, output read again from its pipe), so the agent registers with it and the
  server keeps the replica, or stops it like any shard it does not want. Any other
  recorded engine (unhealthy, or a record without its command) is killed, as
  nothing would supervise or report it. An adopted engine's exit status went to
  init: it is reported without one.
* **Replacement**: a shard started for the (replica, rank) of a live shard with an
  older epoch waits until that one is stopped, so the two never share GPUs or ports.

Beside it: the log file (llmgw.agent.engine_log), the records of running engines and
the stopping of orphans (llmgw.agent.records), an adopted engine (llmgw.agent.adopted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llmgw.agent.adapters.base import LaunchSpec
from llmgw.agent.adopted import Adopted
from llmgw.agent.engine_log import EngineLog
from llmgw.agent.launcher import LaunchedEngine, Launcher, ProcessLauncher
from llmgw.agent.records import Found, forget_record, read_records, stop_orphans, write_record
from llmgw.domain.engine_metrics import parse_metrics
from llmgw.domain.fleet import ShardState
from llmgw.transport.messages import ShardStatus, StartShard

__all__ = ["DEFAULT_GRACE", "Key", "Shard", "Supervisor", "shard_name"]

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (replica_id, rank)
DEFAULT_GRACE = 30.0  # seconds between SIGTERM and SIGKILL when nobody said otherwise
LIVE = frozenset({ShardState.STARTING, ShardState.READY, ShardState.DRAINING})
MAX_LINE = 1000  # characters of one output line kept in the tail
FIRST_HEALTH_POLL = 0.02  # seconds after launch of the second health check (see _watch_health)
#: How long an engine left by a previous agent has to answer its health check to be
#: adopted (seconds); one that does not is stopped (a hung engine, or one still loading).
ADOPT_WITHIN = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def shard_name(cmd: StartShard) -> str:
    """A file name for the shard: ``<replica>-r<rank>-e<epoch>``."""
    return f"{_UNSAFE.sub('_', cmd.replica_id)}-r{cmd.rank}-e{cmd.epoch}"


@attrs.define(eq=False)
class _Stop:
    grace: float


@attrs.define(eq=False)
class _Drain:
    deadline: float


@attrs.define(eq=False)
class Shard:
    """One shard as the supervisor tracks it."""

    command: StartShard
    spec: LaunchSpec | None
    status: ShardStatus
    tail: deque[str]
    requests_tx: trio.MemorySendChannel[_Stop | _Drain]
    requests_rx: trio.MemoryReceiveChannel[_Stop | _Drain]
    engine: LaunchedEngine | None = None
    log_path: Path | None = None
    stop_requested: bool = False
    stop_reason: str = ""
    terminating: bool = False
    kill_scope: trio.CancelScope | None = None
    killed: bool = False
    exited: trio.Event = attrs.Factory(trio.Event)
    pump_done: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)

    @property
    def key(self) -> Key:
        return (self.command.replica_id, self.command.rank)

    @property
    def state(self) -> ShardState:
        return self.status.state

    @property
    def live(self) -> bool:
        return self.status.state in LIVE

    @property
    def pid(self) -> int | None:
        return self.engine.pid if self.engine is not None else None


class Supervisor:
    """Runs engine processes for the agent and reports every shard transition through
    `report` (called synchronously; it must not block)."""

    def __init__(
        self,
        state_dir: Path,
        report: Callable[[ShardStatus], None],
        *,
        health_interval: float = 0.5,
        drain_interval: float = 1.0,
        shutdown_grace: float = 15.0,
        tail_lines: int = 200,
        log_max_bytes: int = 64 * 1024 * 1024,
        base_env: dict[str, str] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.report = report
        self.health_interval = health_interval
        self.drain_interval = drain_interval
        self.shutdown_grace = shutdown_grace
        self.tail_lines = tail_lines
        self.log_max_bytes = log_max_bytes
        self.base_env = base_env
        self.launcher: Launcher = launcher or ProcessLauncher()
        self.shards: dict[Key, Shard] = {}
        self.launched = 0  # engines started over the supervisor's life
        self._nursery: trio.Nursery | None = None
        self._http: httpx.AsyncClient | None = None

    # -- running -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise until cancelled; then stop every engine (``shutdown_grace``)."""
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "run").mkdir(parents=True, exist_ok=True)
        async with httpx.AsyncClient(timeout=2.0) as http, trio.open_nursery() as nursery:
            self._http = http
            self._nursery = nursery
            # Before the agent registers: what a previous agent left runs on, or not.
            await self._recover()
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # -- commands ------------------------------------------------------------------------

    def launch(self, cmd: StartShard, spec: LaunchSpec) -> Shard:
        """Start `cmd`'s engine as `spec` says (after a live older epoch of the same
        replica and rank has stopped). Reports STARTING at once."""
        if self._nursery is None:
            raise RuntimeError("the supervisor is not running")
        previous = self.shards.get((cmd.replica_id, cmd.rank))
        if previous is not None and previous.live and previous.command.epoch < cmd.epoch:
            self.stop(previous.key, previous.command.epoch, DEFAULT_GRACE, reason="superseded")
        else:
            previous = None
        shard = self._new(cmd, spec)
        self._set(shard, ShardState.STARTING)
        self._nursery.start_soon(self._run, shard, previous, name=f"shard {shard_name(cmd)}")
        return shard

    def reject(
        self, cmd: StartShard, problems: Iterable[str], *, busy_ports: tuple[int, ...] = ()
    ) -> Shard:
        """Record `cmd` as FAILED without launching anything (the adapter or the node
        refused it): fails in milliseconds instead of after minutes of loading.
        `busy_ports` are the ports another process holds (the server avoids them)."""
        shard = self._new(cmd, None)
        text = "; ".join(problems)
        self._set(shard, ShardState.FAILED, message=f"not started: {text}", busy_ports=busy_ports)
        shard.done.set()
        return shard

    def stop(self, key: Key, epoch: int, grace: float, *, reason: str = "") -> str | None:
        """Ask the shard at `key` of `epoch` to stop; returns why not (None: asked)."""
        shard = self.shards.get(key)
        problem = self._check(shard, epoch)
        if problem is not None or shard is None:
            return problem
        shard.stop_requested = True
        shard.stop_reason = shard.stop_reason or reason
        shard.requests_tx.send_nowait(_Stop(grace))
        return None

    def drain(self, key: Key, epoch: int, deadline: float) -> str | None:
        """Ask the shard at `key` of `epoch` to drain then stop; returns why not."""
        shard = self.shards.get(key)
        problem = self._check(shard, epoch)
        if problem is not None or shard is None:
            return problem
        shard.stop_requested = True
        shard.requests_tx.send_nowait(_Drain(deadline))
        return None

    @staticmethod
    def _check(shard: Shard | None, epoch: int) -> str | None:
        if shard is None:
            return "not running on this node"
        if shard.command.epoch != epoch:
            return f"this node runs epoch {shard.command.epoch}, not {epoch}"
        if not shard.live:
            return f"already {shard.state.value}"
        return None

    # -- what the agent reports ----------------------------------------------------------

    def statuses(self) -> list[ShardStatus]:
        """The latest status of every shard still known (live, or ended but not yet
        carried by a registration or heartbeat)."""
        return [s.status for s in self.shards.values()]

    def live(self) -> list[Shard]:
        return [s for s in self.shards.values() if s.live]

    def delivered(self, statuses: Iterable[ShardStatus]) -> None:
        """A registration or heartbeat carried these: forget the ended shards among
        them (the ones whose latest status this still is)."""
        for status in statuses:
            key = (status.replica_id, status.rank)
            shard = self.shards.get(key)
            if shard is not None and shard.status is status and not shard.live:
                del self.shards[key]

    # -- what a previous agent left --------------------------------------------------

    async def _recover(self) -> None:
        """Adopt the healthy engines a previous agent left running, stop the others (see
        the module docstring). Runs before the agent registers."""
        run_dir = self.state_dir / "run"
        found = read_records(run_dir)
        healthy: dict[int, bool] = {}

        async def check(found_: Found) -> None:
            url = found_.spec.health_url if found_.spec is not None else None
            healthy[found_.pid] = found_.spec is not None and (
                url is None or await self._answers(url, ADOPT_WITHIN)
            )

        async with trio.open_nursery() as nursery:
            for f in found:
                nursery.start_soon(check, f)
        stale: list[Found] = []
        for f in found:
            if f.command is None or f.spec is None or not healthy.get(f.pid):
                stale.append(f)
                continue
            if (f.command.replica_id, f.command.rank) in self.shards:
                stale.append(f)  # two records of one shard: keep the first
                continue
            try:
                engine = Adopted.open(f.pid, f.start, f.spec)
            except OSError as exc:  # no pidfds here: it cannot be watched, so not kept
                log.warning("cannot watch engine pid %d: %s", f.pid, exc)
                stale.append(f)
                continue
            if engine is None:  # gone meanwhile
                f.record.unlink(missing_ok=True)
                continue
            log.warning(
                "adopting engine pid %d of %s left running by a previous agent",
                f.pid,
                shard_name(f.command),
            )
            self._adopt(f.command, engine)
        await stop_orphans(stale)

    def _adopt(self, cmd: StartShard, engine: LaunchedEngine) -> None:
        assert self._nursery is not None
        shard = self._new(cmd, engine.spec)
        shard.engine = engine
        shard.log_path = self.state_dir / "logs" / f"{shard_name(cmd)}.log"
        self._set(shard, ShardState.READY, message="adopted from a previous agent")
        self._nursery.start_soon(self._run, shard, None, name=f"shard {shard_name(cmd)}")

    async def _answers(self, url: str, within: float) -> bool:
        """Whether `url` answers 200 within `within` seconds (polled as _watch_health)."""
        assert self._http is not None
        pause = FIRST_HEALTH_POLL
        with trio.move_on_after(within):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await self._http.get(url)).status_code == 200:
                        return True
                await trio.sleep(pause)
                pause = min(2 * pause, self.health_interval)
        return False

    # -- internals -----------------------------------------------------------------------

    def _new(self, cmd: StartShard, spec: LaunchSpec | None) -> Shard:
        send, receive = trio.open_memory_channel[_Stop | _Drain](16)
        shard = Shard(
            command=cmd,
            spec=spec,
            status=_status(cmd, ShardState.STARTING),
            tail=deque(maxlen=self.tail_lines),
            requests_tx=send,
            requests_rx=receive,
        )
        self.shards[shard.key] = shard
        return shard

    def _set(self, shard: Shard, state: ShardState, **extra: Any) -> None:
        if state is ShardState.FAILED:
            extra.setdefault("output_tail", tuple(shard.tail))
        if state in (ShardState.READY, ShardState.DRAINING) and shard.spec is not None:
            extra.setdefault("endpoint_url", shard.spec.endpoint_url)
            if shard.spec.endpoint_url is not None:
                extra.setdefault("capacity", shard.spec.capacity)
        shard.status = _status(shard.command, state, pid=shard.pid, **extra)
        log.info(
            "shard %s: %s%s",
            shard_name(shard.command),
            state.value,
            f" ({shard.status.message})" if shard.status.message else "",
        )
        self.report(shard.status)

    async def _run(self, shard: Shard, previous: Shard | None) -> None:
        try:
            if previous is not None:
                await previous.done.wait()
            if shard.engine is not None:  # adopted: running already (a stop is queued)
                await self._supervise_adopted(shard, shard.engine)
                return
            if shard.stop_requested:
                self._set(shard, ShardState.STOPPED, message="stopped before it was launched")
                return
            await self._supervise(shard)
        finally:
            with trio.CancelScope(shield=True):
                await self._shutdown(shard)

    async def _shutdown(self, shard: Shard) -> None:
        """The shard's task is over (or cancelled): the engine must not outlive it."""
        engine = shard.engine
        if engine is not None and engine.returncode is None:
            shard.stop_requested = True
            shard.stop_reason = shard.stop_reason or "the agent is shutting down"
            engine.signal(signal.SIGTERM)
            with trio.move_on_after(self.shutdown_grace) as waited:
                await engine.wait()
            if waited.cancelled_caught:
                engine.signal(signal.SIGKILL)
                shard.killed = True
                await engine.wait()
        if engine is not None:
            engine.signal(signal.SIGKILL)  # whatever of its group is left
            forget_record(self.state_dir / "run", shard_name(shard.command))
        if shard.live:  # cancelled before it could say how it ended
            shard.stop_reason = shard.stop_reason or "the agent is shutting down"
            self._set(
                shard,
                ShardState.STOPPED,
                message=self._stopped_message(shard),
                exit_code=engine.returncode if engine is not None else None,
            )
        shard.done.set()

    async def _supervise(self, shard: Shard) -> None:
        spec = shard.spec
        assert spec is not None
        name = shard_name(shard.command)
        shard.log_path = self.state_dir / "logs" / f"{name}.log"
        env = dict(os.environ if self.base_env is None else self.base_env)
        env.update(spec.env)
        logf = await EngineLog.open(shard.log_path, self.log_max_bytes)
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            await logf.write(f"--- {stamp} llmgw-agent: {shlex.join(spec.argv)}\n".encode())
            try:
                engine = await self.launcher.launch(spec, env)
            except OSError as exc:
                self._set(
                    shard,
                    ShardState.FAILED,
                    message=f"cannot start {spec.argv[0]}: {exc.strerror or exc}",
                )
                return
            self.launched += 1
            shard.engine = engine
            # Where it serves: what the health check, drain and READY status use.
            shard.spec = spec = engine.spec
            if engine.pid is not None:
                write_record(self.state_dir / "run", name, engine.pid, shard.command, spec)
            self._set(shard, ShardState.STARTING)  # now with its pid
            await self._watch(shard, engine, logf)
        finally:
            with trio.CancelScope(shield=True):
                await logf.aclose()
        self._ended(shard, engine.returncode)

    async def _supervise_adopted(self, shard: Shard, engine: LaunchedEngine) -> None:
        """An engine a previous agent left, adopted READY (see the module docstring)."""
        assert shard.log_path is not None
        logf = await EngineLog.open(shard.log_path, self.log_max_bytes)
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            await logf.write(f"--- {stamp} llmgw-agent: adopted pid {engine.pid}\n".encode())
            await self._watch(shard, engine, logf)
        finally:
            with trio.CancelScope(shield=True):
                await logf.aclose()
        self._ended(shard, engine.returncode)

    async def _watch(self, shard: Shard, engine: LaunchedEngine, logf: EngineLog) -> None:
        """Until the engine exits: its output, its health (while STARTING), requests."""
        assert shard.spec is not None
        health_url = shard.spec.health_url
        async with trio.open_nursery() as outer:
            outer.start_soon(self._pump, shard, engine.output, logf)
            async with trio.open_nursery() as inner:
                inner.start_soon(self._control, shard)
                if shard.state is ShardState.STARTING:
                    if health_url is not None:
                        inner.start_soon(self._watch_health, shard, health_url)
                    else:
                        self._set(shard, ShardState.READY)
                await engine.wait()
                shard.exited.set()
                inner.cancel_scope.cancel()
            # Workers the engine forked may live on (and hold GPUs and our pipe).
            engine.signal(signal.SIGKILL)
            with trio.move_on_after(2.0):
                await shard.pump_done.wait()
            outer.cancel_scope.cancel()

    def _ended(self, shard: Shard, code: int | None) -> None:
        if shard.stop_requested:
            message = self._stopped_message(shard)
            self._set(shard, ShardState.STOPPED, message=message, exit_code=code)
        else:
            when = "before it was ready" if shard.state is ShardState.STARTING else "unexpectedly"
            self._set(
                shard,
                ShardState.FAILED,
                message=f"{_describe_exit(code)} {when}{_last_line(shard.tail)}",
                exit_code=code,
            )

    @staticmethod
    def _stopped_message(shard: Shard) -> str:
        message = shard.stop_reason or "stopped"
        if shard.killed:
            message += "; killed (did not exit within its grace period after SIGTERM)"
        return message

    async def _pump(self, shard: Shard, stream: trio.abc.ReceiveStream, logf: EngineLog) -> None:
        """Engine output -> the tail and the log file."""
        partial = b""
        try:
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                if not chunk:
                    break
                await logf.write(chunk)
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > 4 * MAX_LINE:  # a line without end: keep what fits
                    lines.append(partial)
                    partial = b""
                for line in lines:
                    self._keep(shard, line)
            if partial:
                self._keep(shard, partial)
        finally:
            shard.pump_done.set()

    @staticmethod
    def _keep(shard: Shard, raw: bytes) -> None:
        text = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\r")
        # A progress bar redraws with \r: keep only its last state.
        text = text.rsplit("\r", 1)[-1]
        if len(text) > MAX_LINE:
            text = text[:MAX_LINE] + "..."
        shard.tail.append(text)

    async def _watch_health(self, shard: Shard, url: str) -> None:
        assert self._http is not None
        # From FIRST_HEALTH_POLL, doubling up to health_interval: an engine that loads
        # in 60 ms (a small GGUF) is seen ready then, not a whole interval later (a
        # cold start's requests wait for it), and a 20-minute load is still polled only
        # every health_interval.
        pause = min(FIRST_HEALTH_POLL, self.health_interval)
        while shard.state is ShardState.STARTING:
            with contextlib.suppress(httpx.HTTPError):
                response = await self._http.get(url)
                if response.status_code == 200:
                    if shard.state is ShardState.STARTING and not shard.terminating:
                        self._set(shard, ShardState.READY)
                    return
            await trio.sleep(pause)
            pause = min(2 * pause, self.health_interval)

    async def _control(self, shard: Shard) -> None:
        """Carries out stop and drain requests until the process exits."""
        drain_scope: trio.CancelScope | None = None
        async with trio.open_nursery() as nursery:
            async for request in shard.requests_rx:
                if isinstance(request, _Stop):
                    if drain_scope is not None:
                        drain_scope.cancel()
                    nursery.start_soon(self._terminate, shard, request.grace)
                elif shard.terminating or drain_scope is not None:
                    continue  # already on its way out
                elif shard.state is ShardState.READY:
                    drain_scope = trio.CancelScope()
                    nursery.start_soon(self._drain, shard, request.deadline, drain_scope)
                else:  # not serving yet: nothing in flight to wait for
                    shard.stop_reason = shard.stop_reason or "drained (it was not serving yet)"
                    nursery.start_soon(self._terminate, shard, DEFAULT_GRACE)

    async def _terminate(self, shard: Shard, grace: float) -> None:
        engine = shard.engine
        assert engine is not None
        deadline = trio.current_time() + grace
        if shard.terminating:
            if shard.kill_scope is not None:  # an earlier SIGKILL, if asked
                shard.kill_scope.deadline = min(shard.kill_scope.deadline, deadline)
            return
        shard.terminating = True
        shard.stop_reason = shard.stop_reason or "stopped"
        engine.signal(signal.SIGTERM)
        with trio.move_on_at(deadline) as scope:
            shard.kill_scope = scope
            await shard.exited.wait()
        if not shard.exited.is_set():
            shard.killed = True
            engine.signal(signal.SIGKILL)

    async def _drain(self, shard: Shard, deadline: float, scope: trio.CancelScope) -> None:
        assert shard.spec is not None
        url = shard.spec.metrics_url
        with scope:
            self._set(shard, ShardState.DRAINING)
            reason = f"drain deadline ({deadline:g}s) passed with requests in flight"
            with trio.move_on_after(deadline):
                while True:
                    if url is not None and self._http is not None:
                        with contextlib.suppress(httpx.HTTPError):
                            response = await self._http.get(url)
                            sample = parse_metrics(response.content)
                            if (
                                sample.running is not None
                                and sample.waiting is not None
                                and sample.running + sample.waiting == 0
                            ):
                                reason = "drained"
                                break
                    await trio.sleep(self.drain_interval)
            if url is None:
                reason = f"drain deadline ({deadline:g}s) passed"
        if scope.cancelled_caught:
            return  # a stop cut the drain short; it terminates the engine
        shard.stop_reason = reason
        await self._terminate(shard, DEFAULT_GRACE)


def _status(cmd: StartShard, state: ShardState, **extra: Any) -> ShardStatus:
    return ShardStatus(
        replica_id=cmd.replica_id,
        rank=cmd.rank,
        epoch=cmd.epoch,
        state=state,
        model=cmd.model,
        profile=cmd.profile.name,
        node_count=cmd.node_count,
        gpu_indices=cmd.gpu_indices,
        port=cmd.port,
        # The distributed-init port lives on rank 0's node (ShardAssignment.dist_port).
        dist_port=cmd.master_port if cmd.node_count > 1 and cmd.rank == 0 else None,
        **extra,
    )


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def _last_line(tail: Iterable[str]) -> str:
    lines = [line for line in tail if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""
