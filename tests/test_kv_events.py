"""KV-cache events: vLLM's wire format (llmgw.domain.kv_events), the router's exact
index of an engine's blocks (llmgw.router.kv_index), a feed's sequence numbers and
health (llmgw.router.kv_events), and the simulator's side of it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from llmgw.config import EndpointConfig
from llmgw.domain.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedBatch,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
)
from llmgw.http.engine_client import EngineClient
from llmgw.router.kv_events import Exact, KVEvents, replay_from, tokenize_body
from llmgw.router.kv_index import BlockIndex, chain
from llmgw.sim.model import Engine, EngineConfig, Request
from llmgw_cli.server import parse_endpoint
from tests.raw_engine import RawEngine, ok

# -- vLLM's schema, rebuilt from the struct layout in vllm/distributed/kv_events.py ----------
# (BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
# lora_name, extra_keys=None, group_idx=None, ...; BlockRemoved: block_hashes, medium,
# group_idx=None; AllBlocksCleared; the batch: ts, events, data_parallel_rank=None.
# Events are tagged with their class name. Earlier releases declare every struct
# array_like; the current source encodes maps.)

Hash = int | bytes


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class _MapEvent(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


class ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[ArrayStored | ArrayRemoved | ArrayCleared]
    data_parallel_rank: int | None = None


class MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


class MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[MapStored | MapRemoved | MapCleared]
    data_parallel_rank: int | None = None


def _structs(array_like: bool) -> tuple[Any, Any, Any, Any]:
    if array_like:
        return ArrayBatch, ArrayStored, ArrayRemoved, ArrayCleared
    return MapBatch, MapStored, MapRemoved, MapCleared


def _vllm_batch(array_like: bool, hashes: tuple[Hash, Hash] = (11, 12)) -> bytes:
    batch, stored, removed, cleared = _structs(array_like)
    return msgspec.msgpack.encode(
        batch(
            1.5,
            [
                stored(list(hashes), None, [1, 2, 3, 4], 2, None, "GPU", None),
                removed([hashes[0]], "GPU"),
                cleared(),
            ],
            0,
        )
    )


EXPECTED = EventBatch(
    1.5,
    (
        BlockStored((11, 12), None, (1, 2, 3, 4), 2, "GPU"),
        BlockRemoved((11,), "GPU"),
        AllBlocksCleared(),
    ),
    0,
)

# The array form's bytes, recorded from msgspec encoding the structs above (vLLM's
# layout) for that batch: [1.5, [["BlockStored", [11, 12], nil, [1, 2, 3, 4], 2, nil,
# "GPU", nil, nil, nil], ["BlockRemoved", [11], "GPU", nil], ["AllBlocksCleared"]], 0].
RECORDED = bytes.fromhex(
    "93cb3ff8000000000000939aab426c6f636b53746f726564920b0cc0940102030402c0a3475055"
    "c0c0c094ac426c6f636b52656d6f766564910ba3475055c091b0416c6c426c6f636b73436c6561"
    "72656400"
)


def test_the_recorded_bytes_are_vllms_array_form() -> None:
    assert _vllm_batch(array_like=True) == RECORDED
    assert decode_batch(RECORDED) == EXPECTED


@pytest.mark.parametrize("array_like", [True, False], ids=["array", "map"])
def test_both_encodings_of_vllms_batch_decode(array_like: bool) -> None:
    assert decode_batch(_vllm_batch(array_like)) == EXPECTED


def test_bytes_hashes_decode_as_bytes() -> None:
    digest = (b"\x01" * 32, b"\x02" * 32)
    batch = decode_batch(_vllm_batch(False, digest))
    first = batch.events[0]
    assert isinstance(first, BlockStored) and first.block_hashes == digest


def test_what_the_sim_writes_vllms_structs_read() -> None:
    """encode_batch writes the array form vLLM's own (array-like) structs decode."""
    payload = encode_batch(EXPECTED)
    batch_type = _structs(array_like=True)[0]
    theirs = msgspec.msgpack.decode(payload, type=batch_type)
    assert [type(e) for e in theirs.events] == [ArrayStored, ArrayRemoved, ArrayCleared]
    assert theirs.events[0].token_ids == [1, 2, 3, 4]
    assert decode_batch(payload) == EXPECTED


def test_a_lora_or_extra_keyed_block_is_marked() -> None:
    batch, stored, _, _ = _structs(True)
    for lora_id, lora_name, extra in [(3, None, None), (None, "ad", None), (None, None, [["x"]])]:
        raw = msgspec.msgpack.encode(
            batch(0.0, [stored([1], None, [5, 6], 2, lora_id, "GPU", lora_name, extra)])
        )
        (event,) = decode_batch(raw).events
        assert isinstance(event, BlockStored) and event.keyed_by_more
    raw = msgspec.msgpack.encode(
        batch(0.0, [stored([1], None, [5, 6], 2, None, None, None, [None])])
    )
    (event,) = decode_batch(raw).events
    assert isinstance(event, BlockStored) and not event.keyed_by_more


def _encode(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        _encode("a string"),
        _encode([1.0]),
        _encode(["ts", []]),
        _encode([1.0, "events"]),
        _encode([1.0, [], "rank"]),
        _encode([1.0, [["Unknown"]]]),
        _encode([1.0, [[]]]),
        _encode([1.0, [{"no": "type"}]]),
        _encode([1.0, [["BlockStored", [1], None, [1, 2, 3], 2, None, None, None]]]),  # 3 != 2
        _encode([1.0, [["BlockStored", [True], None, [1, 2], 2, None, None, None]]]),
        _encode([1.0, [["BlockStored", [1.5], None, [1, 2], 2, None, None, None]]]),
        _encode([1.0, [["BlockStored", [1], None, [1, "x"], 2, None, None, None]]]),
        _encode([1.0, [["BlockStored", [1], None, [], 0, None, None, None]]]),
        _encode([1.0, [["BlockStored", [b""], None, [1, 2], 2, None, None, None]]]),
        _encode([1.0, [["BlockRemoved", "1", None]]]),
        _encode([1.0, [["BlockRemoved", [1], 7]]]),
        _encode({"ts": 1.0, "events": {}}),
    ],
)
def test_malformed_payloads_raise_one_error(payload: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(payload)


def test_sequence_numbers_are_eight_bytes_big_endian() -> None:
    assert encode_seq(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert decode_seq(encode_seq(2**63)) == 2**63
    with pytest.raises(MalformedBatch):
        decode_seq(b"\x01")


# -- the index --------------------------------------------------------------------------


def stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = 2) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size, "GPU")


def test_stored_blocks_are_found_by_the_routers_own_chain() -> None:
    index = BlockIndex(100)
    assert index.apply(stored([101, 102], None, [1, 2, 3, 4])) == "stored"
    assert index.apply(stored([103], 102, [5, 6])) == "stored"
    assert index.block_size == 2
    assert index.held(chain([1, 2, 3, 4, 5, 6, 7], 2)) == 3
    assert index.held(chain([1, 2, 3, 4, 9, 9], 2)) == 2  # diverges in block 3
    assert index.held(chain([9, 2, 3, 4, 5, 6], 2)) == 0
    # The same tokens in block 2 after another prefix are another block.
    assert index.held(chain([3, 4], 2)) == 0


def test_removal_and_clearing() -> None:
    index = BlockIndex(100)
    index.apply(stored([101, 102, 103], None, [1, 2, 3, 4, 5, 6]))
    assert index.apply(BlockRemoved((103,), "GPU")) == "removed"
    assert index.held(chain([1, 2, 3, 4, 5, 6], 2)) == 2
    index.apply(BlockRemoved((999,), "GPU"))  # unknown: nothing happens
    index.apply(BlockRemoved((101,), "CPU"))  # another medium's copy: not this one
    assert index.held(chain([1, 2, 3, 4, 5, 6], 2)) == 2
    index.apply(BlockRemoved((101,), "GPU"))
    assert index.held(chain([1, 2, 3, 4], 2)) == 0
    index.apply(stored([101, 102], None, [1, 2, 3, 4]))
    assert index.apply(AllBlocksCleared()) == "cleared"
    assert len(index) == 0 and index.held(chain([1, 2], 2)) == 0


def test_a_block_held_twice_stays_until_both_are_removed() -> None:
    index = BlockIndex(100)
    index.apply(stored([101], None, [1, 2]))
    index.apply(BlockStored((101,), None, (1, 2), 2, "CPU"))  # offloaded copy
    index.apply(BlockRemoved((101,), "GPU"))
    assert index.held(chain([1, 2], 2)) == 1
    index.apply(BlockRemoved((101,), "CPU"))
    assert index.held(chain([1, 2], 2)) == 0


def test_kv_cache_groups_are_kept_apart() -> None:
    """A hybrid model's groups hold the same block hashes: each is removed on its own."""
    index = BlockIndex(100)
    index.apply(BlockStored((101,), None, (1, 2), 2, "GPU", group=0))
    index.apply(BlockStored((101,), None, (1, 2), 2, "GPU", group=1))
    index.apply(BlockStored((102,), 101, (3, 4), 2, "GPU", group=1))  # parent: group 1's
    index.apply(BlockRemoved((101,), "GPU", group=0))
    assert index.held(chain([1, 2, 3, 4], 2)) == 2
    index.apply(BlockRemoved((101,), "GPU", group=1))
    assert index.held(chain([1, 2, 3, 4], 2)) == 0


def test_group_and_lora_name_decode() -> None:
    batch, stored_t, removed_t, _ = _structs(False)
    raw = msgspec.msgpack.encode(
        batch(
            0.0,
            [
                stored_t([1], None, [5, 6], 2, None, "GPU", "ad", None, 3),
                removed_t([1], "GPU", 3),
            ],
        )
    )
    first, second = decode_batch(raw).events
    assert isinstance(first, BlockStored) and (first.lora_name, first.group) == ("ad", 3)
    assert first.keyed_by_more
    assert second == BlockRemoved((1,), "GPU", 3)
    bad = msgspec.msgpack.encode(batch(0.0, [removed_t([1], "GPU", "three")]))
    with pytest.raises(MalformedBatch):
        decode_batch(bad)


def test_a_feed_remembers_the_lora_adapters_it_saw() -> None:
    kv, reg = feeds()
    feed = kv.feeds["e"]
    lora = BlockStored((1,), None, (1, 2), 2, "GPU", keyed_by_more=True, lora_name="ad")
    kv.receive(feed, message(0, lora), 0.0)
    assert feed.loras == {"ad"} and len(feed.index) == 0
    assert value(reg, "llmgw_kv_events_total", endpoint="e", kind="ignored") == 1


def test_orphans_ignored_blocks_and_a_new_block_size() -> None:
    index = BlockIndex(100)
    assert index.apply(stored([202], 201, [3, 4])) == "orphan"  # its parent was missed
    assert len(index) == 0
    lora = BlockStored((301,), None, (1, 2), 2, "GPU", keyed_by_more=True)
    assert index.apply(lora) == "ignored" and len(index) == 0
    index.apply(stored([101], None, [1, 2]))
    assert index.apply(stored([401], None, [1, 2, 3, 4], size=4)) == "resized"
    assert index.block_size == 4
    assert index.held(chain([1, 2], 2)) == 0 and index.held(chain([1, 2, 3, 4], 4)) == 1


def test_the_index_is_bounded_oldest_first() -> None:
    index = BlockIndex(3)
    index.apply(stored([1, 2], None, [1, 2, 3, 4]))
    index.apply(stored([3, 4], None, [7, 8, 9, 9]))
    assert len(index) == 3
    # Block 1 (the oldest) went: its chain is cut at the head.
    assert index.held(chain([1, 2, 3, 4], 2)) == 0
    assert index.held(chain([7, 8, 9, 9], 2)) == 2
    # Its child's engine hash is still known: a removal of it is harmless.
    index.apply(BlockRemoved((2,), "GPU"))
    assert len(index) == 2


# -- a feed: sequence numbers, health ----------------------------------------------------


def feeds(
    timeout: float = 10.0, client: EngineClient | None = None
) -> tuple[KVEvents, CollectorRegistry]:
    registry = CollectorRegistry()
    kv = KVEvents(
        {"e": "tcp://127.0.0.1:1"},
        registry,
        client=client or EngineClient(1.0),
        timeout=timeout,
        max_blocks=100,
    )
    return kv, registry


def message(seq: int, *events: Any) -> list[bytes]:
    return [b"", encode_seq(seq), encode_batch(EventBatch(0.0, tuple(events)))]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_gaps_restarts_and_malformed_messages_are_counted() -> None:
    kv, reg = feeds()
    feed = kv.feeds["e"]
    kv.receive(feed, message(0, stored([1], None, [1, 2])), 0.0)
    kv.receive(feed, message(3, stored([2], 1, [3, 4])), 1.0)
    assert value(reg, "llmgw_kv_events_total", endpoint="e", kind="missed") == 2
    assert value(reg, "llmgw_kv_events_total", endpoint="e", kind="stored") == 2
    assert feed.index.held(chain([1, 2, 3, 4], 2)) == 2
    kv.receive(feed, [b"", encode_seq(4)], 2.0)  # two frames
    kv.receive(feed, [b"", b"\x00", b"\x90"], 2.0)  # a short sequence number
    kv.receive(feed, [b"", encode_seq(4), b"\xc1"], 2.0)
    assert value(reg, "llmgw_kv_events_total", endpoint="e", kind="malformed") == 3
    assert feed.heard == 1.0 and feed.last_seq == 3  # none of them counted as heard
    # Numbered from 0 again: the engine restarted, its cache is empty.
    kv.receive(feed, message(0, stored([9], None, [5, 6])), 3.0)
    assert value(reg, "llmgw_kv_events_total", endpoint="e", kind="restart") == 1
    assert feed.index.held(chain([1, 2], 2)) == 0 and feed.index.held(chain([5, 6], 2)) == 1


def test_a_feed_is_up_once_heard_and_down_when_silent_while_owed() -> None:
    kv, reg = feeds(timeout=10.0)
    feed = kv.feeds["e"]
    up = lambda: value(reg, "llmgw_kv_events_up", endpoint="e")  # noqa: E731
    kv.check(0.0)
    assert up() == 0 and not kv.up_feeds(["e"], 0.0)  # never heard: not used
    kv.receive(feed, message(0, stored([1], None, [1, 2])), 1.0)
    assert up() == 1 and kv.up_feeds(["e"], 1.0) == [feed]
    # Quiet while nothing is owed: still up, however long.
    kv.check(1000.0)
    assert up() == 1
    # A request that makes the engine store blocks: owed; a prompt it fully holds is not.
    assert not kv.owes("e", [1, 2, 7])
    assert kv.owes("e", [1, 2, 3, 4])
    kv.sent("e", True, 1000.0)
    kv.sent("e", True, 1005.0)  # the oldest owed counts
    kv.check(1010.0)
    assert up() == 1
    kv.check(1010.5)
    assert up() == 0 and not kv.up_feeds(["e"], 1010.5)
    kv.receive(feed, message(1), 1011.0)
    assert up() == 1 and feed.owed_since is None


def test_what_is_asked_of_the_replay_socket() -> None:
    kv, _ = feeds()
    feed = kv.feeds["e"]
    assert replay_from(feed, message(0)) is None  # the first, from the start: nothing missed
    assert replay_from(feed, message(5)) == 0  # joined late: everything buffered
    kv.receive(feed, message(5), 0.0)
    assert replay_from(feed, message(6)) is None
    assert replay_from(feed, message(9)) == 6
    assert replay_from(feed, message(2)) is None  # a restart, not a gap
    assert replay_from(feed, [b"", b"\x01", b""]) is None


def test_a_feed_never_heard_owes_any_prompt() -> None:
    kv, _ = feeds()
    assert kv.owes("e", None) and kv.owes("e", [1])
    assert not kv.owes("unknown", [1, 2, 3])


def test_exact_holdings_in_the_routers_unit_and_the_overlay() -> None:
    kv, _ = feeds()
    feed = kv.feeds["e"]
    kv.receive(feed, message(0, stored([1, 2], None, [1, 2, 3, 4])), 0.0)
    exact = kv.exact([1, 2, 3, 4, 5, 6, 7, 8], [feed], prompt_tokens=20.0)
    assert exact.covered == {"e"}
    assert exact.cached == {"e": 10.0}  # half the prompt's tokens, in the router's unit
    assert exact.matches == {"e": 0.5}  # 2 of its 4 whole blocks
    m, c = exact.overlay({"e": 1.0, "x": 0.3}, {"e": 99.0, "x": 5.0})
    assert m == {"e": 0.5, "x": 0.3} and c == {"e": 10.0, "x": 5.0}
    # Covered but holding nothing: absent, whatever the estimate said.
    empty = kv.exact([9, 9, 9, 9], [feed], prompt_tokens=20.0)
    assert empty.overlay({"e": 1.0}, {"e": 20.0}) == ({}, {})
    assert Exact().overlay({"e": 1.0}, {"e": 2.0}) == ({"e": 1.0}, {"e": 2.0})


def test_the_tokenize_body_keeps_what_renders_the_prompt() -> None:
    raw = msgspec.Raw
    body = tokenize_body(
        "m",
        {
            "model": raw(b'"alias"'),
            "messages": raw(b'[{"role":"user","content":"hi"}]'),
            "tools": raw(b"[]"),
            "max_tokens": raw(b"5"),
        },
    )
    assert body is not None
    assert msgspec.json.decode(body) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
    }
    assert msgspec.json.decode(tokenize_body("m", {"prompt": raw(b'"x"')}) or b"") == {
        "model": "m",
        "prompt": "x",
    }
    assert tokenize_body("m", {"input": raw(b'"x"')}) is None


# -- configuration -------------------------------------------------------------------------


def test_the_endpoint_flag_and_field() -> None:
    assert parse_endpoint("a=http://h:1=m,n=tcp://h:5557") == {
        "id": "a",
        "url": "http://h:1",
        "models": ["m", "n"],
        "kv_events": "tcp://h:5557",
    }
    assert "kv_events" not in parse_endpoint("a=http://h:1=m")
    ok = EndpointConfig("a", "http://h:1", ("m",), kv_events="tcp://h:5557")
    assert ok.problems("endpoints[0]") == []
    for bad in ("h:5557", "tcp://*:5557", "http://h:1"):
        found = EndpointConfig("a", "http://h:1", ("m",), kv_events=bad).problems("e")
        assert any("kv_events" in p for p in found), bad
        found = EndpointConfig(
            "a", "http://h:1", ("m",), kv_events="tcp://h:1", kv_events_replay=bad
        ).problems("e")
        assert any("kv_events_replay" in p for p in found), bad
    lone = EndpointConfig("a", "http://h:1", ("m",), kv_events_replay="tcp://h:2")
    assert lone.problems("e") == ["e.kv_events_replay: needs kv_events"]


# -- the simulator's events, read by the router's index -------------------------------------


def test_the_sims_events_keep_the_routers_index_exact() -> None:
    """Stores, evictions and a reset, as the engine announces them, leave the index
    holding what the engine's own cache holds, prompt by prompt."""
    engine = Engine(EngineConfig(num_blocks=24))
    engine.record_kv_events()
    index = BlockIndex(1000)
    prompts = [tuple(salt * 1000 + i for i in range(160)) for salt in range(4)]
    now = 0.0
    for i, p in enumerate(prompts):
        engine.add(Request(f"r{i}", p, max_tokens=1), now)
        while (out := engine.step(now)) is not None:
            now = out.step.ends
        for event in engine.take_kv_events():
            index.apply(event)
        for q in prompts:
            own = chain(q, 16)
            engine_held = len(engine.kv.lookup(_engine_chain(q)))
            assert index.held(own) == engine_held, (i, q[0])
    kinds = set()
    engine.reset_prefix_cache()
    for event in engine.take_kv_events():
        kinds.add(index.apply(event))
    assert kinds == {"cleared"} and len(index) == 0


def _engine_chain(tokens: tuple[int, ...]) -> list[int]:
    """The sim's own block hashes of a prompt (as its Sequence computes them)."""
    out: list[int] = []
    parent = 0
    for i in range(len(tokens) // 16):
        parent = hash((parent, *tokens[i * 16 : (i + 1) * 16]))
        out.append(parent)
    return out


def test_the_sim_records_nothing_unless_asked() -> None:
    engine = Engine(EngineConfig())
    engine.add(Request("a", tuple(range(64)), max_tokens=1), 0.0)
    engine.step(0.0)
    assert engine.take_kv_events() == []


# -- tokenizing at an engine -------------------------------------------------------------


def _tokenize_with(handler: Any, timeout: float = 1.0) -> list[int] | None:
    import httpx
    import trio

    async def main() -> list[int] | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as given:
            kv, _ = feeds(client=EngineClient(1.0, given))
            kv.tokenize_timeout = timeout
            return await kv.tokenize("http://engine", [(b"x-k", b"v")], b"{}")

    return trio.run(main)


def test_tokenize_reads_the_engines_token_ids() -> None:
    import httpx

    seen: list[httpx.Request] = []

    def ok(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"count": 3, "tokens": [5, 6, 7]})

    assert _tokenize_with(ok) == [5, 6, 7]
    assert str(seen[0].url) == "http://engine/tokenize" and seen[0].headers["x-k"] == "v"


@pytest.mark.parametrize(
    "answer",
    [
        (500, b'{"tokens": [1]}'),
        (200, b"not json"),
        (200, b'{"tokens": "1 2"}'),
        (200, b'{"tokens": [1, true]}'),
        (200, b"[1, 2]"),
    ],
)
def test_a_bad_tokenize_answer_is_none(answer: tuple[int, bytes]) -> None:
    import httpx

    status, body = answer
    assert _tokenize_with(lambda request: httpx.Response(status, content=body)) is None


def test_a_failed_or_slow_tokenize_is_none() -> None:
    import time

    import httpx
    import trio

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert _tokenize_with(refused) is None

    async def slow(request: httpx.Request) -> httpx.Response:
        await trio.sleep(5)
        return httpx.Response(200, json={"tokens": [1]})

    began = time.monotonic()
    assert _tokenize_with(slow, timeout=0.2) is None
    assert time.monotonic() - began < 2


async def test_tokenize_over_plain_http_reads_the_ids_and_refuses_a_longer_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trio

    from llmgw.router import kv_events

    monkeypatch.setattr(kv_events, "MAX_TOKENIZE_BYTES", 20)
    engine = RawEngine(
        {b"/tokenize": ok(b'{"tokens": [5, 6]}'), b"/big/tokenize": ok(b'{"tokens": [1, 2, 3, 4]}')}
    )
    kv, _ = feeds()
    async with trio.open_nursery() as nursery:
        base = f"http://127.0.0.1:{await nursery.start(engine.serve)}"
        with trio.fail_after(10):
            assert await kv.tokenize(base, [(b"x-k", b"v")], b'{"prompt": "hi"}') == [5, 6]
            assert await kv.tokenize(base + "/big", [], b"{}") is None  # 24 bytes: refused
        nursery.cancel_scope.cancel()
    ((_, head, body), _) = engine.requests
    assert head.startswith(b"POST /tokenize HTTP/1.1\r\n") and body == b'{"prompt": "hi"}'
    assert b"\r\nx-k: v\r\n" in head and b"\r\ncontent-type: application/json\r\n" in head
    assert kv.client._httpx.made is False  # llmgw's own client, no httpx
    await kv.client.aclose()
