"""The agent protocol in Python terms: what flows on the one stream between an agent
and the server. Transports move these values; the gRPC transport converts them
to and from `proto/llmgw/agent/v1/agent.proto`, the stub passes them as they are.
"""

from __future__ import annotations

import attrs

from llmgw.domain.catalog import DeploymentProfile
from llmgw.domain.fleet import Gpu, NodeInfo, ShardState

# -- agent -> server -------------------------------------------------------------


@attrs.frozen
class ShardStatus:
    """A shard's state as its agent sees it; sent on every transition."""

    replica_id: str
    rank: int
    epoch: int
    state: ShardState
    model: str = ""
    message: str = ""
    exit_code: int | None = None
    output_tail: tuple[str, ...] = ()  # the engine's last lines, on failure
    endpoint_url: str | None = None  # rank 0 only: where the engine serves HTTP
    pid: int | None = None
    # What the shard was started with, so a restarted server can rebuild the
    # placement from agents' reports and adopt it instead of restarting it.
    profile: str = ""
    node_count: int | None = None
    gpu_indices: tuple[int, ...] = ()
    port: int | None = None
    dist_port: int | None = None
    # Rank 0, once launched: sequences the engine runs at once (LaunchSpec.capacity).
    capacity: int | None = None
    # A start refused because another process on the node holds these of its ports.
    busy_ports: tuple[int, ...] = ()


@attrs.frozen
class Register:
    """First message of every connection: the whole inventory and every running shard,
    so a reconnecting agent refreshes all the server knows of it."""

    node: NodeInfo
    shards: tuple[ShardStatus, ...] = ()


@attrs.frozen
class Heartbeat:
    seq: int
    gpus: tuple[Gpu, ...] = ()  # refreshed memory/utilisation/ECC
    shards: tuple[ShardStatus, ...] = ()


@attrs.frozen
class CommandResult:
    command_id: str
    ok: bool
    message: str = ""


AgentMessage = Register | Heartbeat | ShardStatus | CommandResult

# -- server -> agent -------------------------------------------------------------


@attrs.frozen
class Registered:
    heartbeat_interval: float  # seconds
    server_epoch: str  # changes when the server restarts
    # The leader's fencing token when servers share a store (0: one server); then
    # Registered comes again every heartbeat interval (llmgw.control.leadership).
    leader_token: int = 0


@attrs.frozen
class StartShard:
    command_id: str
    replica_id: str
    rank: int
    epoch: int  # fencing: a shard of an older epoch of this replica is stale
    model: str  # served model name
    profile: DeploymentProfile
    gpu_indices: tuple[int, ...]
    port: int
    node_count: int = 1
    master_address: str | None = None  # distributed init (multi-node)
    master_port: int | None = None
    mgmt_interface: str = "eth0"


@attrs.frozen
class StopShard:
    command_id: str
    replica_id: str
    rank: int
    epoch: int
    grace: float = 30.0  # seconds between SIGTERM and SIGKILL


@attrs.frozen
class DrainShard:
    command_id: str
    replica_id: str
    rank: int
    epoch: int
    deadline: float = 300.0  # seconds to wait for in-flight requests before stopping


@attrs.frozen
class Refused:
    """The registration was refused (e.g. the node id is not the certificate's); the
    server closes the stream after this, so the agent can say why."""

    reason: str
    leader: str = ""  # the leading server (HOST:PORT), when this one does not lead


ServerMessage = Registered | StartShard | StopShard | DrainShard | Refused
