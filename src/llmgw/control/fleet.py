"""The fleet's values now live in :mod:`llmgw.domain.fleet` (issue #18): kept here for
code written against this module (placement, being split, still imports it)."""

from llmgw.domain.fleet import (
    EngineExit,
    EngineInfo,
    Gpu,
    NodeInfo,
    NodeState,
    Placement,
    ReplicaState,
    ShardAssignment,
    ShardState,
    StartFailure,
)

__all__ = [
    "EngineExit",
    "EngineInfo",
    "Gpu",
    "NodeInfo",
    "NodeState",
    "Placement",
    "ReplicaState",
    "ShardAssignment",
    "ShardState",
    "StartFailure",
]
