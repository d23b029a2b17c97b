"""The records of running engines under ``<state_dir>/run``: what adopting an engine
a previous agent left running takes (llmgw.agent.supervisor, "Adoption"), reading them
back (only a process still running the recorded command counts), and stopping the
engines nobody will supervise."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import trio
from google.protobuf.message import DecodeError

from llmgw.agent.adapters.base import LaunchSpec
from llmgw.agent.launcher import signal_group
from llmgw.transport.convert import (
    ConversionError,
    server_message_from_proto,
    server_message_to_proto,
)
from llmgw.transport.messages import StartShard
from llmgw.transport.pb import agent_pb2 as pb

__all__ = [
    "Found",
    "alive",
    "forget_record",
    "read_records",
    "start_time",
    "stop_orphans",
    "sweep_orphans",
    "write_record",
]

# The supervisor's logger: these lines are its story of an engine.
log = logging.getLogger("llmgw.agent.supervisor")


@attrs.frozen
class Found:
    """A recorded engine whose process still runs the recorded command."""

    record: Path
    pid: int
    start: int | None  # the process's start time (clock ticks after boot)
    command: StartShard | None  # None: a record too old or damaged to adopt from
    spec: LaunchSpec | None


def write_record(run_dir: Path, name: str, pid: int, cmd: StartShard, spec: LaunchSpec) -> None:
    """What adopting the engine takes (llmgw.agent.supervisor, "Adoption"); readable by the agent's
    user only, as the command carries the profile's environment (an API key)."""
    data: dict[str, Any] = {"pid": pid, "start": start_time(pid), "argv": list(spec.argv)}
    try:
        wire = server_message_to_proto(cmd).SerializeToString()
    except ConversionError as exc:  # then it can be stopped by the next agent, not adopted
        log.warning("cannot record the command of engine pid %d: %s", pid, exc)
    else:
        data["command"] = base64.b64encode(wire).decode()
        data["spec"] = {
            "health_url": spec.health_url,
            "endpoint_url": spec.endpoint_url,
            "metrics_url": spec.metrics_url,
            "capacity": spec.capacity,
        }
    path = run_dir / f"{name}.json"
    partial = run_dir / f"{name}.partial"  # renamed into place: never read half-written
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data))
        partial.replace(path)
    except OSError as exc:
        log.warning("cannot record engine pid %d in %s: %s", pid, run_dir, exc)


def forget_record(run_dir: Path, name: str) -> None:
    with contextlib.suppress(OSError):
        (run_dir / f"{name}.json").unlink()


def start_time(pid: int) -> int | None:
    """The process's start time, which tells it from a later process given its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat.rsplit(b") ", 1)[-1].split()[19])  # field 22, after the name
    except (OSError, ValueError, IndexError):
        return None


def _parse_command(data: dict[str, Any]) -> tuple[StartShard | None, LaunchSpec | None]:
    try:
        message = server_message_from_proto(
            pb.ConnectResponse.FromString(base64.b64decode(data["command"]))
        )
        spec = data["spec"]
        capacity = spec.get("capacity")
        launch = LaunchSpec(
            argv=tuple(str(a) for a in data["argv"]),
            env={},
            health_url=spec.get("health_url"),
            endpoint_url=spec.get("endpoint_url"),
            metrics_url=spec.get("metrics_url"),
            capacity=int(capacity) if capacity is not None else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError, ConversionError, DecodeError):
        return None, None
    return (message, launch) if isinstance(message, StartShard) else (None, None)


def read_records(run_dir: Path) -> list[Found]:
    """Every recorded engine that still runs the recorded command (the same process:
    a pid since reused by something else is not ours); the other records are removed."""
    found: list[Found] = []
    for record in sorted(run_dir.glob("*.json")):
        try:
            data = json.loads(record.read_text())
            pid, argv = int(data["pid"]), [str(a) for a in data["argv"]]
            start = data.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            record.unlink(missing_ok=True)  # gone (or no /proc to tell: leave it be)
            continue
        same = [c.decode("utf-8", "replace") for c in cmdline if c] == argv
        if not same or (start is not None and start_time(pid) != start):
            record.unlink(missing_ok=True)  # the pid was reused by something else
            continue
        command, spec = _parse_command(data)
        found.append(Found(record, pid, start, command, spec))
    return found


async def stop_orphans(orphans: Iterable[Found], grace: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace`, the process groups of `orphans`."""
    orphans = list(orphans)
    for f in orphans:
        log.warning("stopping engine pid %d left running by a previous agent", f.pid)
        signal_group(f.pid, signal.SIGTERM)
    with trio.move_on_after(grace):
        while any(alive(f.pid) for f in orphans):  # noqa: ASYNC110 (not our children)
            await trio.sleep(0.1)
    for f in orphans:
        signal_group(f.pid, signal.SIGKILL)
        f.record.unlink(missing_ok=True)
    return [f.pid for f in orphans]


async def sweep_orphans(run_dir: Path, *, grace: float = 10.0) -> list[int]:
    """Kill every engine a previous agent left running, adoptable or not; returns
    their pids. (The supervisor adopts the healthy ones instead: Supervisor.run.)"""
    return await stop_orphans(read_records(run_dir), grace)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[-1][:1] != b"Z"
    except OSError:
        return True
