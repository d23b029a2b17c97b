"""The node agent (DESIGN §6): registers the machine, heartbeats, runs engine shards.

::

    agent = Agent(connector, NodeSettings(node_id="gpu-1", address="10.0.0.5"),
                  state_dir=Path("/var/lib/llmgw-agent"))
    await agent.run()        # until cancelled; then every engine is stopped

One connection at a time, reconnecting forever:

* **Register** first, with the whole inventory (GPUs freshly discovered, engines
  found installed, labels, fabrics) and every shard it knows: live ones with the
  launch fields a restarted server needs to adopt them, and ended ones whose end no
  registration or heartbeat has carried yet.
* **Registered** sets the heartbeat interval. From then on a **Heartbeat** goes out
  every interval with the GPUs rediscovered (memory used, utilisation, ECC; bounded
  by half an interval, the last known inventory otherwise) and a summary of every
  shard (without output tails), and every shard transition is sent as it happens.
  A shard that ended is forgotten only once a heartbeat (or registration) has carried
  its end, not when the transition was sent: the server re-derives from those
  summaries, so a lost final ShardStatus costs one interval instead of leaving the
  server waiting for an end nothing would report again.
* **Commands**: each StartShard is checked by its engine's adapter and against
  this node (GPUs and ports not taken by another shard, ports free, network
  interface present) and either rejected at once (CommandResult failed, FAILED with
  the problems, nothing launched) or launched in a supervised task of its own
  (CommandResult ok). StopShard and DrainShard go to the shard of that epoch.
* **Reconnect**: when the stream fails, or no Registered arrives within
  ``register_timeout`` (given several servers: within a few heartbeat intervals, and
  the connection too, so a paused leader a follower names does not hold it), the
  agent waits a full-jitter exponential backoff
  (uniform in ``[0, min(max_backoff, base_backoff * 2**failures))``, so a fleet
  reconnecting to a restarted server spreads out instead of arriving in lockstep)
  and connects again. ``failures`` counts attempts since the last Registered. The
  engines keep running throughout: a server restart costs no engine restart.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

import attrs
import trio

from llmgw.agent.adapters import EngineAdapter, default_adapters
from llmgw.agent.discovery import DiscoveryError, discover
from llmgw.agent.launcher import Launcher
from llmgw.agent.servers import Servers
from llmgw.agent.supervisor import Shard, Supervisor
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ShardState
from llmgw.errors import first_line
from llmgw.transport.base import AgentConnector, ServerConnection, TransportError
from llmgw.transport.messages import (
    AgentMessage,
    CommandResult,
    DrainShard,
    Heartbeat,
    Refused,
    Register,
    Registered,
    ServerMessage,
    ShardStatus,
    StartShard,
    StopShard,
)
from llmgw.version import __version__

__all__ = ["Agent", "NodeSettings", "backoff_delay"]

log = logging.getLogger(__name__)

OUTBOX_SIZE = 1024
#: Heartbeat intervals a leading server may stay silent before the agent leaves it.
SILENT_HEARTBEATS = 3
#: The longest pause between attempts while looking for the leader among several
#: servers (seconds); the controller settles at least TAKEOVER_SETTLE after a takeover.
SEARCH_BACKOFF = 2.0
#: Among several servers, the least time one has to connect and answer a registration
#: (seconds; else SILENT_HEARTBEATS heartbeat intervals): a follower may name a leader
#: that is paused until its lease expires, and waiting the transport's whole connect
#: timeout (10 s) on it brought agents to the new leader after its settle period.
ANSWER_FLOOR = 2.0


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**failures))."""
    return rng.uniform(0.0, min(cap, base * 2.0 ** min(failures, 60)))


@attrs.frozen
class NodeSettings:
    """What the operator says about the node (the rest is discovered)."""

    node_id: str
    address: str  # management address: engines bind it, the router reaches them on it
    hostname: str = attrs.field(factory=socket.gethostname)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    fabrics: tuple[str, ...] = ()
    fake_gpus: str | None = None  # a spec such as "4x80GB": pretend instead of nvidia-smi


_Outgoing = tuple[AgentMessage, tuple[ShardStatus, ...]]  # the message, the statuses it carries


class Agent:
    def __init__(
        self,
        connector: AgentConnector,
        settings: NodeSettings,
        *,
        state_dir: Path,
        adapters: Mapping[str, EngineAdapter] | None = None,
        heartbeat_interval: float = 5.0,
        base_backoff: float = 0.5,
        max_backoff: float = 30.0,
        register_timeout: float = 30.0,
        shutdown_grace: float = 15.0,
        health_interval: float = 0.5,
        discover_gpus: Callable[[], Awaitable[tuple[Gpu, ...]]] | None = None,
        rng: random.Random | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.connector = connector
        self.settings = settings
        self.adapters: dict[str, EngineAdapter] = dict(
            adapters if adapters is not None else default_adapters()
        )
        self.heartbeat_interval = heartbeat_interval  # until a Registered says otherwise
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.register_timeout = register_timeout
        self.supervisor = Supervisor(
            Path(state_dir),
            self._report,
            shutdown_grace=shutdown_grace,
            health_interval=health_interval,
            launcher=launcher,
        )
        self._discover = discover_gpus or self._discover_default
        self._rng = rng or random.Random()
        self.gpus: tuple[Gpu, ...] = ()
        self.engines: tuple[EngineInfo, ...] = ()
        self.connections = 0  # streams opened
        self.registrations = 0  # Registered answers received
        self.failures = 0  # connect attempts since the last Registered
        self.refusal: str | None = None  # the server's reason, when it refused us
        self.server_epoch: str | None = None
        # The highest fencing token a leading server has shown (0: one server): no
        # command is taken from a server below it (a deposed leader).
        self.leader_token = 0
        self._redirected = False  # the last session ended on a leader's address
        self._outbox: trio.MemorySendChannel[_Outgoing] | None = None
        self._seq = 0
        self._discovery_error: str | None = None

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def node_info(self) -> NodeInfo:
        s = self.settings
        return NodeInfo(
            node_id=s.node_id,
            hostname=s.hostname,
            address=s.address,
            agent_version=__version__,
            labels=dict(s.labels),
            fabrics=tuple(s.fabrics),
            gpus=self.gpus,
            engines=self.engines,
        )

    # -- running -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe engines and GPUs, then serve the control plane until cancelled;
        cancelling stops every engine this agent runs before returning."""
        await self._probe_engines()
        await self._refresh_gpus(time_limit=30.0)
        log.info(
            "node %s (%s): %d GPU(s), engines: %s",
            self.node_id,
            self.settings.address,
            len(self.gpus),
            ", ".join(f"{e.name} {e.version or '?'}" for e in self.engines) or "none",
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self.supervisor.run)
            task_status.started()
            await self._connect_forever()

    async def _probe_engines(self) -> None:
        found: dict[str, EngineInfo | None] = {}

        async def probe(name: str, adapter: EngineAdapter) -> None:
            try:
                found[name] = await adapter.available()
            except Exception:
                log.exception("probing engine %s failed", name)
                found[name] = None

        async with trio.open_nursery() as nursery:
            for name, adapter in self.adapters.items():
                nursery.start_soon(probe, name, adapter)
        self.engines = tuple(info for name in self.adapters if (info := found.get(name)))

    async def _discover_default(self) -> tuple[Gpu, ...]:
        return await discover(self.settings.fake_gpus, node_id=self.node_id)

    async def _refresh_gpus(self, time_limit: float) -> None:
        """Rediscover the GPUs; on failure or timeout keep the last known ones."""
        error: str | None = None
        with trio.move_on_after(time_limit) as scope:
            try:
                self.gpus = await self._discover()
            except (DiscoveryError, OSError) as exc:
                error = str(exc)
        if scope.cancelled_caught:
            error = f"GPU discovery took longer than {time_limit:g}s"
        if error != self._discovery_error:  # say it once, and once when it clears
            if error is not None:
                log.warning("GPU discovery failed (keeping the last known GPUs): %s", error)
            elif self._discovery_error is not None:
                log.info("GPU discovery works again")
            self._discovery_error = error

    async def _connect_forever(self) -> None:
        servers = self.connector if isinstance(self.connector, Servers) else None
        while True:
            self._redirected = False
            try:
                async with contextlib.AsyncExitStack() as stack:
                    with trio.fail_after(self._answer_within()):
                        conn = await stack.enter_async_context(self.connector.connect())
                    self.connections += 1
                    await self._session(conn)
            except Exception as exc:
                if _only(exc, (TransportError, trio.TooSlowError)):
                    log.warning("connection to the server: %s", first_line(exc))
                else:
                    log.exception("agent session failed; reconnecting")
                if servers is not None:
                    servers.failed()
            if self._redirected:
                continue  # straight to the leader it was sent to
            # With several servers the agent is looking for the one that leads: a long
            # pause would bring it back after the new leader settled (its replicas then
            # placed again); the attempts are spread over the servers anyway.
            cap = self.max_backoff
            if servers is not None and len(servers.addresses) > 1:
                cap = min(cap, SEARCH_BACKOFF)
            delay = backoff_delay(self.failures, self.base_backoff, cap, self._rng)
            self.failures += 1
            log.info("reconnecting in %.2fs (attempt %d)", delay, self.failures)
            await trio.sleep(delay)

    def _answer_within(self) -> float:
        """How long a server has to accept the connection, and then to answer the
        registration: with several servers a short time (ANSWER_FLOOR), as the next one
        may lead; with one, register_timeout, as there is no other to try."""
        servers = self.connector if isinstance(self.connector, Servers) else None
        if servers is None or len(servers.addresses) < 2:
            return self.register_timeout
        silence = max(ANSWER_FLOOR, SILENT_HEARTBEATS * self.heartbeat_interval)
        return min(self.register_timeout, silence)

    async def _session(self, conn: ServerConnection) -> None:
        send, receive = trio.open_memory_channel[_Outgoing](OUTBOX_SIZE)
        # From here every transition is queued for this connection, and the snapshot
        # below is taken with no checkpoint in between: nothing falls in the gap.
        self._outbox = send
        try:
            shards = tuple(self.supervisor.statuses())
            await conn.send(Register(self.node_info(), shards))
            self.supervisor.delivered(shards)
            with trio.fail_after(self._answer_within()):
                first = await conn.receive()
            if isinstance(first, Refused):
                servers = self.connector if isinstance(self.connector, Servers) else None
                if first.leader and servers is not None:
                    # Not the leader: it says which one is.
                    log.info("the server does not lead; the leader is %s", first.leader)
                    self._redirected = servers.prefer(first.leader)
                    if self._redirected:
                        return
                if servers is not None and len(servers.addresses) > 1:
                    # Not the leader, and none known yet (an election under way).
                    log.info("%s does not lead: trying the next server", servers.current)
                    servers.failed()
                    return
                # Not a network problem: say so loudly; reconnecting keeps the backoff.
                log.error("the server refused this agent: %s", first.reason)
                self.refusal = first.reason
                return
            if isinstance(first, Registered):
                if not self._registered(first):
                    raise TransportError("a deposed leader: leaving it")
            else:
                log.warning("expected Registered first, got %s", type(first).__name__)
                self._handle(first)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_all, conn, receive)
                nursery.start_soon(self._heartbeats)
                while True:
                    if self.leader_token:
                        # A leading server says Registered every heartbeat interval:
                        # one that falls silent (paused, cut off) is left for another.
                        silence = SILENT_HEARTBEATS * self.heartbeat_interval
                        try:
                            with trio.fail_after(silence):
                                message = await conn.receive()
                        except trio.TooSlowError:
                            raise TransportError(
                                f"the server said nothing for {silence:g}s"
                            ) from None
                    else:
                        message = await conn.receive()
                    if isinstance(message, Registered):
                        if not self._registered(message, again=True):
                            raise TransportError("a deposed leader: leaving it")
                        continue
                    self._handle(message)
        finally:
            self._outbox = None
            send.close()

    def _registered(self, message: Registered, *, again: bool = False) -> bool:
        """Take the server's Registered; False (and nothing taken) from a leader whose
        fencing token is below one seen before: it was deposed."""
        if message.leader_token < self.leader_token:
            log.warning(
                "refusing a deposed leader: its token %d is below %d",
                message.leader_token,
                self.leader_token,
            )
            return False
        self.leader_token = message.leader_token
        if again:
            return True
        self.registrations += 1
        self.failures = 0
        if message.heartbeat_interval > 0:
            self.heartbeat_interval = message.heartbeat_interval
        if self.server_epoch is not None and message.server_epoch != self.server_epoch:
            log.info("the server restarted (epoch %s)", message.server_epoch)
        self.server_epoch = message.server_epoch
        log.info(
            "registered with the server; heartbeat every %gs, %d shard(s) reported",
            self.heartbeat_interval,
            len(self.supervisor.shards),
        )
        return True

    async def _send_all(
        self, conn: ServerConnection, receive: trio.MemoryReceiveChannel[_Outgoing]
    ) -> None:
        async for message, carried in receive:
            await conn.send(message)
            self.supervisor.delivered(carried)

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(self.heartbeat_interval)
            await self._refresh_gpus(time_limit=max(0.2, min(10.0, self.heartbeat_interval / 2)))
            self._seq += 1
            statuses = tuple(self.supervisor.statuses())
            summary = tuple(
                attrs.evolve(s, output_tail=()) if s.output_tail else s for s in statuses
            )
            self._queue(Heartbeat(self._seq, self.gpus, summary), statuses)

    def _queue(self, message: AgentMessage, carried: tuple[ShardStatus, ...] = ()) -> None:
        if self._outbox is None:
            return  # not connected: the next registration carries the state
        try:
            self._outbox.send_nowait((message, carried))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log.warning(
                "outbox full: %s not sent (the next heartbeat carries the state)",
                type(message).__name__,
            )

    def _report(self, status: ShardStatus) -> None:
        # Carries nothing to forget: an ended shard stays in the summaries until a
        # heartbeat has carried its end too (module docstring).
        self._queue(status)

    def _result(self, command_id: str, ok: bool, message: str = "") -> None:
        self._queue(CommandResult(command_id, ok, message))

    # -- commands --------------------------------------------------------------------------

    def _handle(self, message: ServerMessage) -> None:
        if isinstance(message, Registered):
            self._registered(message)
        elif isinstance(message, StartShard):
            self._start(message)
        elif isinstance(message, StopShard):
            key = (message.replica_id, message.rank)
            why = self.supervisor.stop(key, message.epoch, message.grace, reason="stopped")
            self._answer(message.command_id, key, message.epoch, why, "stopping")
        elif isinstance(message, DrainShard):
            key = (message.replica_id, message.rank)
            why = self.supervisor.drain(key, message.epoch, message.deadline)
            self._answer(message.command_id, key, message.epoch, why, "draining")
        else:
            log.warning("ignoring unexpected %s from the server", type(message).__name__)

    def _answer(
        self, command_id: str, key: tuple[str, int], epoch: int, why: str | None, doing: str
    ) -> None:
        if why is None:
            self._result(command_id, True, doing)
            return
        shard = self.supervisor.shards.get(key)
        if shard is None or not shard.live:
            # Nothing of it runs here: what the server wanted is already true. Say so as
            # a status too: the report of how it ended may have been lost (the server
            # asks again while it has heard nothing of the end), and a shard this agent
            # has forgotten is as good as stopped.
            self._result(command_id, True, why)
            if shard is not None:
                self._report(shard.status)  # say again how it ended
            else:
                replica_id, rank = key
                self._report(ShardStatus(replica_id, rank, epoch, ShardState.STOPPED, message=why))
        else:
            self._result(command_id, False, why)

    def _start(self, cmd: StartShard) -> None:
        key = (cmd.replica_id, cmd.rank)
        existing = self.supervisor.shards.get(key)
        replacing: Shard | None = None
        if existing is not None and existing.live:
            if existing.command.epoch == cmd.epoch:
                self._result(cmd.command_id, True, "already running")
                self._report(existing.status)
                return
            if existing.command.epoch > cmd.epoch:
                self._result(
                    cmd.command_id,
                    False,
                    f"stale: this node runs epoch {existing.command.epoch} of {cmd.replica_id}",
                )
                return
            replacing = existing  # an older epoch: stopped before the new one launches
        adapter = self.adapters.get(cmd.profile.engine)
        busy: list[int] = []  # ports another process holds
        if adapter is None:
            have = ", ".join(sorted(self.adapters)) or "none"
            problems = [
                f"engine {cmd.profile.engine!r} is not supported by this agent (it has: {have})"
            ]
        else:
            problems = adapter.validate(cmd, self.gpus) + self._node_problems(cmd, replacing, busy)
        if adapter is not None and not problems:
            try:
                spec = adapter.command(cmd, self.node_info())
            except Exception as exc:
                log.exception("building the %s command failed", adapter.name)
                problems = [f"cannot build the {adapter.name} command: {exc}"]
        if problems:
            self._result(cmd.command_id, False, "; ".join(problems))
            self.supervisor.reject(cmd, problems, busy_ports=tuple(busy))
            return
        self._result(cmd.command_id, True, "starting")
        self.supervisor.launch(cmd, spec)

    def _node_problems(
        self, cmd: StartShard, replacing: Shard | None, busy: list[int]
    ) -> list[str]:
        """What keeps `cmd` from running on this node now, whatever its engine; the
        ports another process holds are added to `busy` (the server avoids them)."""
        problems: list[str] = []
        others = [s for s in self.supervisor.live() if s is not replacing]
        taken = {i: s for s in others for i in s.command.gpu_indices}
        for index in sorted({i for i in cmd.gpu_indices if i in taken}):
            problems.append(f"GPU {index} is in use by {_describe(taken[index])}")
        ports = {cmd.port}
        if cmd.node_count > 1 and cmd.rank == 0 and cmd.master_port is not None:
            ports.add(cmd.master_port)
        ours = set() if replacing is None else _ports(replacing.command)
        for s in others:
            for port in sorted(ports & _ports(s.command)):
                problems.append(f"port {port} is in use by {_describe(s)}")
        if cmd.rank == 0:
            for port in sorted(ports - ours - {p for s in others for p in _ports(s.command)}):
                problem, in_use = _bind_problem(self.settings.address, port)
                if problem:
                    problems.append(problem)
                if in_use:
                    busy.append(port)
        if cmd.node_count > 1 and "NCCL_SOCKET_IFNAME" not in cmd.profile.env:
            problem = _interface_problem(cmd.mgmt_interface)
            if problem:
                problems.append(problem)
        return problems


def _ports(cmd: StartShard) -> set[int]:
    ports = {cmd.port}
    if cmd.node_count > 1 and cmd.rank == 0 and cmd.master_port is not None:
        ports.add(cmd.master_port)
    return ports


def _describe(shard: Shard) -> str:
    c = shard.command
    return f"replica {c.replica_id} rank {c.rank} (epoch {c.epoch})"


def _bind_problem(host: str, port: int) -> tuple[str | None, bool]:
    """Whether an engine could listen on host:port now (as it would: SO_REUSEADDR):
    what keeps it from it, and whether that is another process holding the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use by another process", True
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"address {host} is not an address of this node (cannot listen on it)", False
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}", False
    return None, False


def _interface_problem(spec: str, names: Iterable[str] | None = None) -> str | None:
    """Whether NCCL_SOCKET_IFNAME=`spec` names an interface of this node (NCCL's syntax:
    comma-separated prefixes, ``=`` for an exact name, ``^`` to exclude)."""
    if not spec or spec.startswith("^"):
        return None
    if names is None:
        try:
            names = [name for _index, name in socket.if_nameindex()]
        except OSError:
            return None
    have = list(names)
    exact = spec.startswith("=")
    wanted = [w for w in spec.lstrip("=").split(",") if w]
    if any(n == w if exact else n.startswith(w) for w in wanted for n in have):
        return None
    return (
        f"network interface {spec!r} (for NCCL/Gloo) is not on this node "
        f"(it has: {', '.join(have) or 'none'})"
    )


def _only(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc` is, or is a group of nothing but, `kinds`."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(e, kinds) for e in exc.exceptions)
    return isinstance(exc, kinds)
