"""What a deployment profile asks of a node: how many GPUs per node and on how many
nodes (``tensor_parallel x pipeline_parallel``), which GPUs qualify, its engine, and
whether it may run without a GPU."""

from __future__ import annotations

import re
from typing import Final

from llmgw.config import DeploymentProfile
from llmgw.control.placement.wording import plural

# Engines that can run without a GPU (see the package docstring for the exact rule).
CPU_ENGINES: Final = frozenset({"sim", "llamacpp"})


def cpu_capable(profile: DeploymentProfile) -> bool:
    """Whether `profile` may run on a node without GPUs (see the package docstring)."""
    return (
        profile.engine in CPU_ENGINES
        and profile.tensor_parallel * profile.pipeline_parallel == 1
        and profile.min_gpu_memory is None
        and profile.gpu_name is None
    )


Sig = tuple[tuple[int, str, int], ...]  # (index, name, memory_total) of each GPU
Filter = tuple[int | None, str | None]  # (min_gpu_memory, gpu_name)


class Spec:
    """What one profile asks of nodes."""

    __slots__ = ("cpu_ok", "engine", "error", "filt", "label", "name", "nodes", "per_node")

    def __init__(self, profile: DeploymentProfile) -> None:
        self.name = profile.name
        self.engine = profile.engine
        self.filt: Filter = (profile.min_gpu_memory, profile.gpu_name)
        self.cpu_ok = cpu_capable(profile)
        self.error: str | None = None
        total = profile.tensor_parallel * profile.pipeline_parallel
        per_node = profile.gpus_per_node or total
        self.per_node = per_node
        self.nodes = total // per_node if per_node >= 1 else 0
        if total < 1 or per_node < 1 or total % per_node:
            self.error = (
                f"tensor_parallel x pipeline_parallel = {total} GPUs does not split "
                f"into whole nodes of {per_node}"
            )
        elif profile.gpu_name is not None:
            try:
                re.compile(profile.gpu_name)
            except re.error as exc:
                self.error = (
                    f"gpu_name {profile.gpu_name!r} is not a valid regular expression: {exc}"
                )
        if self.nodes > 1:
            self.label = f"{self.name} ({self.nodes} nodes x {plural(per_node, 'GPU')})"
        else:
            self.label = f"{self.name} ({plural(per_node, 'GPU')})"

    @property
    def multi(self) -> bool:
        return self.nodes > 1


def spec_key(profile: DeploymentProfile) -> tuple[object, ...]:
    return (
        profile.name,
        profile.engine,
        profile.tensor_parallel,
        profile.pipeline_parallel,
        profile.gpus_per_node,
        profile.min_gpu_memory,
        profile.gpu_name,
    )


def spec_identity(spec: Spec) -> tuple[object, ...]:
    return (spec.engine, spec.filt, spec.per_node, spec.nodes, spec.cpu_ok)
