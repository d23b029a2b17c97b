"""An engine's prefix cache as the engine itself announces it (its KV-cache events,
:mod:`llmgw.domain.kv_events`): which blocks of tokens it holds, exactly.

The engine names a block by its own hash (vLLM: sha256 or a builtin hash, seeded per
process, over the parent's hash, the tokens and extra keys). The index does not
reproduce it: each stored block is re-keyed by the router's own chained hash of its
tokens (:func:`own_hash`: the parent's own hash and the block's token ids), and the
engine's hash is kept only to find the block again when the engine removes it. A
request's token ids, cut in blocks and chained the same way (:func:`chain`), are then
looked up directly: :meth:`BlockIndex.held` is how many of its leading blocks the
engine holds.

A stored block whose parent the index does not know (its announcement was missed: a
gap, or a router that connected after the engine had cached it) cannot be keyed and is
skipped (counted as ``orphan``). So are blocks keyed by more than their tokens (a LoRA
adapter, multimodal inputs, a cache salt: ``ignored``), which a request's token ids
alone cannot name. Memory is bounded by `max_blocks` per endpoint, the oldest stored
first out.

Pure: no I/O, no clock. One per endpoint, driven from the trio thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from llmgw.domain.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    Event,
)

__all__ = ["ROOT", "BlockIndex", "chain", "own_hash"]

#: The own hash a prompt's first block is chained to.
ROOT = 0


def own_hash(parent: int, tokens: Sequence[int]) -> int:
    """The router's key of a block of `tokens` after the prefix `parent` names.
    (Python's hash of a tuple of ints is not salted: the same in every process.)"""
    return hash((parent, tuple(tokens)))


def chain(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[int]:
    """Own hashes of the whole `block_size` blocks of `token_ids` (at most `max_blocks`)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[int] = []
    h = ROOT
    for i in range(n):
        h = own_hash(h, token_ids[i * block_size : (i + 1) * block_size])
        out.append(h)
    return out


# An engine block: where it lives (vLLM's medium: "GPU", "CPU", ...), its KV-cache
# group (hybrid models), and its hash. A prefix held in any of them counts as held.
EngineKey = tuple[str | None, int | None, BlockHash]


class BlockIndex:
    """One endpoint's cached blocks by the router's own hash, from its engine's events."""

    __slots__ = ("_by_engine", "_own", "block_size", "max_blocks")

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        #: Tokens per block, learnt from the events (None until the first BlockStored).
        self.block_size: int | None = None
        # Engine block -> own hash, oldest stored first (the bound evicts from there).
        self._by_engine: OrderedDict[EngineKey, int] = OrderedDict()
        # Own hash -> how many engine blocks hold it (a GPU block and its CPU copy).
        self._own: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._by_engine)

    def held(self, own_chain: Sequence[int]) -> int:
        """How many leading blocks of `own_chain` the engine holds."""
        n = 0
        for h in own_chain:
            if h not in self._own:
                break
            n += 1
        return n

    def clear(self) -> None:
        self._by_engine.clear()
        self._own.clear()

    def apply(self, event: Event) -> str:
        """Take one event; returns what it was counted as: ``stored``, ``removed``,
        ``cleared``, ``orphan`` (a stored block whose parent is unknown), ``ignored``
        (keyed by more than tokens) or ``resized`` (a new block size: what was held
        under the old one is forgotten)."""
        if isinstance(event, AllBlocksCleared):
            self.clear()
            return "cleared"
        if isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                self._drop((event.medium, event.group, h))
            return "removed"
        return self._store(event)

    def _store(self, event: BlockStored) -> str:
        if event.keyed_by_more:
            return "ignored"
        outcome = "stored"
        if self.block_size != event.block_size:
            if self.block_size is not None:
                self.clear()
                outcome = "resized"
            self.block_size = event.block_size
        medium, group = event.medium, event.group
        if event.parent_block_hash is None:
            parent = ROOT
        else:
            known = self._by_engine.get((medium, group, event.parent_block_hash))
            if known is None:
                return "orphan"
            parent = known
        size = event.block_size
        for i, engine_hash in enumerate(event.block_hashes):
            parent = own_hash(parent, event.token_ids[i * size : (i + 1) * size])
            self._put((medium, group, engine_hash), parent)
        return outcome

    def _put(self, key: EngineKey, own: int) -> None:
        old = self._by_engine.get(key)
        if old is not None:
            if old == own:
                self._by_engine.move_to_end(key)
                return
            self._drop(key)
        self._by_engine[key] = own
        self._own[own] = self._own.get(own, 0) + 1
        while len(self._by_engine) > self.max_blocks:
            oldest = next(iter(self._by_engine))
            self._drop(oldest)

    def _drop(self, key: EngineKey) -> None:
        own = self._by_engine.pop(key, None)
        if own is None:
            return
        left = self._own[own] - 1
        if left:
            self._own[own] = left
        else:
            del self._own[own]
