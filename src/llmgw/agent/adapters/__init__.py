"""Engine adapters: one per engine the agent can launch (vLLM, SGLang, llama.cpp, the
simulator)."""

from __future__ import annotations

from llmgw.agent.adapters.base import BaseAdapter, EngineAdapter, LaunchSpec
from llmgw.agent.adapters.llamacpp import LlamaCppAdapter
from llmgw.agent.adapters.sglang import SglangAdapter
from llmgw.agent.adapters.sim import SimAdapter
from llmgw.agent.adapters.vllm import VllmAdapter

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
    or PATH, the simulator always)."""
    return {
        "vllm": VllmAdapter(),
        "sglang": SglangAdapter(),
        "llamacpp": LlamaCppAdapter(),
        "sim": SimAdapter(),
    }
