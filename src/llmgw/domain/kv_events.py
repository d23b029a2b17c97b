"""vLLM's KV-cache events on the wire: what an engine publishes when its prefix cache
stores, evicts or forgets blocks, as llmgw-sim writes it and the router reads it.

The facts, from vLLM's ``vllm/distributed/kv_events.py`` (read, not copied):

* A ZMQ PUB socket sends one message per engine step that changed the cache, in three
  frames: the topic (``--kv-events-config``'s ``topic``, empty by default), the
  sequence number (8 bytes, big-endian, unsigned, counting from 0 when the publisher
  starts) and the payload.
* The payload is msgpack: a batch ``(ts, events, data_parallel_rank)``. Events are
  msgspec structs tagged with their class name: ``BlockStored`` (block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, then
  optional extra_keys, group_idx, ...), ``BlockRemoved`` (block_hashes, medium, then
  optional group_idx) and ``AllBlocksCleared`` (nothing).
* vLLM releases differ in the encoding: earlier ones declare the structs
  ``array_like`` (a batch is ``[ts, [events], rank]`` and an event
  ``["BlockStored", hashes, ...]``, the tag first); the current source encodes maps
  (``{"ts": ..., "events": [{"type": "BlockStored", "block_hashes": ...}]}``). Both
  are read here. A block hash is an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) or
  32 bytes (a sha256 digest).
* ``BlockStored.token_ids`` holds the tokens of all its blocks in order,
  ``block_size`` of them per hash; ``parent_block_hash`` names the block before the
  first (None for a prompt's first block).
* With a ``replay_endpoint``, a ZMQ ROUTER socket answers a request (one frame: the
  first sequence number wanted, 8 bytes big-endian) with every batch it still
  buffers from there, each as (sequence number, payload), then (-1 signed, empty).

:func:`decode_batch` is strict: anything that is not such a batch raises
:class:`MalformedBatch`, so one bad message costs that message, never the reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

__all__ = [
    "END_SEQ",
    "SEQ_BYTES",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "MalformedBatch",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
]

#: The sequence number frame's width.
SEQ_BYTES = 8
#: The sequence number frame that ends a replay (-1, signed), with an empty payload.
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)

BlockHash = int | bytes


class MalformedBatch(ValueError):
    """A payload that is not a KV-event batch."""


@attrs.frozen
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    #: Set when the engine's key for these blocks holds more than their tokens (a LoRA
    #: adapter, multimodal inputs, a cache salt): a router keying blocks by their
    #: tokens alone must not take them for a plain prompt's.
    keyed_by_more: bool = False
    #: The LoRA adapter the blocks were computed with, if named.
    lora_name: str | None = None
    #: The KV-cache group (hybrid models keep one per attention kind), if given.
    group: int | None = None


@attrs.frozen
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group: int | None = None


@attrs.frozen
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@attrs.frozen
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


# -- writing (llmgw-sim): the array form of vLLM's earlier releases -----------------------


def _event_wire(event: Event) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            None,  # lora_id
            event.medium,
            event.lora_name,
            None,  # extra_keys
            event.group,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium, event.group]
    return ["AllBlocksCleared"]


_encoder = msgspec.msgpack.Encoder()


def encode_batch(batch: EventBatch) -> bytes:
    """`batch` as vLLM's array-like msgpack payload."""
    wire: list[Any] = [batch.ts, [_event_wire(e) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        wire.append(batch.data_parallel_rank)
    return _encoder.encode(wire)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise MalformedBatch(f"a sequence number is {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


# -- reading (the router): either form, strictly ---------------------------------------------

_decoder = msgspec.msgpack.Decoder()

# Field order of the array form, after the tag.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_MAX_BLOCK_SIZE = 1 << 16


def _fields(raw: Any, order: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """An event's tag and its fields by name, from either encoding."""
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, values = raw[0], raw[1:]
        if tag == "BlockStored":
            order = _STORED_FIELDS
        elif tag == "BlockRemoved":
            order = _REMOVED_FIELDS
        # Trailing optional fields the order above does not name are ignored.
        return tag, dict(zip(order, values, strict=False))
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], raw
    raise MalformedBatch("an event is neither a tagged array nor a tagged map")


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise MalformedBatch(f"a block hash must be an int or bytes, got {type(value).__name__}")
    if isinstance(value, bytes) and not 1 <= len(value) <= 64:
        raise MalformedBatch("a block hash of bytes must be 1..64 bytes")
    return value


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise MalformedBatch("block_hashes must be a list")
    return tuple(_hash(v) for v in value)


def _medium(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MalformedBatch("medium must be a string or null")
    return value


def _optional_int(value: Any, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise MalformedBatch(f"{name} must be an int or null")
    return value


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MalformedBatch(f"{name} must be a string or null")
    return value


def _event(raw: Any) -> Event:
    tag, f = _fields(raw, ())
    if tag == "BlockStored":
        hashes = _hashes(f.get("block_hashes"))
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids")
        size = f.get("block_size")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise MalformedBatch("token_ids must be a list of ints")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= _MAX_BLOCK_SIZE:
            raise MalformedBatch(f"block_size must be 1..{_MAX_BLOCK_SIZE}")
        if len(tokens) != size * len(hashes):
            raise MalformedBatch(
                f"{len(hashes)} blocks of {size} tokens, but {len(tokens)} token ids"
            )
        extra = f.get("extra_keys")
        more = (
            f.get("lora_id") is not None
            or f.get("lora_name") is not None
            # One entry per block; all None adds nothing to the tokens.
            or (extra is not None and (not isinstance(extra, list) or any(extra)))
        )
        return BlockStored(
            hashes,
            None if parent is None else _hash(parent),
            tuple(tokens),
            size,
            _medium(f.get("medium")),
            more,
            _optional_str(f.get("lora_name"), "lora_name"),
            _optional_int(f.get("group_idx"), "group_idx"),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(
            _hashes(f.get("block_hashes")),
            _medium(f.get("medium")),
            _optional_int(f.get("group_idx"), "group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedBatch(f"unknown event type {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """A payload frame as a batch; :class:`MalformedBatch` for anything else."""
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from None
    if isinstance(raw, list) and len(raw) in (2, 3):
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise MalformedBatch("a batch is [ts, events, rank] or a map of them")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise MalformedBatch("ts must be a number")
    if not isinstance(events, list):
        raise MalformedBatch("events must be a list")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise MalformedBatch("data_parallel_rank must be an int or null")
    return EventBatch(float(ts), tuple(_event(e) for e in events), rank)
