"""The fleet's vocabulary: nodes, GPUs, replicas and shards, as frozen values.

These are shared by the inventory, placement, the reconciler, the agent and the
agent wire protocol (:mod:`llmgw.transport.messages`). A number a driver did not
report is None, never 0.
"""

from __future__ import annotations

import enum

import attrs


@attrs.frozen
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int  # bytes
    memory_used: int | None = None  # bytes
    utilization: float | None = None  # 0..1; None when the driver does not say
    ecc_errors: int | None = None


@attrs.frozen
class EngineInfo:
    """An engine an agent can launch."""

    name: str  # an engine of llmgw.domain.engines
    version: str | None = None


@attrs.frozen
class NodeInfo:
    """Everything an agent says about its machine when it registers."""

    node_id: str
    hostname: str
    address: str  # management address: engines' HTTP and distributed init bind here
    agent_version: str = ""
    labels: dict[str, str] = attrs.field(factory=dict)
    # Fabric names group nodes that share NVLink/InfiniBand; they cannot be inferred
    # from the wire, and without them a multi-node replica cannot be placed.
    fabrics: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    engines: tuple[EngineInfo, ...] = ()


class NodeState(enum.Enum):
    READY = "ready"
    UNREACHABLE = "unreachable"  # no heartbeat for a while: replicas stay and keep serving
    LOST = "lost"  # gone long enough that its replicas are placed elsewhere


class ReplicaState(enum.Enum):
    PENDING = "pending"  # wanted, not placed yet
    STARTING = "starting"  # placed, shards launching
    READY = "ready"  # every shard ready; published to the router
    DRAINING = "draining"  # no new requests; stops when in-flight work is done
    STOPPED = "stopped"
    FAILED = "failed"


class ShardState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class StartFailure(enum.Enum):
    """Why a replica never became ready (a bounded label: the fleet metrics)."""

    NOT_LAUNCHED = "not_launched"  # its agent refused the start or could not exec it
    EXITED = "exited"  # an engine process exited before every shard was ready
    TIMED_OUT = "timed_out"  # not ready within control.start_timeout


class EngineExit(enum.Enum):
    """How the engine of a serving (ready or draining) replica ended unasked."""

    SIGNAL = "signal"  # killed by a signal: the OOM killer, a SIGKILL
    ERROR = "error"  # a non-zero exit status
    CLEAN = "clean"  # exit status 0, though nobody asked it to stop
    UNKNOWN = "unknown"  # failed without an exit status reported

    @classmethod
    def of(cls, exit_code: int | None) -> EngineExit:
        if exit_code is None:
            return cls.UNKNOWN
        if exit_code < 0:  # the agent reports -N for "killed by signal N"
            return cls.SIGNAL
        return cls.ERROR if exit_code else cls.CLEAN


@attrs.frozen
class ShardAssignment:
    """One node's part of a replica: which GPUs and ports it uses."""

    node_id: str
    rank: int  # node rank; rank 0 serves HTTP
    gpu_indices: tuple[int, ...]
    port: int  # the engine's HTTP port on that node
    # Distributed-init port (multi-node only; on rank 0's node).
    dist_port: int | None = None


@attrs.frozen
class Placement:
    """Where one replica runs. `epoch` fences out shards of superseded placements."""

    replica_id: str
    model: str
    profile: str
    epoch: int
    shards: tuple[ShardAssignment, ...]

    @property
    def head(self) -> ShardAssignment:
        return self.shards[0]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.shards)
