"""The engine zoo: simulator settings that resemble real engines.

llmgw's routing has to be measured on engines it was not tuned to, so ``llmgw-sim
--personality NAME`` starts the simulator with defaults resembling one. A personality
only sets defaults: every flag given explicitly still wins, and without a personality
the simulator is exactly what it always was (``EngineConfig()``'s values, vLLM
metrics). The values are plausible starting points, not measurements of any one
model on any one GPU.

* ``vllm``: a vLLM replica. 256 sequences (``max_num_seqs``), a large KV cache (16384
  blocks of 16 tokens, 262,144 tokens), an 8192-token step budget (vLLM's online
  default on a large GPU), ~10 ms engine steps (10 ms plus 0.04 ms per decoding
  sequence: ~20 ms with the batch full), 50 us per uncached prompt token, prefix
  caching on, vLLM's metric names.
* ``sglang``: an SGLang replica. 512 running requests, a larger KV pool (32768 blocks,
  524,288 tokens), 8192-token chunked prefill, 32768-token context, 8 ms steps plus
  0.03 ms per sequence, 40 us per prompt token, radix cache on, SGLang's metric names.
  (SGLang pages its cache per token by default; the simulator keeps 16-token blocks,
  which only coarsens what counts as a shared prefix.)
* ``llamacpp``: a ``llama-server -np 4 -c 16384``: 4 slots, 16,384 tokens of context
  shared out as 4096 per slot (``max_model_len``, and 1024 blocks of 16 for the
  cache), a 2048-token batch (``-b``), 15 ms steps plus 2 ms per sequence and 250 us
  per prompt token (a quantized 7-8B model on a workstation GPU), its prompt cache on,
  llama.cpp's metric names only (see :mod:`llmgw.sim.metrics`) and its ``GET /props``
  and ``GET /slots``.
* ``small-cache``: a replica whose KV cache (512 blocks, 8192 tokens) holds about two
  tenants' 2,000-token prefixes (2 x 125 blocks) next to a modest batch (16
  sequences of ~200 private tokens, ~13 blocks each): a third tenant's prefix evicts
  one of the two, so where a prefix is placed matters a lot. 4096-token context,
  2048-token step budget.
* ``prefill-heavy``: slow prefill (400 us per uncached prompt token: a 2,000-token
  cold prompt costs 0.8 s) next to fast decode steps (4 ms plus 0.1 ms per sequence),
  so time to first token is dominated by cache misses.

Use :func:`get` for a :class:`Personality`; its :meth:`Personality.engine_config`
builds the ``EngineConfig`` with explicit overrides on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from llmgw.sim.metrics import MetricsFormat
from llmgw.sim.model import EngineConfig

__all__ = ["NAMES", "PERSONALITIES", "Personality", "engine_config", "get"]


def _frozen_mapping(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


@attrs.frozen
class Personality:
    """Defaults that make the simulator resemble one kind of engine."""

    name: str
    #: One line for ``--help``.
    summary: str
    metrics_format: MetricsFormat
    #: ``EngineConfig`` fields this personality sets (the rest keep their defaults).
    engine: Mapping[str, Any] = attrs.field(converter=_frozen_mapping)

    def __attrs_post_init__(self) -> None:
        unknown = set(self.engine) - set(attrs.fields_dict(EngineConfig))
        if unknown:
            raise ValueError(f"personality {self.name}: unknown engine fields {sorted(unknown)}")

    def engine_config(self, **explicit: Any) -> EngineConfig:
        """This personality's engine, with `explicit` fields (not None) on top."""
        return engine_config(self, **explicit)


def engine_config(personality: Personality | None, **explicit: Any) -> EngineConfig:
    """``EngineConfig`` defaults, then `personality`'s values, then `explicit` ones
    (a None in `explicit` means "not given" and is skipped)."""
    values: dict[str, Any] = dict(personality.engine) if personality is not None else {}
    values.update({k: v for k, v in explicit.items() if v is not None})
    return EngineConfig(**values)


PERSONALITIES: Mapping[str, Personality] = MappingProxyType(
    {
        p.name: p
        for p in (
            Personality(
                name="vllm",
                summary="a vLLM replica: 256 seqs, 16384 KV blocks, ~10 ms steps, vLLM metrics",
                metrics_format="vllm",
                engine={
                    "max_num_seqs": 256,
                    "num_blocks": 16384,
                    "max_num_batched_tokens": 8192,
                    "max_model_len": 16384,
                    "prefill_us_per_token": 50.0,
                    "decode_step_ms": 10.0,
                    "decode_ms_per_seq": 0.04,
                    "enable_prefix_caching": True,
                },
            ),
            Personality(
                name="sglang",
                summary="an SGLang replica: 512 running requests, 32768 KV blocks, SGLang metrics",
                metrics_format="sglang",
                engine={
                    "max_num_seqs": 512,
                    "num_blocks": 32768,
                    "max_num_batched_tokens": 8192,
                    "max_model_len": 32768,
                    "prefill_us_per_token": 40.0,
                    "decode_step_ms": 8.0,
                    "decode_ms_per_seq": 0.03,
                    "enable_prefix_caching": True,
                },
            ),
            Personality(
                name="llamacpp",
                summary="llama-server -np 4: 4 slots of 4096 tokens, llama.cpp metrics only, "
                "/props and /slots",
                metrics_format="llamacpp",
                engine={
                    "max_num_seqs": 4,
                    "num_blocks": 1024,
                    "max_num_batched_tokens": 2048,
                    "max_model_len": 4096,
                    "prefill_us_per_token": 250.0,
                    "decode_step_ms": 15.0,
                    "decode_ms_per_seq": 2.0,
                    "enable_prefix_caching": True,
                },
            ),
            Personality(
                name="small-cache",
                summary="512 KV blocks: room for ~2 tenants' 2000-token prefixes next to a "
                "16-seq batch",
                metrics_format="vllm",
                engine={
                    "max_num_seqs": 16,
                    "num_blocks": 512,
                    "max_num_batched_tokens": 2048,
                    "max_model_len": 4096,
                },
            ),
            Personality(
                name="prefill-heavy",
                summary="400 us per uncached prompt token, 4 ms decode steps",
                metrics_format="vllm",
                engine={
                    "prefill_us_per_token": 400.0,
                    "decode_step_ms": 4.0,
                    "decode_ms_per_seq": 0.1,
                },
            ),
        )
    }
)

NAMES: tuple[str, ...] = tuple(PERSONALITIES)


def get(name: str) -> Personality:
    """The personality called `name`; ValueError naming the known ones otherwise."""
    try:
        return PERSONALITIES[name]
    except KeyError:
        raise ValueError(f"unknown personality {name!r} (known: {', '.join(NAMES)})") from None
