"""A simulated LLM engine that behaves like a vLLM replica under load.

``model`` is the pure engine (continuous batching, paged KV cache, prefix cache);
``server`` serves it over the OpenAI HTTP API with vLLM's side endpoints and fault
injection; ``metrics`` exposes vLLM-, SGLang- or llama.cpp-format Prometheus metrics;
``tokens`` is the approximate tokenizer; ``render`` is vLLM's render endpoints;
``llamacpp`` is llama-server's ``/props`` and ``/slots``; ``personalities`` is the
engine zoo (defaults resembling vLLM, SGLang, llama.cpp and two stress shapes).
"""

from llmgw.sim.model import Engine, EngineConfig, Request
from llmgw.sim.personalities import PERSONALITIES, Personality
from llmgw.sim.server import Faults, SimApp, SimConfig, serve

__all__ = [
    "PERSONALITIES",
    "Engine",
    "EngineConfig",
    "Faults",
    "Personality",
    "Request",
    "SimApp",
    "SimConfig",
    "serve",
]
