"""A simulated LLM engine that behaves like a vLLM replica under load.

``model`` is the pure engine (continuous batching, paged KV cache, prefix cache) and
``driver`` runs it in real time; ``server`` serves it over the OpenAI HTTP API, its
routes in ``generation``, ``pooling``, ``tokenizing`` and ``info`` (``wire`` is their
HTTP plumbing, ``parsing`` what a request asks for, ``state`` what they share), with
fault injection (``faults``); ``config`` is what it is started with; ``metrics``
exposes vLLM-, SGLang- or llama.cpp-format Prometheus metrics; ``tokens`` is the
approximate tokenizer; ``render`` is vLLM's render endpoints; ``llamacpp`` is
llama-server's ``/props`` and ``/slots``; ``responses`` is the Responses API's shapes
and store; ``personalities`` is the engine zoo (defaults resembling vLLM, SGLang,
llama.cpp and two stress shapes).
"""

from llmgw.sim.config import SimConfig
from llmgw.sim.faults import Faults
from llmgw.sim.model import Engine, EngineConfig, Request
from llmgw.sim.personalities import PERSONALITIES, Personality
from llmgw.sim.server import SimApp, serve

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
