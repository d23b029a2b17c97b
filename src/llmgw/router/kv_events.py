"""Routing on the engines' own KV-cache index: the router subscribes to the KV-cache
events of every endpoint configured with a ``kv_events`` address (vLLM's
``--kv-events-config`` ZMQ publisher; llmgw-sim's ``--kv-events-endpoint``), keeps per
endpoint an exact :class:`~llmgw.router.kv_index.BlockIndex`, and, for a request to a
model whose replicas publish, asks one of them to tokenize the prompt (``POST
/tokenize``) and looks its token blocks up in each index (docs/scheduling.md, "The
engines' own index"). Where the endpoint names its engine's replay socket too, what
the subscription missed (before it connected, or a gap in the sequence numbers) is
asked for and applied in order.

I/O here, index logic in :mod:`llmgw.router.kv_index`, the wire in
:mod:`llmgw.domain.kv_events`.

Fallback, said loudly: an endpoint's index is used only while its feed is *up*: it has
delivered a message, and no request the router sent it since its last message has
waited `timeout` seconds for one. A request is owed a message when the engine must
store blocks for it (its prompt has whole blocks the index says the engine lacks), or,
for a feed never heard from, any prompt. Elsewhere the estimated prefix table
decides, as for an endpoint without events. ``llmgw_kv_events_up{endpoint}`` shows
which, and each transition is logged once.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import msgspec
import trio
import trio.lowlevel
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw.domain.kv_events import (
    END_SEQ,
    SEQ_BYTES,
    BlockStored,
    MalformedBatch,
    decode_batch,
    decode_seq,
    encode_seq,
)
from llmgw.http.client import UpstreamError
from llmgw.http.engine_client import EngineClient
from llmgw.router.kv_index import BlockIndex, chain
from llmgw.zmqio import recv_multipart

__all__ = ["Exact", "Feed", "KVEvents", "replay_from", "tokenize_body"]

log = logging.getLogger("llmgw.router.kv_events")

#: The largest message read (a batch of one engine step is far smaller; past this,
#: ZMQ drops the connection and reconnects).
MAX_MESSAGE_BYTES = 16 << 20
#: LoRA adapter names remembered per endpoint.
MAX_LORAS = 1024
#: Messages handled before yielding to other tasks.
_BURST = 64
_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()
#: The tokenize answer read at most (token ids of a long prompt).
MAX_TOKENIZE_BYTES = 32 << 20


class Feed:
    """One endpoint's subscription: its index, sequence numbers and health."""

    __slots__ = (
        "address",
        "endpoint_id",
        "heard",
        "index",
        "last_seq",
        "loras",
        "owed_since",
        "replay",
        "up",
    )

    def __init__(
        self, endpoint_id: str, address: str, max_blocks: int, replay: str | None = None
    ) -> None:
        self.endpoint_id = endpoint_id
        self.address = address
        #: The engine's replay socket, if it has one.
        self.replay = replay
        self.index = BlockIndex(max_blocks)
        #: LoRA adapters the engine announced blocks of (bounded): their requests'
        #: blocks are keyed by more than tokens, so the index cannot answer for them.
        self.loras: set[str] = set()
        self.last_seq: int | None = None
        #: When the last good message came (None: never).
        self.heard: float | None = None
        #: When the oldest request still owed a message was sent there.
        self.owed_since: float | None = None
        self.up = False

    def healthy(self, now: float, timeout: float) -> bool:
        return self.heard is not None and (
            self.owed_since is None or now - self.owed_since <= timeout
        )


class Exact:
    """What the engines' indexes say of one request: per endpoint covered (its feed is
    up), the prompt tokens it holds in the router's estimated unit and its match."""

    __slots__ = ("cached", "covered", "matches")

    def __init__(self) -> None:
        self.covered: set[str] = set()
        self.cached: dict[str, float] = {}
        self.matches: dict[str, float] = {}

    def overlay(
        self, matches: dict[str, float], cached: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """The estimated table's `matches` and `cached`, the covered endpoints' entries
        replaced by the engines' own (an endpoint holding nothing is absent)."""
        m = {ep: v for ep, v in matches.items() if ep not in self.covered}
        c = {ep: v for ep, v in cached.items() if ep not in self.covered}
        m.update(self.matches)
        c.update(self.cached)
        return m, c


class KVEvents:
    """Every endpoint's feed, the tasks reading them, and the lookup."""

    def __init__(
        self,
        addresses: Mapping[str, str],
        registry: CollectorRegistry,
        *,
        client: EngineClient,
        timeout: float,
        max_blocks: int,
        replays: Mapping[str, str] | None = None,
        tokenize_timeout: float = 1.0,
        replay_timeout: float = 1.0,
    ) -> None:
        self.client = client  # the Router's engine client: tokenize calls
        self.timeout = timeout
        self.tokenize_timeout = tokenize_timeout
        self.replay_timeout = replay_timeout
        replays = replays or {}
        self.feeds = {
            ep: Feed(ep, addr, max_blocks, replays.get(ep)) for ep, addr in addresses.items()
        }
        self.up = Gauge(
            "llmgw_kv_events_up",
            "1 while the router routes on this endpoint's own KV-cache events; 0 while "
            "it falls back to its estimated prefix table (never heard, or silent while "
            "owed a message)",
            ["endpoint"],
            registry=registry,
        )
        self.events = Counter(
            "llmgw_kv_events",
            "KV-cache events and messages read from engines, by kind (stored, removed, "
            "cleared, orphan, ignored, resized; malformed, missed and replayed messages; "
            "restart)",
            ["endpoint", "kind"],
            registry=registry,
        )
        self.lookups = Counter(
            "llmgw_kv_lookups",
            "Requests to models with KV-event endpoints, by how they were routed: exact "
            "(tokenized, looked up), failed (tokenize failed: estimated), down (no feed "
            "up: estimated), no_prompt (no messages or prompt to look up), lora (a LoRA "
            "adapter's blocks are keyed by more than tokens: estimated)",
            ["model", "outcome"],
            registry=registry,
        )
        for ep in self.feeds:
            self.up.labels(ep).set(0)
        self._ctx: zmq.Context[Any] | None = None

    def covers(self, endpoint_ids: Iterable[str]) -> bool:
        feeds = self.feeds
        return any(ep in feeds for ep in endpoint_ids)

    # -- health ---------------------------------------------------------------------------

    def check(self, now: float) -> None:
        """Flip feeds whose health changed (gauge and one log line each)."""
        for feed in self.feeds.values():
            self._set(feed, feed.healthy(now, self.timeout), now)

    def _set(self, feed: Feed, up: bool, now: float) -> None:
        if up == feed.up:
            return
        feed.up = up
        self.up.labels(feed.endpoint_id).set(1 if up else 0)
        if up:
            log.info(
                "KV-cache events from endpoint %s (%s): up; routing on its own index",
                feed.endpoint_id,
                feed.address,
            )
        elif feed.heard is None:
            log.warning(
                "KV-cache events from endpoint %s (%s): none received though it served "
                "requests for %.0fs; routing on the estimated prefix table for it",
                feed.endpoint_id,
                feed.address,
                self.timeout,
            )
        else:
            log.warning(
                "KV-cache events from endpoint %s (%s): silent for %.0fs while it served "
                "requests; routing on the estimated prefix table for it",
                feed.endpoint_id,
                feed.address,
                now - feed.heard,
            )

    def sent(self, endpoint_id: str, owed: bool, now: float) -> None:
        """A request went to `endpoint_id`; `owed`: its engine will announce blocks."""
        feed = self.feeds.get(endpoint_id)
        if feed is not None and owed and feed.owed_since is None:
            feed.owed_since = now

    # -- reading ----------------------------------------------------------------------------

    def receive(self, feed: Feed, frames: Sequence[bytes], now: float) -> None:
        """One message (topic, sequence number, payload) from `feed`'s engine."""
        count = self.events.labels
        ep = feed.endpoint_id
        try:
            if len(frames) != 3:
                raise MalformedBatch(f"{len(frames)} frames, not 3")
            if len(frames[2]) > MAX_MESSAGE_BYTES:
                raise MalformedBatch("too large")
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
        except MalformedBatch as exc:
            count(ep, "malformed").inc()
            log.debug("malformed KV-event message from %s: %s", ep, exc)
            return
        last = feed.last_seq
        if last is not None:
            if seq > last + 1:
                count(ep, "missed").inc(seq - last - 1)
            elif seq <= last:
                # Numbered from 0 again: the publisher (the engine) restarted, with
                # an empty cache.
                count(ep, "restart").inc()
                feed.index.clear()
        feed.last_seq = seq
        kinds: Tally[str] = Tally()
        for event in batch.events:
            kinds[feed.index.apply(event)] += 1
            if isinstance(event, BlockStored) and event.lora_name and len(feed.loras) < MAX_LORAS:
                feed.loras.add(event.lora_name)
        for kind, n in kinds.items():
            count(ep, kind).inc(n)
        feed.heard = now
        feed.owed_since = None
        self._set(feed, True, now)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe to every feed and watch their health, until cancelled."""
        self._ctx = ctx = zmq.Context()
        try:
            async with trio.open_nursery() as nursery:
                for feed in self.feeds.values():
                    nursery.start_soon(self._subscribe, ctx, feed)
                nursery.start_soon(self._watch)
                task_status.started()
        finally:
            ctx.term()

    async def _watch(self) -> None:
        while True:
            self.check(trio.current_time())
            await trio.sleep(min(1.0, self.timeout / 4))

    async def _subscribe(self, ctx: zmq.Context[Any], feed: Feed) -> None:
        sub = ctx.socket(zmq.SUB)
        dealer = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + 64)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(feed.address)
            if feed.replay is not None:
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + 64)
                dealer.connect(feed.replay)
            n = 0
            while True:
                frames = await recv_multipart(sub)
                if dealer is not None:
                    start = replay_from(feed, frames)
                    if start is not None:
                        await self._replay(feed, dealer, start, decode_seq(frames[1]))
                self.receive(feed, frames, trio.current_time())
                n += 1
                if n % _BURST == 0:
                    # A flood of events must not starve the requests.
                    await trio.lowlevel.checkpoint()
        except zmq.ZMQError as exc:
            log.error(
                "KV-cache events from endpoint %s (%s): %s", feed.endpoint_id, feed.address, exc
            )
        finally:
            sub.close(linger=0)
            if dealer is not None:
                dealer.close(linger=0)

    async def _replay(self, feed: Feed, dealer: zmq.Socket[Any], start: int, stop: int) -> None:
        """Ask the engine's replay socket for the batches `start`..`stop`-1 and apply
        those it still has, in order, within `replay_timeout`."""
        count = self.events.labels
        ep = feed.endpoint_id
        while cast(int, dealer.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            dealer.recv_multipart(zmq.NOBLOCK)  # what an earlier, timed-out replay sent late
        try:
            dealer.send_multipart((b"", encode_seq(start)), zmq.NOBLOCK)
        except zmq.Again:
            return  # not connected (yet): the gap stays counted as missed
        got = 0
        with trio.move_on_after(self.replay_timeout):
            while True:
                frames = await recv_multipart(dealer)
                if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != SEQ_BYTES:
                    count(ep, "malformed").inc()
                    continue
                if frames[1] == END_SEQ:
                    break
                seq = decode_seq(frames[1])
                last = feed.last_seq
                if seq >= stop or (last is not None and seq <= last):
                    continue
                self.receive(feed, frames, trio.current_time())
                got += 1
        if got:
            count(ep, "replayed").inc(got)
            log.info("KV-cache events from endpoint %s: %d missed batches replayed", ep, got)

    # -- lookup -----------------------------------------------------------------------------

    def up_feeds(self, endpoint_ids: Iterable[str], now: float) -> list[Feed]:
        self.check(now)
        feeds = self.feeds
        return [f for ep in endpoint_ids if (f := feeds.get(ep)) is not None and f.up]

    def exact(self, token_ids: Sequence[int], feeds: Sequence[Feed], prompt_tokens: float) -> Exact:
        """Per up feed, what its engine holds of `token_ids`, in the router's unit:
        the held share of the prompt times the router's estimate of its size."""
        out = Exact()
        total = len(token_ids)
        chains: dict[int, list[int]] = {}
        for feed in feeds:
            out.covered.add(feed.endpoint_id)
            size = feed.index.block_size
            if size is None or not total:
                continue
            own = chains.get(size)
            if own is None:
                own = chains[size] = chain(token_ids, size)
            held = feed.index.held(own)
            if held:
                share = min(1.0, held * size / total)
                out.cached[feed.endpoint_id] = share * prompt_tokens
                out.matches[feed.endpoint_id] = held / len(own)
        return out

    def owes(self, endpoint_id: str, token_ids: Sequence[int] | None) -> bool:
        """Whether a request with `token_ids` (None: not known) sent to `endpoint_id`
        makes its engine announce blocks."""
        feed = self.feeds.get(endpoint_id)
        if feed is None:
            return False
        if token_ids is None or feed.index.block_size is None:
            return feed.heard is None
        size = feed.index.block_size
        whole = len(token_ids) // size
        return whole > 0 and feed.index.held(chain(token_ids, size)) < whole

    async def tokenize(
        self,
        base: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> list[int] | None:
        """The engine's token ids of a prompt (vLLM's ``POST /tokenize``); None when
        it cannot say in time."""
        with trio.move_on_after(self.tokenize_timeout):
            try:
                status, content = await self.client.fetch(
                    "POST",
                    base + "/tokenize",
                    [*headers, (b"content-type", b"application/json")],
                    body=body,
                    limit=MAX_TOKENIZE_BYTES,
                )
            except UpstreamError as exc:  # any transport failure, or too long: fall back
                log.debug("tokenize at %s failed: %s", base, exc)
                return None
            if status != 200:
                return None
            try:
                tokens = _DECODE.decode(content).get("tokens")
            except (msgspec.DecodeError, AttributeError):
                return None
            if isinstance(tokens, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens
            ):
                return tokens
        return None


def replay_from(feed: Feed, frames: Sequence[bytes]) -> int | None:
    """The first sequence number to ask the replay socket for before the message
    `frames`: what was missed since the last one, or everything before the first one
    heard (the router connected after the engine had started); None when nothing was."""
    if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        return None
    seq = decode_seq(frames[1])
    last = feed.last_seq
    if last is None:
        return 0 if seq > 0 else None
    return last + 1 if seq > last + 1 else None


def tokenize_body(model: str, members: Mapping[str, msgspec.Raw]) -> bytes | None:
    """The ``/tokenize`` body for a request's raw members: its messages (with what
    changes how a chat template renders them) or its prompt; None without either."""
    keep: tuple[str, ...]
    if "messages" in members:
        keep = ("messages", "tools", "chat_template", "chat_template_kwargs")
    elif "prompt" in members:
        keep = ("prompt",)
    else:
        return None
    out: dict[str, Any] = {"model": model}
    out.update({k: members[k] for k in keep if k in members})
    return _ENCODE.encode(out)
