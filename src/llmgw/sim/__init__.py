"""A simulated LLM engine that behaves like a vLLM replica under load.

``model`` is the pure engine (continuous batching, paged KV cache, prefix cache);
``server`` serves it over the OpenAI HTTP API with vLLM's side endpoints and fault
injection; ``metrics`` exposes vLLM- or SGLang-format Prometheus metrics; ``tokens``
is the approximate tokenizer.
"""

from llmgw.sim.model import Engine, EngineConfig, Request
from llmgw.sim.server import Faults, SimApp, SimConfig, serve

__all__ = ["Engine", "EngineConfig", "Faults", "Request", "SimApp", "SimConfig", "serve"]
