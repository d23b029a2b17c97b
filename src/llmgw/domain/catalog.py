"""The catalog's values: a model clients name, its deployment profiles and autoscale
bounds, with the GPU arithmetic every user of them shares.

They are written in the configuration's shape (llmgw.config re-exports them and
structures them from TOML; the admin API from JSON); the rules over a whole catalog
are in llmgw.catalog.rules.
"""

from __future__ import annotations

import functools
import re

import attrs

from llmgw.units import Bytes, Seconds

__all__ = [
    "AutoscaleConfig",
    "DeploymentProfile",
    "ModelConfig",
    "gpu_name_pattern",
]


@functools.lru_cache(maxsize=256)
def gpu_name_pattern(gpu_name: str) -> re.Pattern[str]:
    """A profile's `gpu_name`, compiled once for every check and match of it; raises
    re.error when it is not a regular expression."""
    return re.compile(gpu_name)


@attrs.frozen
class DeploymentProfile:
    """One way to run a model replica; a model lists them in order of preference."""

    name: str
    # vllm, sglang, llamacpp or sim.
    engine: str
    # What the engine loads: a Hugging Face id or a path on the node.
    weights: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # None: all of the replica's GPUs on one node.
    gpus_per_node: int | None = None
    min_gpu_memory: Bytes | None = None
    # A regular expression matched against the GPU's model name.
    gpu_name: str | None = None
    # More arguments on the engine's command line.
    args: tuple[str, ...] = ()
    # More variables in the engine's environment.
    env: dict[str, str] = attrs.field(factory=dict)
    # The engine is started with this API key (in its environment, never its command
    # line) and the router sends it; never shown by the admin API nor --print-config.
    api_key: str | None = attrs.field(default=None, repr=False)
    # Idle this long (nothing in flight, nothing asked): the engine sleeps, freeing its
    # GPU memory but keeping its GPUs, and the next request wakes it in seconds instead
    # of a cold start (docs/autoscaling.md, "Sleep"). vLLM, llama.cpp and sim; None:
    # never sleeps.
    sleep_after: Seconds | None = None

    # The GPU arithmetic, here once: the catalog's checks, placement and the agent's
    # adapters all ask these instead of multiplying themselves.

    @property
    def gpus(self) -> int:
        """GPUs one replica uses: tensor_parallel x pipeline_parallel."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def shard_gpus(self) -> int:
        """GPUs on each node a replica spans: `gpus_per_node`, else all on one node."""
        return self.gpus_per_node or self.gpus

    @property
    def node_count(self) -> int:
        """Nodes one replica spans (0 when `gpus_per_node` is below 1)."""
        return self.gpus // self.shard_gpus if self.shard_gpus >= 1 else 0


@attrs.frozen
class AutoscaleConfig:
    """A model's replica count following its demand (llmgw.control.autoscale,
    docs/autoscaling.md), between `min_replicas` and `max_replicas`."""

    min_replicas: int
    max_replicas: int
    # No request in flight, queued or finished for this long: down to min_replicas.
    idle_timeout: Seconds = Seconds(600.0)
    # The pool saturation (the router's, 0..1) to scale around: sustained above it
    # (or requests queueing) adds replicas, sustained well below it removes one.
    target_saturation: float = 0.7
    # How long a signal must hold before a scale up (down) and how long after any
    # change the next one waits: the hysteresis that keeps the count from flapping.
    scale_up_window: Seconds = Seconds(30.0)
    scale_down_window: Seconds = Seconds(300.0)
    # A starting replica counts as capacity this long (no further scale up meanwhile).
    cold_start_timeout: Seconds = Seconds(600.0)


@attrs.frozen
class ModelConfig:
    """A model clients name; with deployment profiles, the control plane runs it."""

    name: str
    # Other names clients may use for it.
    aliases: tuple[str, ...] = ()
    # Models tried in order when none of its replicas can take a request.
    fallbacks: tuple[str, ...] = ()
    # A name from router.profiles; router.default_profile when unset.
    routing_profile: str | None = None
    # Without `autoscale`: the replicas to run. With it: the count to start with
    # (raised to min_replicas), from where the autoscaler takes over.
    replicas: int = 1
    # Ways to run it, in order of preference; none: served by [[endpoints]] only.
    profiles: tuple[DeploymentProfile, ...] = ()
    autoscale: AutoscaleConfig | None = None
