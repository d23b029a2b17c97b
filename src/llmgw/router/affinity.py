"""Session and prefix affinity: bounded, expiring tables of "who served this recently".

Both tables are owned by the router (one per process, driven from the trio thread)
and take `now` (monotonic seconds) instead of reading a clock. Entries are kept in
last-use order, so expired entries gather at the old end and are trimmed there in
amortised O(1); the size bound evicts from the same end (LRU).

Prefix affinity works on text, not tokens: the router sees the request body, not the
engine's tokenizer. The prompt text is cut into blocks of ``prefix_block_chars``
characters and each block's hash is chained to the previous one, so hash ``i`` names
the whole prefix ``0..i``; two prompts share hash ``i`` iff they share their first
``i + 1`` blocks (up to hash collisions, which cost one mis-routed request at worst).
Only whole blocks are hashed: a trailing partial block changes with every new turn of
a conversation, and engines cache whole blocks too. Python's ``hash()`` of ``str`` is
salted per process, which is fine here: the table never leaves the process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from llmgw.router.usage import BYTES_PER_TOKEN

__all__ = [
    "PrefixIndex",
    "PrefixTable",
    "Probe",
    "SessionTable",
    "prefix_hashes",
    "prompt_text_for_affinity",
]

K = TypeVar("K")
V = TypeVar("V")


def _trim_lru(
    entries: OrderedDict[K, V], size: int, cutoff: float, last_use: Callable[[V], float]
) -> None:
    """Evict the least recently used entries beyond `size`, then those last used before
    `cutoff`: both from the old end (the entries are in last-use order)."""
    while len(entries) > size:
        entries.popitem(last=False)
    while entries:
        # The oldest entry is first; once it is fresh, all are.
        key, value = next(iter(entries.items()))
        if last_use(value) >= cutoff:
            break
        del entries[key]


def _entry_used(entry: tuple[str, float]) -> float:
    return entry[1]


def _holders_used(holders: dict[str, Mark]) -> float:
    # An entry's last use is its newest mark.
    return max(mark[0] for mark in holders.values())


# One endpoint's mark on one block: (last served, times served, its insertion stamp).
Mark = tuple[float, int, int]


class SessionTable:
    """Session key → endpoint id, LRU-bounded to `size`, expiring `ttl` after last use.

    :meth:`lookup` is a pure read; the router calls :meth:`record` once it has picked
    (the same endpoint, or a new one when the session spilled), which counts as a use.
    """

    __slots__ = ("_entries", "size", "ttl")

    def __init__(self, size: int, ttl: float) -> None:
        self.size = size
        self.ttl = ttl
        # key -> (endpoint id, last use); insertion order = last-use order.
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str, now: float) -> str | None:
        entry = self._entries.get(key)
        if entry is None or now - entry[1] > self.ttl:
            return None
        return entry[0]

    def record(self, key: str, endpoint_id: str, now: float) -> None:
        entries = self._entries
        entries[key] = (endpoint_id, now)
        entries.move_to_end(key)
        self._trim(now)

    def discard(self, key: str) -> None:
        self._entries.pop(key, None)

    def forget(self, endpoint_id: str) -> None:
        """Drop every session pinned to `endpoint_id` (it left the fleet). O(table)."""
        stale = [k for k, (ep, _) in self._entries.items() if ep == endpoint_id]
        for k in stale:
            del self._entries[k]

    def expire(self, now: float) -> None:
        """Drop expired entries (also done on every record; call this when idle)."""
        self._trim(now)

    def _trim(self, now: float) -> None:
        _trim_lru(self._entries, self.size, now - self.ttl, _entry_used)


def prefix_hashes(text: str, block_chars: int, max_blocks: int, seed: str = "") -> tuple[int, ...]:
    """Chained hashes of the whole `block_chars` blocks of `text`, at most `max_blocks`.

    `seed` (e.g. the model name) starts the chain, so that two models served by one
    endpoint do not share entries.
    """
    n = min(len(text) // block_chars, max_blocks)
    h = hash(seed)
    out = []
    for i in range(n):
        h = hash((h, text[i * block_chars : (i + 1) * block_chars]))
        out.append(h)
    return tuple(out)


class PrefixTable:
    """Which endpoints recently served each prefix chain hash.

    Bounded to `size` chain hashes (LRU, 0 turns prefix affinity off); an endpoint's
    mark on a hash expires `ttl` after it last served that prefix.

    An engine's prefix cache is far smaller than the table: it evicts, least
    recently used first, long before `ttl`. A block is evicted once more distinct
    blocks than the cache holds were used after it (its LRU stack distance). Counting
    distinct blocks costs a search tree per endpoint; the table counts every block
    each endpoint is sent instead (a hot block sent twice counts twice: an upper
    bound of the distance, tight where little repeats), and each mark keeps that
    count as of its last use. The capacity past which a mark is taken as evicted is
    in the same unit and is not configured but learnt from the engines' answers
    (:meth:`observe`, from ``cached_tokens``); until an engine has said anything it
    is unknown and the table holds every mark for `ttl`.
    """

    __slots__ = ("_capacity", "_entries", "_referenced", "learn", "size", "ttl")

    def __init__(self, size: int, ttl: float, *, learn: bool = False) -> None:
        self.size = size
        self.ttl = ttl
        # Off in the router: counting repeats as distance made the bound too low on a
        # model of a serialized-prefill engine with 16 Zipf tenants (closed-loop
        # throughput 143 -> 135 req/s, and lower on slower prefill), while it helped
        # with 64 tenants (TTFT p90 587 -> 214 ms); on until measured on real engines.
        self.learn = learn
        # chain hash -> {endpoint id: Mark}; order = last use.
        self._entries: OrderedDict[int, dict[str, Mark]] = OrderedDict()
        # Per endpoint: blocks sent to it so far, and the capacity learnt (in that count).
        self._referenced: dict[str, int] = {}
        self._capacity: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def capacity(self, endpoint_id: str) -> int | None:
        """The prefix-cache capacity learnt for `endpoint_id`, in blocks sent between a
        block's last use and its eviction (None: unknown)."""
        return self._capacity.get(endpoint_id)

    def _alive(self, ep: str, mark: Mark, cutoff: float) -> bool:
        if mark[0] < cutoff:
            return False
        cap = self._capacity.get(ep)
        return cap is None or self._referenced.get(ep, 0) - mark[2] < cap

    def match(self, hashes: Sequence[int], now: float) -> dict[str, float]:
        """Per endpoint, how well it holds `hashes` as a leading chain, in (0, 1]: the
        product of :meth:`holdings`' fraction and share. Endpoints with no match are
        absent."""
        return {ep: held * share for ep, (held, share) in self.holdings(hashes, now).items()}

    def holdings(self, hashes: Sequence[int], now: float) -> dict[str, tuple[float, float]]:
        """Per endpoint that holds a leading part of `hashes`: (fraction, share).

        `fraction` is the part of the chain it holds, in (0, 1]. `share` is its share
        of the prefix's traffic at the deepest block it holds, from 1/2 for a holder
        that served it once in a while up to 1 for the one that served it most: when
        load spills a prefix to a second replica, the first one stays the prefix's home
        instead of the prefix spreading over the fleet. Endpoints with no match are
        absent.

        Holding is monotone along a chain: :meth:`record` marks every block of a
        prompt at once, so a block's marks are never fresher (in time or in
        insertions) than its parent's, and LRU eviction cuts chains from their tail.
        So the chain's held length is found by bisection, and each endpoint's deepest
        block by walking back from there only until every holder of the first block
        is placed.
        """
        result: dict[str, tuple[float, float]] = {}
        total = len(hashes)
        if not total or not self.size:
            return result
        cutoff = now - self.ttl
        entries = self._entries
        alive = self._alive

        def live(i: int) -> dict[str, Mark] | None:
            holders = entries.get(hashes[i])
            if holders and any(alive(ep, m, cutoff) for ep, m in holders.items()):
                return holders
            return None

        first = live(0)
        if first is None:
            return result
        lo, hi = 1, total  # blocks [0, lo) are held; [hi, total) are not
        while lo < hi:
            mid = (lo + hi) // 2
            if live(mid) is not None:
                lo = mid + 1
            else:
                hi = mid
        pending = {ep for ep, m in first.items() if alive(ep, m, cutoff)}
        for i in range(lo - 1, -1, -1):
            holders = live(i)
            if holders is None:
                continue
            held = {ep: m for ep, m in holders.items() if alive(ep, m, cutoff)}
            most = max(m[1] for m in held.values())
            fraction = (i + 1) / total
            for ep, m in held.items():
                if ep in pending:
                    result[ep] = (fraction, 0.5 + 0.5 * m[1] / most)
                    pending.discard(ep)
            if not pending:
                break
        return result

    def probe(self, hashes: Sequence[int], endpoint_id: str, now: float) -> Probe:
        """What the table knows of `endpoint_id`'s hold on `hashes` before it serves
        them: for each leading block it marked within `ttl`, the block's stack distance
        and last use, whether or not the capacity learnt so far counts it as held (what
        :meth:`observe` weighs against the engine's answer)."""
        cutoff = now - self.ttl
        inserted = self._referenced.get(endpoint_id, 0)
        marks: list[tuple[int, float]] = []
        for h in hashes:
            holders = self._entries.get(h)
            mark = holders.get(endpoint_id) if holders else None
            if mark is None or mark[0] < cutoff:
                break
            marks.append((inserted - mark[2], mark[0]))
        cap = self._capacity.get(endpoint_id)
        held = len(marks) if cap is None else sum(1 for d, _ in marks if d < cap)
        return Probe(tuple(marks), held, now, len(hashes))

    def record(self, hashes: Sequence[int], endpoint_id: str, now: float) -> None:
        """`endpoint_id` served a prompt with these chain hashes (it now caches them)."""
        if not self.size:
            return
        entries = self._entries
        cutoff = now - self.ttl
        alive = self._alive
        # Uses so far of each block it holds (0: it takes the block anew).
        counts: list[int] = []
        for h in hashes:
            holders = entries.get(h)
            mark = holders.get(endpoint_id) if holders else None
            counts.append(mark[1] if mark is not None and alive(endpoint_id, mark, cutoff) else 0)
        stamp = self._referenced.get(endpoint_id, 0) + len(counts)
        self._referenced[endpoint_id] = stamp
        # Longest prefix first, so that shorter prefixes end up more recently used and
        # LRU eviction cuts chains from their tail: match() stops at the first gap.
        for h, count in zip(reversed(hashes), reversed(counts), strict=True):
            holders = entries.get(h)
            if holders is None:
                entries[h] = {endpoint_id: (now, 1, stamp)}
            else:
                holders[endpoint_id] = (now, count + 1, stamp)
                entries.move_to_end(h)
        self._trim(now)

    def observe(self, endpoint_id: str, probe: Probe, cached_blocks: float, settle: float) -> str:
        """Weigh the engine's answer against the table: `endpoint_id` served the prompt
        that `probe` was taken for and said `cached_blocks` of it came from its cache.

        Returns the outcome: ``hit`` or ``miss`` (the table was right), ``over`` (the
        table said held, the engine had evicted it), ``under`` (the engine held more
        than the table said: another router sent it, or the capacity learnt is low).

        Each answer tells the capacity something. The deepest block the engine held
        was within it: the capacity is above that block's stack distance. The first
        block it lacked was evicted: the capacity is at most that block's distance,
        unless the block was last used less than `settle` seconds before this
        request was picked (it may still have been in its first prefill, not yet
        cached), and never below the prompt itself (the engine just computed it). One
        block of slack either way: prompt sizes are estimated from bytes.
        """
        marks, held = probe.marks, probe.held
        engine = int(cached_blocks)
        if not self.learn:
            return _outcome(cached_blocks, held)
        cap = self._capacity.get(endpoint_id)
        within = min(engine, len(marks))
        if within > 0:
            deepest = marks[within - 1][0]
            if cap is not None and deepest >= cap:
                cap = self._capacity[endpoint_id] = deepest + 1
        if engine < len(marks) and engine + 1 < held:
            distance, seen = marks[engine]
            if probe.at - seen >= settle:
                bound = distance if cap is None else min(cap, distance)
                self._capacity[endpoint_id] = max(probe.blocks, 1, bound)
        return _outcome(cached_blocks, held)

    def forget(self, endpoint_id: str) -> None:
        """Remove `endpoint_id` from every entry (it left the fleet). O(table)."""
        empty = []
        for h, holders in self._entries.items():
            if holders.pop(endpoint_id, None) is not None and not holders:
                empty.append(h)
        for h in empty:
            del self._entries[h]
        self._referenced.pop(endpoint_id, None)
        self._capacity.pop(endpoint_id, None)

    def expire(self, now: float) -> None:
        self._trim(now)

    def _trim(self, now: float) -> None:
        _trim_lru(self._entries, self.size, now - self.ttl, _holders_used)


def _outcome(cached_blocks: float, held: int) -> str:
    # One block of slack either way: prompt sizes are estimated from bytes.
    if cached_blocks >= held + 1:
        return "under"
    if cached_blocks < held - 1:
        return "over"
    return "hit" if held else "miss"


@attrs.frozen
class Probe:
    """What the table said one endpoint held of a prompt when it was picked."""

    # Per leading block it marked within the ttl: (stack distance, last use),
    # shallowest first.
    marks: tuple[tuple[int, float], ...]
    # How many of those the capacity learnt counts as held (the prediction).
    held: int
    # When it was picked.
    at: float
    # The prompt's blocks (the chain's length): the engine holds at least these once
    # it has served it.
    blocks: int
    # The whole prompt's size in blocks, as the router estimated it (0: not known).
    size: float = 0.0


def _append_content(parts: list[str], content: object, budget: int) -> int:
    """Append a message's text to `parts`; returns the remaining character budget."""
    if isinstance(content, str):
        parts.append(content)
        return budget - len(content)
    if isinstance(content, list):
        for part in content:
            if budget <= 0:
                break
            if isinstance(part, str):
                text: object = part
            elif isinstance(part, Mapping):
                # Text parts carry "text"; image/audio parts are identified by their
                # URL or data, which can be huge: the budget cuts it.
                text = part.get("text")
                if text is None:
                    media = part.get("image_url") or part.get("input_audio")
                    if isinstance(media, Mapping):
                        text = media.get("url") or media.get("data")
            else:
                text = None
            if isinstance(text, str):
                parts.append(text)
                budget -= len(text)
    return budget


def prompt_text_for_affinity(body: Mapping[str, object], limit: int | None = None) -> str:
    """The prompt text to hash for prefix affinity, from an OpenAI request body.

    Chat (``messages``): each message as role, a separator, its content (a string or
    a list of parts), and a terminator, so that message boundaries are part of the
    prefix. Completions (``prompt``): a string, the first of a list of strings (a
    batch is routed once), or token ids written as numbers. Anything else gives "".
    Stops once `limit` characters are collected (pass block_chars * max_blocks).
    Tools and other parameters are left out: they rarely differ within a conversation.
    """
    budget = limit if limit is not None else 1 << 62
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if budget <= 0:
                break
            if not isinstance(message, Mapping):
                continue
            role = message.get("role")
            parts.append(role if isinstance(role, str) else "")
            parts.append("\x1f")
            budget = _append_content(parts, message.get("content"), budget - 2)
            parts.append("\x1e")
        text = "".join(parts)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            first = prompt[0]
            if isinstance(first, int):  # one prompt as token ids
                # At least 2 characters per id with its comma: this covers the budget.
                text = ",".join(str(t) for t in prompt[: budget // 2 + 1])
            elif isinstance(first, list):  # a batch of token-id prompts
                text = ",".join(str(t) for t in first[: budget // 2 + 1])
            else:
                prompt = first
                text = prompt if isinstance(prompt, str) else ""
        else:
            text = prompt if isinstance(prompt, str) else ""
    return text[:limit] if limit is not None else text


class PrefixIndex:
    """Prefix affinity for the router: hashing settings plus the table."""

    def __init__(self, block_chars: int, max_blocks: int, size: int, ttl: float) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.table = PrefixTable(size, ttl)

    def text(self, body: dict[str, Any]) -> str:
        """The part of the prompt that can matter for affinity (bounded, cheap)."""
        return prompt_text_for_affinity(body, limit=self.block_chars * self.max_blocks)

    def chain(self, text: str, model: str) -> tuple[int, ...]:
        # Seeded by model: two models on one endpoint share no cache entries.
        return prefix_hashes(text, self.block_chars, self.max_blocks, seed=model)

    def lookup(
        self, chain: tuple[int, ...], now: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Per endpoint holding part of `chain`: its match (PrefixTable.match) and the
        estimated prompt tokens it holds."""
        matches: dict[str, float] = {}
        cached: dict[str, float] = {}
        chain_tokens = len(chain) * self.block_chars / BYTES_PER_TOKEN
        for ep, (held, share) in self.table.holdings(chain, now).items():
            matches[ep] = held * share
            cached[ep] = held * chain_tokens
        return matches, cached

    def probe(
        self,
        chain: tuple[int, ...],
        endpoint_id: str,
        now: float,
        prompt_tokens: float,
        held_tokens: float,
    ) -> Probe:
        """The table's view of `endpoint_id` before it serves `chain`; `prompt_tokens`
        is the prompt's size as the router estimated it, `held_tokens` what
        :meth:`lookup` found `endpoint_id` to hold of it."""
        size = prompt_tokens * BYTES_PER_TOKEN / self.block_chars
        if not self.table.learn:
            # The prediction is all observe() weighs: lookup() found it already, so the
            # chain is not walked a second time on the request's path.
            held = round(held_tokens * BYTES_PER_TOKEN / self.block_chars)
            return Probe((), held, now, len(chain), size)
        return attrs.evolve(self.table.probe(chain, endpoint_id, now), size=size)

    def observe(
        self, endpoint_id: str, probe: Probe, cached_tokens: int, prompt_tokens: int, settle: float
    ) -> str | None:
        """The engine's count of cached prompt tokens against the table's (see
        :meth:`PrefixTable.observe`); None when the answer gives nothing to weigh.

        The engine counts in its tokenizer's tokens and the table in blocks of text, so
        its cached share of the prompt (its own two counts) is taken in the prompt's
        size in blocks as the router estimated it, the same estimate its predictions
        are made in."""
        if prompt_tokens <= 0 or probe.size <= 0:
            return None
        cached_blocks = min(1.0, cached_tokens / prompt_tokens) * probe.size
        return self.table.observe(endpoint_id, probe, cached_blocks, settle)
