"""Start llmgw's command-line programs as real processes on loopback for tests."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from llmgw import units
from llmgw.testing.procs import Proc, reserve_port
from tests.waiting import wait_for

BIN = Path(sys.executable).parent
T = TypeVar("T")

#: Where the programs' logs, state directories and configuration files go: a directory
#: of the pytest session's (tests/conftest.py sets it), which pytest keeps for a look
#: after a failure and removes a few sessions later, never the system temp dir.
SCRATCH: Path | None = None


def scratch_dir(prefix: str) -> Path:
    """A new directory under SCRATCH (the system temp dir outside a pytest session)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH))


@contextlib.contextmanager
def running(
    program: str,
    *args: str,
    health: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 20.0,
    ready: bool = False,
) -> Iterator[Proc]:
    """Run `program` (an installed console script) until the block ends; with `ready`,
    pass it ``--ready-file`` and wait for that file (`proc.ready` holds what it says)."""
    logdir = scratch_dir(f"{program}-")
    argv = [str(BIN / program), *args]
    if ready:
        argv += ["--ready-file", str(logdir / "ready.json")]
    proc = Proc(argv, logdir / "output.log", env)
    try:
        if ready:
            proc.wait_ready_file(logdir / "ready.json", timeout)
        if health is not None:
            proc.wait_http(health, timeout)
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def sim(*args: str, model: str = "sim-model") -> Iterator[tuple[Proc, str]]:
    """A simulator on a loopback port of its own (port 0); yields the process and its
    base URL."""
    with running(
        "llmgw-sim", "--host", "127.0.0.1", "--port", "0", "--model", model, *args, ready=True
    ) as proc:
        yield proc, proc.url()


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
        """Wait until every endpoint has been scraped once (there is at least one: none
        known yet is not every one scraped)."""
        wait_for(
            lambda: (
                (found := self.endpoints()) and all(e["engine"] is not None for e in found.values())
            ),
            "every endpoint scraped",
            timeout,
            interval=0.05,
            context=lambda: f"endpoints: {self.endpoints()}",
        )


@contextlib.contextmanager
def server(
    *args: str, config: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """llmgw-server on loopback ports of its own (port 0), optionally with a TOML config
    text."""
    extra: list[str] = []
    if config is not None:
        path = scratch_dir("llmgw-config-") / "llmgw.toml"
        path.write_text(config)
        extra = ["--config", str(path)]
    with running(
        "llmgw-server",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        *extra,
        *args,
        env=env,
        ready=True,
    ) as proc:
        yield Server(proc, proc.url("listen"), proc.url("admin_listen"))


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


# -- the control plane: a server with agents -----------------------------------------------


def engine_port_range(size: int = 60) -> tuple[int, int]:
    """A block of ports for `control.port_range`, below the kernel's ephemeral range
    (32768+, where port-0 binds and outgoing connections take theirs) and picked at
    random so tests that run at once rarely share one (the agent checks that a port is
    free before it starts an engine there, and a failed start is placed again)."""
    import random

    low = random.randrange(21000, 32000 - size)
    return low, low + size - 1


@dataclasses.dataclass(frozen=True)
class FleetPorts:
    """The three ports of a control-plane server."""

    listen: int
    admin: int
    agent: int

    @classmethod
    @contextlib.contextmanager
    def reserved(cls) -> Iterator[FleetPorts]:
        """Three loopback ports held for the block (llmgw.testing.procs.reserve_port): for a
        server restarted in place, start it and its successor with these, so no other
        process takes a port while neither listens."""
        with reserve_port() as listen, reserve_port() as admin, reserve_port() as agent:
            yield cls(listen, admin, agent)

    @classmethod
    def of(cls, ready: dict[str, Any]) -> FleetPorts:
        """The ports a server named in its ready file."""
        listen, admin, agent = (
            units.parse_address(ready[key][0]).port
            for key in ("listen", "admin_listen", "agent_listen")
        )
        return cls(listen, admin, agent)


class FleetServer(Server):
    """A running llmgw-server in control-plane mode."""

    def __init__(self, proc: Proc, ports: FleetPorts) -> None:
        super().__init__(
            proc, f"http://127.0.0.1:{ports.listen}", f"http://127.0.0.1:{ports.admin}"
        )
        self.ports = ports
        self.agent_address = f"127.0.0.1:{ports.agent}"

    def get(self, path: str) -> Any:
        """GET an admin path (``/api/v1/...``) as JSON."""
        r = httpx.get(f"{self.admin}{path}", timeout=5)
        r.raise_for_status()
        return r.json()

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["id"]: n for n in self.get("/api/v1/nodes")["nodes"]}

    def replicas(self, model: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.get("/api/v1/replicas")["replicas"]
        return [r for r in found if model is None or r["model"] == model]

    def model_counts(self, model: str) -> dict[str, Any] | None:
        for counts in self.get("/api/v1/replicas")["models"]:
            if counts["model"] == model:
                return dict(counts)
        return None

    def ready_replicas(self, model: str, count: int | None = None) -> list[dict[str, Any]]:
        """The model's ready replicas (all of its shards ready), or [] unless there are
        exactly `count` of them (when given)."""
        ready = [
            r
            for r in self.replicas(model)
            if r["state"] == "ready" and all(n["shard_state"] == "ready" for n in r["nodes"])
        ]
        return ready if count is None or len(ready) == count else []

    def wait(
        self,
        check: Callable[[], T | None],
        what: str,
        timeout: float = 20.0,
        *,
        logs: Sequence[Proc] = (),
    ) -> T:
        """`wait_for` with the server's state and the logs of `logs` on failure."""

        def context() -> str:
            parts = []
            with contextlib.suppress(httpx.HTTPError, ValueError):
                parts.append(f"nodes: {self.get('/api/v1/nodes')}")
                parts.append(f"replicas: {self.get('/api/v1/replicas')}")
            for proc in (self.proc, *logs):
                parts.append(f"--- {' '.join(proc.argv[:1])} output:\n{proc.output()[-4000:]}")
            return "\n".join(parts)

        return wait_for(check, what, timeout, context=context)


@contextlib.contextmanager
def fleet_server(
    config: str, *args: str, ports: FleetPorts | None = None, env: dict[str, str] | None = None
) -> Iterator[FleetServer]:
    """llmgw-server with `config` (TOML with deployable models), its listeners on
    127.0.0.1: on `ports` (say FleetPorts.reserved(), to start a new server in the place
    of a stopped one), else on ports of its own (port 0)."""
    path = scratch_dir("llmgw-config-") / "llmgw.toml"
    path.write_text(config)
    listen, admin, agents = (0, 0, 0) if ports is None else dataclasses.astuple(ports)
    with running(
        "llmgw-server",
        "--config",
        str(path),
        "--listen",
        f"127.0.0.1:{listen}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--agent-listen",
        f"127.0.0.1:{agents}",
        *args,
        env=env,
        ready=True,
    ) as proc:
        yield FleetServer(proc, FleetPorts.of(proc.ready))


class AgentProc:
    """A running llmgw-agent and its state directory (engine logs and pid records)."""

    def __init__(self, proc: Proc, node_id: str, state_dir: Path) -> None:
        self.proc = proc
        self.node_id = node_id
        self.state_dir = state_dir

    def engines(self) -> dict[str, int]:
        """The engines it runs, from its pid records: shard name
        (``<replica>-r<rank>-e<epoch>``) -> pid."""
        return {name: pid for name, pid, _argv in _engine_records(self.state_dir)}

    def engine_logs(self) -> list[Path]:
        return sorted((self.state_dir / "logs").glob("*.log"))


def _engine_records(state_dir: Path) -> list[tuple[str, int, list[str]]]:
    records = []
    for record in sorted((state_dir / "run").glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(record.read_text())
            records.append((record.stem, int(data["pid"]), [str(a) for a in data["argv"]]))
    return records


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b") ", 1)[-1][:1] not in (b"Z", b"X")


def kill_engines(state_dir: Path) -> list[int]:
    """SIGKILL the process group of every engine recorded in an agent's `state_dir` that
    still runs its recorded command (the orphans of an agent killed with SIGKILL)."""
    killed = []
    for _name, pid, argv in _engine_records(state_dir):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if [c.decode(errors="replace") for c in cmdline if c] == argv and alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


@contextlib.contextmanager
def agent(
    server: str,
    node_id: str,
    *args: str,
    address: str,
    gpus: str | None = "1x80GB",
    fabric: str | None = None,
    state_dir: Path | None = None,
    heartbeat: str = "200ms",
    max_backoff: str = "1s",
    shutdown_grace: str = "5s",
    env: dict[str, str] | None = None,
) -> Iterator[AgentProc]:
    """llmgw-agent for `node_id` connected to `server` (HOST:PORT), its engines bound to
    the loopback `address` (give every agent its own: all of 127/8 is local, so engine
    ports from one range cannot collide). On exit it is stopped (SIGTERM: it stops its
    engines), and any engine it left behind (it was SIGKILLed) is killed."""
    state = state_dir or scratch_dir(f"llmgw-agent-{node_id}-")
    argv = [
        "--server", server, "--node-id", node_id, "--address", address,
        "--state-dir", str(state), "--heartbeat", heartbeat,
        "--max-backoff", max_backoff, "--shutdown-grace", shutdown_grace,
    ]  # fmt: skip
    if gpus is not None:
        argv += ["--fake-gpus", gpus]
    if fabric is not None:
        argv += ["--fabric", fabric]
    try:
        with running("llmgw-agent", *argv, *args, env=env) as proc:
            yield AgentProc(proc, node_id, state)
    finally:
        kill_engines(state)
