"""The engine registry: one entry per engine llmgw can run, with everything the other
parts ask about it, so that adding an engine is one entry (and its agent adapter).

Readers: the catalog's rules (known engines, who takes an API key, who sleeps),
placement (which may run on a node without GPUs), the router and the agent's drain
(which metric dialect a ``/metrics`` page speaks: :mod:`llmgw.domain.engine_metrics`),
the reconciler (where an engine's API key goes, who puts it to sleep) and the agent
(its adapters, :func:`llmgw.agent.adapters.default_adapters`).
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import attrs

__all__ = ["DIALECTS", "ENGINES", "Dialect", "Engine", "Sleeper", "cpu_engines"]

#: The metric names an engine's ``/metrics`` page uses (their prefix: ``vllm:``, ...).
Dialect = Literal["vllm", "sglang", "llamacpp"]
#: Who puts an idle engine to sleep (a profile's `sleep_after`): "router", llmgw's
#: router through the engine's sleep API, waking it before the next request; "engine",
#: the engine on its own, waking at its next request.
Sleeper = Literal["router", "engine"]


@attrs.frozen
class Engine:
    """One engine llmgw can run, as every part of llmgw needs to know it."""

    name: str
    # May run on a node without GPUs (placement's CPU-capable profiles), and needs no
    # GPU from the agent.
    cpu: bool
    # What its /metrics page speaks: the simulator imitates vLLM's by default.
    metrics: Dialect
    # The environment variable it reads its API key from. None: it takes the key only
    # on its command line, where any user of the node could read it, so a profile's
    # api_key is refused for it.
    api_key_env: str | None
    # Who puts it to sleep; None: it does not sleep under llmgw.
    sleeps: Sleeper | None
    # Its agent adapter class, "module:Class": resolved only by the agent, so this
    # package imports nothing above it.
    adapter: str

    def adapter_class(self) -> Any:
        """The adapter class (typed Any: its Protocol lives in llmgw.agent, above)."""
        module, _, name = self.adapter.partition(":")
        return getattr(importlib.import_module(module), name)


#: Every engine by name, in the order errors and documents list them.
ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        # vLLM's --api-key default is VLLM_API_KEY; its sleep mode is driven by the router.
        Engine(
            "vllm",
            cpu=False,
            metrics="vllm",
            api_key_env="VLLM_API_KEY",
            sleeps="router",
            adapter="llmgw.agent.adapters.vllm:VllmAdapter",
        ),
        # SGLang's memory release is not used yet.
        Engine(
            "sglang",
            cpu=False,
            metrics="sglang",
            api_key_env=None,
            sleeps=None,
            adapter="llmgw.agent.adapters.sglang:SglangAdapter",
        ),
        # llmgw-sim imitates vLLM, its sleep API too.
        Engine(
            "sim",
            cpu=True,
            metrics="vllm",
            api_key_env="LLMGW_SIM_API_KEY",
            sleeps="router",
            adapter="llmgw.agent.adapters.sim:SimAdapter",
        ),
        # llama-server: a CPU build; it sleeps on its own (--sleep-idle-seconds).
        Engine(
            "llamacpp",
            cpu=True,
            metrics="llamacpp",
            api_key_env="LLAMA_API_KEY",
            sleeps="engine",
            adapter="llmgw.agent.adapters.llamacpp:LlamaCppAdapter",
        ),
    )
}

#: Every metric dialect, in registry order: what a /metrics page is recognised as.
DIALECTS: tuple[Dialect, ...] = tuple(dict.fromkeys(e.metrics for e in ENGINES.values()))


def cpu_engines() -> frozenset[str]:
    """The engines that may run without a GPU."""
    return frozenset(name for name, e in ENGINES.items() if e.cpu)
