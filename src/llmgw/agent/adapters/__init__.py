"""Engine adapters: one per engine the agent can launch (vLLM, SGLang, llama.cpp, the
simulator)."""

from __future__ import annotations

from typing import cast

from llmgw.agent.adapters.base import BaseAdapter, EngineAdapter, LaunchSpec
from llmgw.agent.adapters.llamacpp import LlamaCppAdapter
from llmgw.agent.adapters.sglang import SglangAdapter
from llmgw.agent.adapters.sim import SimAdapter
from llmgw.agent.adapters.vllm import VllmAdapter
from llmgw.domain.engines import ENGINES

__all__ = [
    "ADAPTERS",
    "BaseAdapter",
    "EngineAdapter",
    "LaunchSpec",
    "LlamaCppAdapter",
    "SglangAdapter",
    "SimAdapter",
    "VllmAdapter",
    "default_adapters",
]

#: Each engine's adapter class under the engine's name in the registry
#: (llmgw.domain.engines), which names no adapter: the registry sits below the agent.
#: A new engine is an entry there and its adapter here.
ADAPTERS: dict[str, type[BaseAdapter]] = {
    a.name: a for a in (VllmAdapter, SglangAdapter, SimAdapter, LlamaCppAdapter)
}


def default_adapters() -> dict[str, EngineAdapter]:
    """One of each engine, found the default way (``vllm`` on PATH, SGLang in the
    agent's interpreter, ``llama-server`` from ``$LLAMA_SERVER_BIN``, the build cache
    or PATH, the simulator always), in the registry's order."""
    # BaseAdapter leaves `available` and `command` to each engine's class.
    return {name: cast(EngineAdapter, ADAPTERS[name]()) for name in ENGINES}
