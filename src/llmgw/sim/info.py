"""The engine's side endpoints about itself: vLLM's (health, version, metrics,
models, prefix-cache reset), SGLang's (model and server info) and, only where the
metrics look like llama.cpp's, llama-server's (``/props``, ``/slots``)."""

from __future__ import annotations

import urllib.parse

import trio

from llmgw.sim import llamacpp
from llmgw.sim.metrics import CONTENT_TYPES, exposition
from llmgw.sim.state import SimState
from llmgw.sim.wire import HTTPError, Receive, Scope, Send, send_bytes, send_json
from llmgw.version import __version__


class Info:
    """What the engine says about itself: health, version, metrics, models, SGLang's
    model and server info, llama-server's /props and /slots; and the prefix-cache reset."""

    def __init__(self, state: SimState) -> None:
        self.config = config = state.config
        self.engine = state.engine
        self.state = state
        self.started = state.started
        self.exposition = exposition(
            config.metrics_format,
            config.models[0],
            config.engine,
            self.engine.stats,
            state.recorder,
            trio.current_time,
        )
        self.slots = llamacpp.SlotTable(config.engine.max_num_seqs, config.engine.max_model_len)

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"", [])

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"version": __version__})

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        fmt = self.config.metrics_format
        headers = [(b"content-type", CONTENT_TYPES[fmt])]
        if fmt == "llamacpp":
            headers.append((b"process-start-time-unix", str(self.started).encode()))
        await send_bytes(send, 200, self.exposition.render(), headers)

    async def props(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's /props (llamacpp format only; see llmgw.sim.llamacpp)."""
        build = f"llmgw-sim {__version__}"
        await send_json(send, 200, llamacpp.props(self.config.models, self.config.engine, build))

    async def slot_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's /slots; ``?fail_on_no_slot=1`` answers 503 when all are busy."""
        running = self.engine.running()
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if any(query.get("fail_on_no_slot", [])) and self.slots.idle(running) == 0:
            raise HTTPError(503, "no slot available", type="unavailable_error")
        await send_json(send, 200, self.slots.slots(running))

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.started,
                "owned_by": "llmgw-sim",
                "root": self.config.models[0],
                "parent": None,
                "max_model_len": self.config.engine.max_model_len,
            }
            for name in self.config.models
        ]
        await send_json(send, 200, {"object": "list", "data": data})

    async def reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.engine.reset_prefix_cache()
        self.state.flush_kv_events()
        await send_bytes(send, 200, b"", [])

    async def model_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self.config.models[0]
        await send_json(
            send,
            200,
            {
                "model_path": name,
                "tokenizer_path": name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            },
        )

    async def server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        cfg = self.config.engine
        await send_json(
            send,
            200,
            {
                "version": f"llmgw-sim {__version__}",
                "model_path": self.config.models[0],
                "served_model_name": self.config.models[0],
                "max_running_requests": cfg.max_num_seqs,
                "max_total_num_tokens": cfg.num_blocks * cfg.block_size,
                "page_size": cfg.block_size,
                "context_length": cfg.max_model_len,
                "chunked_prefill_size": cfg.max_num_batched_tokens,
                "disable_radix_cache": not cfg.enable_prefix_caching,
                "tp_size": 1,
                "dp_size": 1,
                "host": self.config.host,
                "port": self.config.port,
            },
        )
