"""The simulated engine: continuous batching over a paged KV cache with prefix caching.

Pure and synchronous: no I/O, no sleeping, no wall clock. The caller passes ``now``
and is told how long each step costs; the trio loop in ``server.py`` sleeps that long,
tests just advance a number.

A step is two calls so that what the outside sees between them (running and waiting
counts, KV usage) is the state *during* the forward pass:

* ``begin_step(now)`` schedules a batch — decodes of running sequences, chunks of
  prefill, admissions from the waiting queue, preemptions when the cache is full —
  allocates the KV blocks it needs and returns a ``ScheduledStep`` with its cost;
* ``end_step(now)`` commits it: computed tokens become cached blocks, every sequence
  whose prompt is fully computed samples one token, finished sequences free their
  blocks. It returns a ``StepOutcome``.

``step(now)`` does both for callers that do not need the gap.

Timing model, per step: ``decode_step_ms`` (fixed cost of a forward pass) +
``decode_ms_per_seq`` x sequences decoding + ``prefill_us_per_token`` x prompt tokens
computed (cached tokens cost nothing — that is the point of the prefix cache).

Scheduling follows vLLM's shape: FCFS admission while there is room in the batch
(``max_num_seqs``), in the per-step token budget (``max_num_batched_tokens``) and in
the cache; a long prompt is prefilled in budget-sized chunks; a new sequence gets
blocks for its whole prompt up front; a decoding sequence that needs a block when
none is free preempts the most recently admitted sequence, which frees its blocks
and goes back to the front of the queue to be recomputed later (its prefix is then
usually still cached).

Output: every sequence generates exactly ``max_tokens`` tokens (there is no EOS), each
a pseudo-word from ``tokens.WORDS`` drawn from a per-sequence RNG seeded by the
request's seed (or one drawn from the engine's seeded RNG) mixed with its prompt.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence as SequenceT

import attrs

from llmgw.domain.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from llmgw.sim import tokens

BLOCK_SIZE = 16
#: Where the sim's cached blocks live, as vLLM names it in its events.
MEDIUM = "GPU"


@attrs.frozen
class EngineConfig:
    """Capacity and timing of one simulated replica."""

    max_num_seqs: int = 64
    num_blocks: int = 4096
    block_size: int = BLOCK_SIZE
    max_num_batched_tokens: int = 4096
    max_model_len: int = 16384
    prefill_us_per_token: float = 50.0
    decode_step_ms: float = 10.0
    decode_ms_per_seq: float = 0.5
    enable_prefix_caching: bool = True
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("max_num_seqs", "num_blocks", "block_size", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("prefill_us_per_token", "decode_step_ms", "decode_ms_per_seq"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


@attrs.frozen
class Request:
    """What a client asks the engine for, already tokenized."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    seed: int | None = None
    #: The scheduler leaves the request waiting until this time (fault injection).
    not_before: float = 0.0


@attrs.frozen
class Token:
    """One generated token of one sequence."""

    request_id: str
    token_id: int
    text: str
    index: int  # 0 for the first generated token
    finished: bool


@attrs.frozen
class Finished:
    """A sequence that produced its last token, with what its usage reports."""

    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    arrival: float
    first_token_at: float
    finished_at: float


@attrs.frozen
class ScheduledStep:
    """A batch the engine is about to run."""

    started: float
    duration: float
    #: (request_id, tokens computed this step) for every sequence in the batch.
    work: tuple[tuple[str, int], ...]
    num_decodes: int
    num_prefill_tokens: int
    preempted: tuple[str, ...]

    @property
    def ends(self) -> float:
        return self.started + self.duration


@attrs.frozen
class StepOutcome:
    step: ScheduledStep
    tokens: tuple[Token, ...]
    finished: tuple[Finished, ...]
    #: Time to first token of every sequence that produced its first token.
    first_token_latencies: tuple[float, ...]


@attrs.frozen
class Stats:
    """Counters and gauges in the units vLLM reports them."""

    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of blocks held by live sequences, 0..1
    num_blocks: int
    num_used_blocks: int
    num_cached_blocks: int  # blocks with a registered prefix hash, in use or not
    prompt_tokens: int
    generation_tokens: int
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # of which were found
    requests_finished: int
    requests_aborted: int
    preemptions: int


@attrs.frozen
class Running:
    """One sequence of the running batch, as llama-server's ``/slots`` shows a slot."""

    request_id: str
    prompt_tokens: int
    computed_tokens: int  # of prompt and output, whose KV is in the cache
    cached_tokens: int  # prompt tokens found in the prefix cache at admission
    output_tokens: int
    max_tokens: int


class BlockManager:
    """The paged KV cache: fixed-size blocks, reference counts, a prefix cache.

    A full block of a sequence is registered under a chained hash of its tokens (the
    hash of the previous block and the block's own token ids), so equal hashes mean
    equal prefixes. A block whose last user finished keeps its registration and waits
    in an LRU list; it is reused by a later prompt with the same prefix or, when free
    blocks run out, evicted — least recently released first.
    """

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        # Unreferenced blocks that still hold a cached prefix, oldest first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._by_hash: dict[int, int] = {}
        #: What changed in the prefix cache since it was last taken, in vLLM's event
        #: terms; None (the default) records nothing.
        self.events: list[Event] | None = None

    @property
    def num_free(self) -> int:
        """Blocks that an allocation may take (never used, or cached but unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def lookup(self, hashes: SequenceT[int]) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes` (not yet referenced)."""
        found: list[int] = []
        if not self.caching:
            return found
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def can_allocate(self, num_new: int, reused: SequenceT[int]) -> bool:
        # Reused blocks sitting in the LRU list stop being evictable once taken.
        idle_reused = sum(1 for b in reused if self._ref[b] == 0)
        return num_new <= self.num_free - idle_reused

    def take(self, block: int) -> None:
        """Reference a cached block found by `lookup`."""
        if self._ref[block] == 0:
            self._evictable.pop(block, None)
        self._ref[block] += 1

    def allocate(self) -> int:
        """A fresh block with one reference; evicts the LRU cached block if needed."""
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._unregister(block)
        else:
            raise RuntimeError("no free KV block (the scheduler should have checked)")
        self._ref[block] = 1
        return block

    def release(self, blocks: SequenceT[int]) -> None:
        """Drop one reference to each block; a sequence's tail is evicted before its head."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if self._hash[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    def register(self, block: int, block_hash: int) -> bool:
        """Record that `block` is full and holds the prefix `block_hash`; False when it
        was not registered (an identical block is already cached, or no caching)."""
        if not self.caching or block_hash in self._by_hash or self._hash[block] is not None:
            return False  # an identical block is already cached: keep the first one
        self._hash[block] = block_hash
        self._by_hash[block_hash] = block
        return True

    def reset(self) -> None:
        """Forget every cached prefix (vLLM's /reset_prefix_cache)."""
        for block in list(self._evictable):
            self._hash[block] = None
            self._free.append(block)
        self._evictable.clear()
        for block in self._by_hash.values():
            self._hash[block] = None
        self._by_hash.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())

    def _unregister(self, block: int) -> None:
        h = self._hash[block]
        if h is not None and self._by_hash.get(h) == block:
            del self._by_hash[h]
            if self.events is not None:
                self.events.append(BlockRemoved((h,), MEDIUM))
        self._hash[block] = None


class Sequence:
    """A request's mutable life inside the engine; owned by the Engine."""

    def __init__(self, request: Request, arrival: float, seed: int, block_size: int) -> None:
        self.request = request
        self.arrival = arrival
        self.block_size = block_size
        self.tokens: list[int] = list(request.prompt)  # prompt, then generated tokens
        self.num_prompt = len(request.prompt)
        self.num_output = 0
        self.num_computed = 0  # tokens whose KV is in the cache
        self.blocks: list[int] = []
        self.cached_tokens = 0  # prefix-cache hit at first admission
        self.admitted_once = False
        self.first_token_at: float | None = None
        self._hashes: list[int] = []
        digest = zlib.crc32(array("q", request.prompt).tobytes())
        self.rng = random.Random((seed << 32) ^ digest)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    def block_hashes(self, count: int) -> list[int]:
        """Chained hashes of the first `count` full blocks (count must be <= full blocks)."""
        bs = self.block_size
        while len(self._hashes) < count:
            i = len(self._hashes)
            parent = self._hashes[-1] if self._hashes else 0
            # Tuples of ints hash the same in every process (no string salting).
            self._hashes.append(hash((parent, *self.tokens[i * bs : (i + 1) * bs])))
        return self._hashes[:count]


class Engine:
    """Scheduler, KV cache and token generator of one simulated replica."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.kv = BlockManager(self.config.num_blocks, self.config.enable_prefix_caching)
        self._rng = random.Random(self.config.seed)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._inflight: ScheduledStep | None = None
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._finished = 0
        self._aborted = 0
        self._preemptions = 0

    # -- requests -------------------------------------------------------------------------

    def check(self, prompt_len: int, max_tokens: int) -> None:
        """Raise ValueError if a request of this shape can never run here."""
        cfg = self.config
        if prompt_len < 1:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if prompt_len + max_tokens > cfg.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {cfg.max_model_len} tokens; "
                f"the request has {prompt_len} prompt tokens and asks for {max_tokens} more"
            )
        if -(-(prompt_len + max_tokens) // cfg.block_size) > cfg.num_blocks:
            raise ValueError(
                f"the request needs {prompt_len + max_tokens} tokens of KV cache; "
                f"the cache holds {cfg.num_blocks * cfg.block_size}"
            )

    def add(self, request: Request, now: float) -> None:
        """Queue a request. Raises ValueError for an impossible one or a duplicate id."""
        self.check(len(request.prompt), request.max_tokens)
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
        seq = Sequence(request, now, seed, self.config.block_size)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks now; False if unknown."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return False
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self.kv.release(seq.blocks)
        seq.blocks = []
        self._aborted += 1
        return True

    def reset_prefix_cache(self) -> None:
        self.kv.reset()

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def next_wakeup(self, now: float) -> float | None:
        """When the next request held back by `not_before` becomes eligible, if any."""
        times = [s.request.not_before for s in self._waiting if s.request.not_before > now]
        return min(times) if times else None

    def stats(self) -> Stats:
        return Stats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_usage=self.kv.usage(),
            num_blocks=self.kv.num_blocks,
            num_used_blocks=self.kv.num_used,
            num_cached_blocks=self.kv.num_cached,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            prefix_queries=self._prefix_queries,
            prefix_hits=self._prefix_hits,
            requests_finished=self._finished,
            requests_aborted=self._aborted,
            preemptions=self._preemptions,
        )

    def running(self) -> list[Running]:
        """The running batch, in admission order."""
        return [
            Running(
                request_id=seq.request_id,
                prompt_tokens=seq.num_prompt,
                computed_tokens=seq.num_computed,
                cached_tokens=seq.cached_tokens,
                output_tokens=seq.num_output,
                max_tokens=seq.request.max_tokens,
            )
            for seq in self._running
        ]

    def cached_tokens(self, request_id: str) -> int:
        seq = self._by_id.get(request_id)
        return seq.cached_tokens if seq is not None else 0

    # -- stepping -------------------------------------------------------------------------

    def step(self, now: float) -> StepOutcome | None:
        """Schedule and complete one step at once; None when there is nothing to run."""
        scheduled = self.begin_step(now)
        if scheduled is None:
            return None
        return self.end_step(scheduled.ends)

    def begin_step(self, now: float) -> ScheduledStep | None:
        """Pick the next batch and reserve its KV blocks; None when there is nothing to run."""
        if self._inflight is not None:
            raise RuntimeError("begin_step called twice without end_step")
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        work: list[tuple[str, int]] = []
        decodes = 0
        prefill_tokens = 0
        preempted: list[str] = []

        i = 0
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            n = min(seq.num_uncomputed, budget)
            while not self._grow(seq, n):
                victim = self._running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is seq:
                    break
            if seq not in self._running:
                break  # it preempted itself: nothing after it can run either
            work.append((seq.request_id, n))
            budget -= n
            if seq.num_uncomputed == 1:
                decodes += 1
            else:
                prefill_tokens += n
            i += 1

        # vLLM admits nothing in a step that had to preempt: the cache is tight. (An
        # empty batch admits anyway, so the engine can never stall with work queued.)
        if not preempted or not work:
            for seq in self._admit(now, budget):
                n = min(seq.num_uncomputed, budget)
                work.append((seq.request_id, n))
                budget -= n
                prefill_tokens += n

        if not work:
            return None
        duration = (
            cfg.decode_step_ms / 1e3
            + cfg.decode_ms_per_seq / 1e3 * decodes
            + cfg.prefill_us_per_token / 1e6 * prefill_tokens
        )
        self._inflight = ScheduledStep(
            started=now,
            duration=duration,
            work=tuple(work),
            num_decodes=decodes,
            num_prefill_tokens=prefill_tokens,
            preempted=tuple(preempted),
        )
        return self._inflight

    def end_step(self, now: float) -> StepOutcome:
        """Commit the batch from `begin_step`; sequences aborted meanwhile are skipped."""
        scheduled = self._inflight
        if scheduled is None:
            raise RuntimeError("end_step called without begin_step")
        self._inflight = None
        out: list[Token] = []
        done: list[Finished] = []
        ttfts: list[float] = []
        bs = self.config.block_size
        for request_id, n in scheduled.work:
            seq = self._by_id.get(request_id)
            if seq is None or seq not in self._running:
                continue  # aborted (or preempted by an abort-free path) during the step
            full_before = seq.num_computed // bs
            seq.num_computed += n
            full_after = seq.num_computed // bs
            if full_after > full_before:
                hashes = seq.block_hashes(full_after)
                run: list[int] = []  # consecutive blocks registered: one event
                for b in range(full_before, full_after):
                    if self.kv.register(seq.blocks[b], hashes[b]):
                        run.append(b)
                        continue
                    self._stored(seq, hashes, run)
                    run = []
                self._stored(seq, hashes, run)
            if seq.num_uncomputed > 0:
                continue  # prefill still has chunks to go
            token = self._sample(seq, now)
            out.append(token)
            if token.index == 0:
                ttfts.append(now - seq.arrival)
                self._prompt_tokens += seq.num_prompt
            if token.finished:
                done.append(self._finish(seq, now))
        return StepOutcome(
            step=scheduled,
            tokens=tuple(out),
            finished=tuple(done),
            first_token_latencies=tuple(ttfts),
        )

    # -- KV-cache events --------------------------------------------------------------

    def record_kv_events(self) -> None:
        """Record what changes in the prefix cache from now on (:meth:`take_kv_events`)."""
        if self.kv.events is None:
            self.kv.events = []

    def take_kv_events(self) -> list[Event]:
        """The cache's events since the last call, oldest first."""
        events = self.kv.events
        if not events:
            return []
        self.kv.events = []
        return events

    def _stored(self, seq: Sequence, hashes: list[int], run: list[int]) -> None:
        """One BlockStored for the consecutive blocks `run` of `seq` just registered."""
        if not run or self.kv.events is None:
            return
        bs = self.config.block_size
        first, last = run[0], run[-1]
        self.kv.events.append(
            BlockStored(
                tuple(hashes[first : last + 1]),
                hashes[first - 1] if first > 0 else None,
                tuple(seq.tokens[first * bs : (last + 1) * bs]),
                bs,
                MEDIUM,
            )
        )

    # -- internals ------------------------------------------------------------------------

    def _admit(self, now: float, budget: int) -> list[Sequence]:
        cfg = self.config
        admitted: list[Sequence] = []
        if budget <= 0 or len(self._running) >= cfg.max_num_seqs:
            return admitted  # the common case under load: skip copying a long queue
        for seq in list(self._waiting):
            if budget <= 0 or len(self._running) >= cfg.max_num_seqs:
                break
            if seq.request.not_before > now:
                continue  # held back by a fault; others may pass it
            # At least one token must be computed to sample from, so a fully cached
            # prompt still recomputes its last block (as vLLM does).
            cacheable = (len(seq.tokens) - 1) // cfg.block_size
            hits = self.kv.lookup(seq.block_hashes(cacheable))
            need = -(-len(seq.tokens) // cfg.block_size) - len(hits)
            if not self.kv.can_allocate(need, hits):
                break  # FCFS: the head waits for room, and so does everyone behind it
            for b in hits:
                self.kv.take(b)
            seq.blocks = [*hits, *(self.kv.allocate() for _ in range(need))]
            seq.num_computed = len(hits) * cfg.block_size
            if not seq.admitted_once:
                seq.admitted_once = True
                seq.cached_tokens = seq.num_computed
                self._prefix_queries += seq.num_prompt
                self._prefix_hits += seq.num_computed
            self._waiting.remove(seq)
            self._running.append(seq)
            admitted.append(seq)
            budget -= min(seq.num_uncomputed, budget)
        return admitted

    def _grow(self, seq: Sequence, n: int) -> bool:
        """Make room for `n` more computed tokens; False if the cache is full."""
        need = -(-(seq.num_computed + n) // self.config.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        if self.kv.num_free < need:
            return False
        seq.blocks.extend(self.kv.allocate() for _ in range(need))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq)
        self.kv.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        self._waiting.appendleft(seq)
        self._preemptions += 1

    def _sample(self, seq: Sequence, now: float) -> Token:
        word = seq.rng.randrange(len(tokens.WORDS))
        token_id = tokens.WORD_IDS[word]
        seq.tokens.append(token_id)
        index = seq.num_output
        seq.num_output += 1
        if index == 0:
            seq.first_token_at = now
        self._generation_tokens += 1
        return Token(
            request_id=seq.request_id,
            token_id=token_id,
            text=tokens.WORDS[word],
            index=index,
            finished=seq.num_output >= seq.request.max_tokens,
        )

    def _finish(self, seq: Sequence, now: float) -> Finished:
        self._running.remove(seq)
        del self._by_id[seq.request_id]
        self.kv.release(seq.blocks)
        seq.blocks = []
        self._finished += 1
        first = seq.first_token_at if seq.first_token_at is not None else now
        return Finished(
            request_id=seq.request_id,
            prompt_tokens=seq.num_prompt,
            completion_tokens=seq.num_output,
            cached_tokens=seq.cached_tokens,
            arrival=seq.arrival,
            first_token_at=first,
            finished_at=now,
        )
