"""What a deployment profile asks of a node, and the one fit check.

How many GPUs per node and on how many nodes (``tensor_parallel x
pipeline_parallel``), which GPUs qualify, its engine, and whether it may run without
a GPU are stated here and nowhere else in placement. :meth:`Spec.fit` says whether
and why one node can take a shard of the profile: the solver's per-node decisions
and the explainer's per-node reasons and hints all come from it, so they cannot
disagree.
"""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Final, Protocol

from llmgw.control.placement.values import NodeCode
from llmgw.domain.catalog import DeploymentProfile, gpu_name_pattern
from llmgw.domain.engines import cpu_engines
from llmgw.domain.fleet import NodeState

# Engines that can run without a GPU (see the package docstring for the exact rule).
CPU_ENGINES: Final = cpu_engines()

Sig = tuple[tuple[int, str, int], ...]  # (index, name, memory_total) of each GPU, by index
# The fit check's answer: the code, and how close the node came (usable GPUs for
# TOO_FEW_GPUS; free usable GPUs for BUSY, NO_PORTS and FITS on a GPU node; else 0).
Verdict = tuple[NodeCode, int]

# Verdicts that carry no count, made once: the solver asks the check in its loops.
_LOST: Final = (NodeCode.LOST, 0)
_UNREACHABLE: Final = (NodeCode.UNREACHABLE, 0)
_CORDONED: Final = (NodeCode.CORDONED, 0)
_NO_ENGINE: Final = (NodeCode.NO_ENGINE, 0)
_NO_FABRIC: Final = (NodeCode.NO_FABRIC, 0)
_NO_GPUS: Final = (NodeCode.NO_GPUS, 0)
_NO_PORTS: Final = (NodeCode.NO_PORTS, 0)
_FITS: Final = (NodeCode.FITS, 0)


def gpu_count(profile: DeploymentProfile) -> int:
    """GPUs one replica of `profile` uses in all: ``tensor_parallel x pipeline_parallel``."""
    return profile.gpus


def cpu_capable(profile: DeploymentProfile) -> bool:
    """Whether `profile` may run on a node without GPUs (see the package docstring)."""
    return (
        profile.engine in CPU_ENGINES
        and gpu_count(profile) == 1
        and profile.min_gpu_memory is None
        and profile.gpu_name is None
    )


def spec_key(profile: DeploymentProfile) -> tuple[object, ...]:
    """The fields of `profile` that placement reads (its name included)."""
    return (
        profile.name,
        profile.engine,
        profile.tensor_parallel,
        profile.pipeline_parallel,
        profile.gpus_per_node,
        profile.min_gpu_memory,
        profile.gpu_name,
    )


class NodeFacts(Protocol):
    """What the fit check reads of a node: the solver's working node, or the
    explainer's class of nodes that every profile judges alike."""

    @property
    def state(self) -> NodeState: ...
    @property
    def cordoned(self) -> bool: ...
    @property
    def engines(self) -> frozenset[str]: ...
    @property
    def has_fabric(self) -> bool: ...
    @property
    def sig(self) -> Sig: ...
    @property
    def free(self) -> Set[int]: ...  # free GPU indices
    @property
    def free_ports(self) -> int: ...


class GpuFit:
    """How the GPUs of one node (its `Sig`) serve a profile, whatever is busy."""

    __slots__ = ("code", "every", "match", "match_set", "named")

    def __init__(self, spec: Spec, sig: Sig) -> None:
        min_memory = spec.min_memory
        regex = spec.regex
        # Those whose name matches, then those of them with the memory too.
        self.named = sig if regex is None else tuple(g for g in sig if regex.search(g[1]))
        self.match = tuple(i for i, _, m in self.named if min_memory is None or m >= min_memory)
        self.match_set = frozenset(self.match)
        self.every = len(self.match) == len(sig)
        # Why the node could not take a shard even if idle; None: enough GPUs qualify.
        self.code: NodeCode | None = None
        if regex is not None and not self.named:
            self.code = NodeCode.GPU_NAME
        elif min_memory is not None and not any(m >= min_memory for _, _, m in self.named):
            self.code = NodeCode.GPU_MEMORY
        elif len(self.match) < spec.per_node:
            self.code = NodeCode.TOO_FEW_GPUS


class Spec:
    """What one profile asks of nodes."""

    __slots__ = (
        "_gpus",
        "cpu_ok",
        "engine",
        "error",
        "identity",
        "min_memory",
        "multi",
        "name",
        "nodes",
        "pattern",
        "per_node",
        "regex",
    )

    def __init__(self, profile: DeploymentProfile) -> None:
        self.name = profile.name
        self.engine = profile.engine
        self.min_memory = profile.min_gpu_memory
        self.pattern = profile.gpu_name
        self.regex: re.Pattern[str] | None = None
        self.cpu_ok = cpu_capable(profile)
        self.error: str | None = None
        total = gpu_count(profile)
        per_node = profile.gpus_per_node or total
        self.per_node = per_node
        self.nodes = total // per_node if per_node >= 1 else 0
        self.multi = self.nodes > 1
        if total < 1 or per_node < 1 or total % per_node:
            self.error = (
                f"tensor_parallel x pipeline_parallel = {total} GPUs does not split "
                f"into whole nodes of {per_node}"
            )
        elif self.pattern is not None:
            try:
                self.regex = gpu_name_pattern(self.pattern)
            except re.error as exc:
                self.error = f"gpu_name {self.pattern!r} is not a valid regular expression: {exc}"
        # Profiles with the same identity get the same verdict from every node.
        self.identity = (
            self.engine,
            (self.min_memory, self.pattern),
            per_node,
            self.nodes,
            self.cpu_ok,
        )
        self._gpus: dict[int, tuple[Sig, GpuFit]] = {}

    def gpus(self, sig: Sig) -> GpuFit:
        """How GPUs `sig` serve this profile (kept: a fleet has few distinct GPU sets)."""
        # By identity, as hashing a GPU set costs more than the rest of a fit check;
        # the entry holds `sig`, so its id is not reused while the entry stands.
        found = self._gpus.get(id(sig))
        if found is None or found[0] is not sig:
            found = self._gpus[id(sig)] = (sig, GpuFit(self, sig))
        return found[1]

    def fit(self, node: NodeFacts, *, ignore_cordon: bool = False) -> Verdict:
        """Whether `node` can take one shard of this profile now, and if not why not:
        the first check that fails, in :class:`NodeCode`'s order read backwards (lost,
        unreachable, cordoned, engine, ... free GPUs, a free port). `ignore_cordon`:
        as if uncordoned. Which fabric a multi-node replica uses, and which of its
        nodes has the two ports its head needs, are the caller's to decide."""
        state = node.state
        if state is NodeState.LOST:
            return _LOST
        if state is NodeState.UNREACHABLE:
            return _UNREACHABLE
        if node.cordoned and not ignore_cordon:
            return _CORDONED
        if self.engine not in node.engines:
            return _NO_ENGINE
        if self.multi and not node.has_fabric:
            return _NO_FABRIC
        sig = node.sig
        if not sig:
            if not self.cpu_ok:
                return _NO_GPUS
            return _NO_PORTS if node.free_ports < 1 else _FITS
        gpus = self.gpus(sig)
        if gpus.code is not None:
            return gpus.code, len(gpus.match) if gpus.code is NodeCode.TOO_FEW_GPUS else 0
        # Intersected even when every GPU qualifies: the explainer's "if this shard
        # were drained" frees the shard's GPUs, which the node may no longer report.
        free = len(gpus.match_set.intersection(node.free))
        if free < self.per_node:
            return NodeCode.BUSY, free
        if node.free_ports < 1:
            return NodeCode.NO_PORTS, free
        return NodeCode.FITS, free
