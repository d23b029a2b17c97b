"""The values placement takes and gives: nodes and requests in, placements or the
reasons for none out, with the codes those reasons carry. Frozen attrs values that
serialise with cattrs."""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from llmgw.config import DeploymentProfile, ModelConfig
from llmgw.domain.fleet import Gpu, NodeInfo, NodeState, Placement


def _frozen_ints(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


def _frozen_strs(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _gpu_tuple(values: Iterable[Gpu]) -> tuple[Gpu, ...]:
    return tuple(values)


# -- inputs --------------------------------------------------------------------------


@attrs.frozen
class NodeCapacity:
    """One node as placement sees it."""

    node_id: str
    state: NodeState
    since: float | None  # when it entered `state` ("lost 3m ago")
    gpus: tuple[Gpu, ...] = attrs.field(converter=_gpu_tuple)
    engines: frozenset[str] = attrs.field(converter=_frozen_strs)
    fabrics: tuple[str, ...] = attrs.field(converter=_str_tuple)
    used_gpus: frozenset[int] = attrs.field(converter=_frozen_ints)  # GPU indices
    used_ports: frozenset[int] = attrs.field(converter=_frozen_ints)
    address: str
    cordoned: bool = False

    @classmethod
    def from_info(
        cls,
        info: NodeInfo,
        state: NodeState,
        *,
        since: float | None = None,
        used_gpus: Iterable[int] = (),
        used_ports: Iterable[int] = (),
        cordoned: bool = False,
    ) -> NodeCapacity:
        return cls(
            node_id=info.node_id,
            state=state,
            since=since,
            gpus=info.gpus,
            engines=frozenset(e.name for e in info.engines),
            fabrics=info.fabrics,
            used_gpus=used_gpus,
            used_ports=used_ports,
            address=info.address,
            cordoned=cordoned,
        )


@attrs.frozen
class PlaceRequest:
    """One replica to place, with its model's deployment profiles in order of preference."""

    model: str
    replica_id: str
    epoch: int
    profiles: tuple[DeploymentProfile, ...]

    @classmethod
    def for_model(cls, model: ModelConfig, replica_id: str, epoch: int) -> PlaceRequest:
        return cls(model.name, replica_id, epoch, model.profiles)


# -- explanations --------------------------------------------------------------------


class NodeCode(enum.StrEnum):
    """Why one node cannot take (a shard of) a replica, from least to most fixable by
    waiting; `FITS` only appears for multi-node profiles (the node could host a shard,
    the fabric is what is missing)."""

    FITS = "fits"
    NO_PORTS = "no_ports"
    BUSY = "busy"  # enough usable GPUs, not enough of them free
    TOO_FEW_GPUS = "too_few_gpus"  # fewer usable GPUs than the profile needs, even idle
    GPU_MEMORY = "gpu_memory"
    GPU_NAME = "gpu_name"
    NO_GPUS = "no_gpus"
    NO_FABRIC = "no_fabric"
    NO_ENGINE = "no_engine"
    CORDONED = "cordoned"
    UNREACHABLE = "unreachable"
    LOST = "lost"


class FabricCode(enum.StrEnum):
    TOO_FEW_NODES = "too_few_nodes"
    NO_HEAD_PORT = "no_head_port"
    FITS = "fits"


class AttemptCode(enum.StrEnum):
    """Why one profile did not fit, as a whole."""

    NO_NODES = "no_nodes"  # no node is known at all
    NO_NODE_FITS = "no_node_fits"
    NO_FABRICS = "no_fabrics"  # multi-node profile, and no node has a fabric label
    NO_FABRIC_FITS = "no_fabric_fits"
    INVALID_PROFILE = "invalid_profile"


class HintCode(enum.StrEnum):
    DRAIN = "drain"  # fits if this replica were drained
    UNCORDON = "uncordon"  # fits if this node were uncordoned
    MORE_NODES = "more_nodes"  # a fabric needs more ready nodes with free GPUs
    LABEL_FABRICS = "label_fabrics"  # no node has a fabric label


@attrs.frozen
class NodeReason:
    node_id: str
    code: NodeCode
    message: str  # "gpu-3: 2 free GPUs, needs 4"


@attrs.frozen
class FabricReason:
    fabric: str
    code: FabricCode
    message: str  # "fabric ib-a: 1 ready node with 8 free GPUs, needs 2"
    ready_nodes: int  # nodes of the fabric that could host a shard now
    needs: int  # nodes the profile needs


@attrs.frozen
class Hint:
    """Something that would make the request fit."""

    code: HintCode
    message: str
    profile: str
    model: str | None = None  # DRAIN: the replica to drain
    replica_id: str | None = None
    nodes: tuple[str, ...] = ()
    fabric: str | None = None


@attrs.frozen
class ProfileAttempt:
    """Why one profile did not fit."""

    profile: str
    code: AttemptCode
    summary: str
    nodes: tuple[NodeReason, ...] = ()  # at most `max_node_reasons`
    fabrics: tuple[FabricReason, ...] = ()  # multi-node profiles only
    node_counts: dict[str, int] = attrs.field(factory=dict)  # NodeCode value -> nodes
    nodes_omitted: int = 0  # nodes counted but not listed in `nodes`


@attrs.frozen
class Unplaceable:
    request: PlaceRequest
    summary: str  # one line
    attempts: tuple[ProfileAttempt, ...]  # one per profile, in order
    hints: tuple[Hint, ...] = ()

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def replica_id(self) -> str:
        return self.request.replica_id


@attrs.frozen
class PlanResult:
    placed: tuple[Placement, ...]
    unplaced: tuple[Unplaceable, ...]
    # Every node (by id) with the GPUs and ports that existing and new placements hold:
    # pass these, with `existing + placed`, to a following call.
    nodes: tuple[NodeCapacity, ...] = ()
