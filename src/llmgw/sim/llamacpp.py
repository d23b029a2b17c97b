"""llama-server's ``GET /props`` and ``GET /slots``, for the ``llamacpp`` metrics format.

The shapes are those of llama-server build b11434 (the build llmgw's tests run; read
off a running one and its ``server-context.cpp``), trimmed to what a router or an
operator reads:

* ``/props``: ``total_slots`` (``-np``), ``default_generation_settings`` with
  ``n_ctx`` (the context of one slot: ``max_model_len`` here) and ``params`` (the
  sampling defaults), ``model_alias``, ``model_path``, ``modalities``, which
  endpoints are on, ``chat_template``, ``bos_token`` / ``eos_token``,
  ``build_info``, ``is_sleeping``.
* ``/slots``: one object per slot: ``id``, ``n_ctx``, ``speculative``,
  ``is_processing``; a slot that holds a sequence adds ``id_task``,
  ``n_prompt_tokens``, ``n_prompt_tokens_processed``, ``n_prompt_tokens_cache``,
  ``params`` and ``next_token`` (``n_remain``, ``n_decoded``). (llama-server keeps
  showing a slot's last task after it finished; the simulator shows running ones.)

The simulator does not pin a request to a slot the way llama-server does (its batch
is its running list), so :class:`SlotTable` gives each running sequence the lowest
free slot id when it is first seen and keeps it there until it leaves the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw.sim.model import EngineConfig, Running

__all__ = ["CHAT_TEMPLATE", "SlotTable", "generation_params", "props"]

#: The Jinja equivalent of :func:`llmgw.sim.tokens.render_chat`.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] "
    "+ '\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}"
)
#: llama.cpp's LLAMA_DEFAULT_SEED (0xFFFFFFFF: a random seed per request).
DEFAULT_SEED = 4294967295


def generation_params(max_tokens: int = -1) -> dict[str, Any]:
    """llama-server's sampling defaults, as its ``params`` objects show them (the
    simulator's output does not depend on them; -1 means no output limit)."""
    return {
        "seed": DEFAULT_SEED,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": max_tokens,
        "n_predict": max_tokens,
        "n_keep": 0,
        "ignore_eos": False,
        "stream": False,
        "n_probs": 0,
        "min_keep": 0,
    }


def props(models: Sequence[str], engine: EngineConfig, build: str) -> dict[str, Any]:
    """The ``GET /props`` body of a simulator serving `models` with `engine`."""
    return {
        "default_generation_settings": {
            "params": generation_params(),
            "n_ctx": engine.max_model_len,
        },
        "total_slots": engine.max_num_seqs,
        "model_alias": models[0],
        "model_path": models[0],
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "ui": False,
        "chat_template": CHAT_TEMPLATE,
        "bos_token": "",
        "eos_token": "",
        "build_info": build,
        "is_sleeping": False,
    }


class SlotTable:
    """Which slot each running sequence occupies (see the module docstring)."""

    def __init__(self, total: int, n_ctx: int) -> None:
        self.total = total
        self.n_ctx = n_ctx
        self._slot: dict[str, tuple[int, int]] = {}  # request id -> (slot id, task id)
        self._tasks = 0

    def update(self, running: Sequence[Running]) -> dict[int, tuple[Running, int]]:
        """Slot id -> (sequence, task id) for the running batch `running`."""
        live = {r.request_id for r in running}
        for rid in [rid for rid in self._slot if rid not in live]:
            del self._slot[rid]
        used = {slot for slot, _ in self._slot.values()}
        out: dict[int, tuple[Running, int]] = {}
        for r in running:
            if r.request_id not in self._slot:
                free = next((i for i in range(self.total) if i not in used), None)
                if free is None:
                    continue  # more sequences than slots: the engine never allows it
                used.add(free)
                self._tasks += 1
                self._slot[r.request_id] = (free, self._tasks)
            slot, task = self._slot[r.request_id]
            out[slot] = (r, task)
        return out

    def slots(self, running: Sequence[Running]) -> list[dict[str, Any]]:
        """The ``GET /slots`` body."""
        held = self.update(running)
        out: list[dict[str, Any]] = []
        for i in range(self.total):
            slot: dict[str, Any] = {
                "id": i,
                "n_ctx": self.n_ctx,
                "speculative": False,
                "is_processing": i in held,
            }
            if i in held:
                r, task = held[i]
                slot.update(
                    {
                        "id_task": task,
                        "n_prompt_tokens": r.prompt_tokens,
                        "n_prompt_tokens_processed": max(
                            0, min(r.computed_tokens, r.prompt_tokens) - r.cached_tokens
                        ),
                        "n_prompt_tokens_cache": r.cached_tokens,
                        "params": generation_params(r.max_tokens),
                        "next_token": [
                            {
                                "has_next_token": True,
                                "has_new_line": False,
                                "n_remain": r.max_tokens - r.output_tokens,
                                "n_decoded": r.output_tokens,
                            }
                        ],
                    }
                )
            out.append(slot)
        return out

    def idle(self, running: Sequence[Running]) -> int:
        return self.total - len(self.update(running))
