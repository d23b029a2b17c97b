"""What `llmgw-sim` is started with."""

from __future__ import annotations

import attrs

from llmgw.sim.faults import Faults
from llmgw.sim.metrics import MetricsFormat
from llmgw.sim.model import EngineConfig


@attrs.frozen
class SimConfig:
    """Everything `llmgw-sim` is started with."""

    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[str, ...] = ("sim-model",)
    engine: EngineConfig = attrs.Factory(EngineConfig)
    metrics_format: MetricsFormat = "vllm"
    default_max_tokens: int = 16
    embedding_dim: int = 384
    faults: Faults = attrs.Factory(Faults)
    #: The personality the defaults came from (llmgw.sim.personalities), if any.
    personality: str | None = None
    #: Like vLLM's ``--api-key``: the API routes want ``Authorization: Bearer <it>``
    #: (health, version, metrics and the sim's own routes stay open).
    api_key: str | None = attrs.field(default=None, repr=False)
    #: Whether ``/v1/messages`` (Anthropic's API) is served natively; None: as the
    #: engine the metrics look like does (llama.cpp yes; vLLM before it had one, no).
    messages: bool | None = None
    #: vLLM's sleep mode (``--enable-sleep-mode`` in its dev mode): POST /sleep,
    #: POST /wake_up (taking `wake_delay` seconds), GET /is_sleeping; asleep, it
    #: answers generation requests 503.
    sleep_mode: bool = False
    wake_delay: float = 1.0
    #: Publish KV-cache events as vLLM does (ZMQ PUB, bound here; port 0 picks one):
    #: llmgw.sim.kv_publisher. None: off.
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    #: vLLM's replay_endpoint: a ROUTER socket answering "every batch from N on".
    kv_events_replay_endpoint: str | None = None

    @property
    def serves_messages(self) -> bool:
        return self.metrics_format == "llamacpp" if self.messages is None else self.messages
