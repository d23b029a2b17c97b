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
    "BaseAdapter",
    "EngineAdapter",
    "LaunchSpec",
    "LlamaCppAdapter",
    "SglangAdapter",
    "SimAdapter",
    "VllmAdapter",
    "default_adapters",
]


def default_adapters() -> dict[str, EngineAdapter]:
    """One of each engine, found the default way (``vllm`` on PATH, SGLang in the
    agent's interpreter, ``llama-server`` from ``$LLAMA_SERVER_BIN``, the build cache
    or PATH, the simulator always), in the registry's order."""
    return {name: cast(EngineAdapter, e.adapter_class()()) for name, e in ENGINES.items()}
