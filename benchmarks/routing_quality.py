"""Routing quality: engine personalities x workloads, llmgw beside its peers, round robin
and a pinned oracle, all in front of the same four replicas in one run.

    python benchmarks/routing_quality.py [--quick] [--json] [--engine sim|llamacpp]
                                         [--personality NAME]... [--workload NAME]...
                                         [--no-peers] [--concurrency N] [--rounds N]
                                         [--trace PATH] [--trace-start S]
                                         [--trace-seconds S] [--trace-scale K]
                                         [--trace-speed X]

    # real llama-server replicas, the built-in workloads (scripts/llama_server.sh first)
    python benchmarks/routing_quality.py --engine llamacpp
    # the trace replay beside the peers (benchmarks/setup_peers.sh first), on each engine
    python benchmarks/routing_quality.py --engine llamacpp --workload trace
    python benchmarks/routing_quality.py --personality vllm --workload trace
    # another window, or another trace of the same format
    python benchmarks/routing_quality.py --workload trace --trace-start 600 --trace PATH

Everything runs on 127.0.0.1 and is started and stopped by this script.

Engines (--engine): `sim` (default), llmgw-sim's personalities below; `llamacpp`, an
engine llmgw's authors did not write: four real `llama-server` processes (the binary
scripts/llama_server.sh builds and caches) of llmgw.testing.gguf's tiny model, each
with `-np 4` slots of 12,288 tokens (`-c 49152`; `--override-kv
llama.context_length=int:12288`, as llama-server caps a slot at the model's 4,096),
`-t 1`, `--metrics`, `--cache-ram 0`
(no host-memory prompt cache: the slots' KV is the only cache, a real prefix cache:
a request reuses the longest common prefix of its slot's previous prompt, and goes to
the idle slot whose prompt is most like its own, `--slot-prompt-similarity 0.1`, the
default) and `--slot-save-path` (needed for the slot actions, of which only erase is
used). The argv is printed. The tiny model's vocabulary is byte-level: a workload
word (3 letters and a space) is ~4 of its tokens, 1 on llmgw-sim. The replica's POST
/tokenize measures it (printed), and every workload's sizes below are in tokens on
either engine: on llama-server a 2,000-token prompt is ~515 words.

Personalities (llmgw.sim.personalities): for each one, four `llmgw-sim --personality P
--seed i` replicas (i = 0..3) and nothing else on their command lines, then one router
of each kind in front of the four. Default: vllm, llamacpp, small-cache, prefill-heavy;
sglang with --personality sglang. Every prompt fits the smallest max_model_len (4096
tokens: llamacpp, small-cache), so no personality needs a flag of its own.

Workloads (this script's own generator; llmgw.bench has no Zipf or growing sessions),
streamed, 32 output tokens each (ignore_eos):

* uniform: 8 tenants, each a 2,000-token system prompt shared by all its requests plus
  a 100-token unique user message; the tenant of a request drawn uniformly;
* zipf: the same prompts, tenants drawn with weights 1/k^1.1 (k = 1..8): the hottest
  gets ~40% of the requests, more than one replica's share (25%);
* sessions: conversations of 8 turns; each starts with a 1,000-token opening of its own
  (a system message), each turn adds a 100-token user message, and each request sends
  the whole conversation so far (with 32-token assistant replies of the client's
  making, not the engine's output) and llmgw's session header `x-session-id`;
* long: 2,000-token unique prompts, nothing shared;
* hot: uniform's prompts, one tenant sending 80% of the requests (the other seven
  share the rest evenly): its home cannot hold it alone, and where its overflow goes
  decides how many caches it warms;
* mixed (not in the default matrix): uniform's prompts, half the requests (drawn at
  random) sent with `x-llmgw-band: bronze` as a batch client would;
* trace (not in the default matrix): a replay of a production trace in Mooncake's
  format (--trace PATH, default ../shared/traces/mooncake_synthetic_trace.jsonl beside
  the checkout: one JSON object a line with `timestamp` in ms, `input_length`,
  `output_length` and `hash_ids`, one id per 512-token block; requests sharing leading
  ids share that prefix). The requests arriving in [--trace-start, + --trace-seconds)
  of the trace (default 0 and 300 s; 120 with --quick) are sent open loop at their own
  arrival times divided by --trace-speed (default 10, 4 on llama-server, whose four
  one-thread replicas prefill ~8,000 tokens/s each here: blocks recur over minutes, not
  seconds, so a short window holds little sharing: 7% of the block references of the
  Mooncake trace's first 2 minutes repeat one of them, 17% of 5 minutes, 64% of all
  17), with no shedding below --concurrency x 8 in flight. Token counts are divided by
  --trace-scale (default 16: a block is 32 tokens, the Mooncake trace's mean input of
  15,325 tokens becomes ~960) to fit these cores; the header prints the factors. Each
  block id has a fixed text of its scaled size (a first word of its own -- the id in
  base 26 -- then seeded vocabulary words), so two ids never share a cache block; a
  prompt is one user message, its blocks' texts in order (the last block its share of
  input_length), cut after 3,800 tokens (trailing blocks dropped; the count is
  printed). Output: output_length / scale tokens, at least 1, at most 32. The oracle
  pins a request by its first hash id. No closed loop and no Poisson turn: one replay
  per target, the first quarter of it unmeasured (the caches were reset and fill), the
  rest measured like an open-loop window (TTFT p50/p90/p99, e2e, arrivals and answers
  per second, hit rate, busiest replica, router CPU per request).

Targets, interleaved (each cell and each round starting one target later), the same
prompts for all within a round; no target ever sees another cell's prefixes:

* round robin: the client spreads requests over the four replicas in cycles of four,
  each cycle visiting every replica once in a seeded shuffled order;
* pinned oracle (reference, not a contender): the client sends tenant t to replica
  t mod 4 (uniform, zipf, hot, mixed), session s to replica s mod 4 (sessions), and rotates
  strictly where nothing is shared (long). It knows what a router has to guess and
  ignores load;
* llmgw: `llmgw-server` with its DEFAULT configuration (no config file; no store,
  `store.url = ""`);
* vllm-router cache_aware and sglang-router cache_aware: PyPI's routers
  (benchmarks/setup_peers.sh) with their cache_aware policy and its defaults. Skipped,
  with the reason printed, when not installed, when they fail to start, or --no-peers.

Each cell (personality x workload), per round: first a closed-loop turn per target
(--concurrency workers, default 32, each sending its next request when the previous
one was answered; a session is one worker's conversation), then an open-loop turn per
target: Poisson arrivals of requests (seeded, the same times for every target) at 1.2x
round robin's closed-loop throughput of that round, meant to saturate round robin. An
arrival sends the next turn of the session that has waited longest for it (its
previous answer in), else a new conversation's first request, so conversations keep
their order. An arrival finding --concurrency x 8 requests in flight is shed.

Before each turn every replica is idle by its own /metrics (and by llmgw's scrapes
before llmgw's turns) and every replica's prefix cache is reset (POST
/reset_prefix_cache on llmgw-sim; llama-server has none: POST /slots/{id}?action=erase
for each of its slots), so no target inherits another's cache. The start of a turn, all
misses at once, is not measured: the window opens after 1 s (0.5 with --quick), in a
closed loop not before every worker has had its first answer (15 s at most), and lasts
4 s (2 s), in a closed loop at least until --concurrency answers came in it (at most
3x as long: on a slow personality a shorter window would hold no answers). Every turn
is bounded by time and request count and every request by a 60 s timeout; requests in
flight when a window closes finish and are measured if they started in it.

Reported per target per cell, over the measured windows: TTFT p50/p90/p99 and e2e p50
of the closed loop; closed-loop req/s (answers inside the window over its length);
open loop: arrivals and answers per second (the window's arrivals answered, over the
time from the window's start to the last of their answers: an engine that shares its
prefill among everything it holds answers late and in a bunch) and TTFT p90; the
fleet's prefix-cache hit rate (hit / looked-up prompt tokens from the replicas' own
counters: vllm:prefix_cache_*, sglang:cached_tokens / prompt_tokens,
llamacpp:prompt_tokens_cached / (that + prompt_tokens)); the busiest replica's requests
over the mean (the replicas' own counters: vllm:request_success, sglang:num_requests;
llama.cpp's page counts no requests, so tokens_predicted / 32 there, on the trace the
generated tokens' share: outputs vary); the router
process's CPU (utime + stime, direct children included) per request answered. The
last three cover both loops, from each window's start to the turn's end. Then a
summary of all cells against the issue's targets: TTFT p90 within 1.1x of the best
peer's and never above round robin's (closed and open loop each), busiest replica <=
1.15x the mean, closed-loop throughput >= 2x round robin's where prefixes are shared
(beside the oracle's own ratio, which says how much there was to gain). Nothing is
asserted.

The run takes ~40 min with the defaults (4 personalities x 5 workloads x 6 targets;
the estimate is printed first), ~5 min with --quick (vllm and small-cache x uniform,
zipf and sessions, shorter windows); with --engine llamacpp the estimate borrows the
sim's llamacpp personality's figures and is rough (the real replicas share the cores
with everything else); a trace cell costs its replay's length per target plus a few
seconds. Progress goes to stderr, --json prints every
number on stdout instead of the tables.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llmgw import bench
from llmgw.bench.workload import VOCABULARY
from llmgw.sim import personalities as zoo
from llmgw.testing.procs import LOOPBACK, Proc

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

MODEL = "bench-model"
REPLICAS = 4
CONCURRENCY = 32
OUTPUT_TOKENS = 32
REQUEST_TIMEOUT = 60.0
OPEN_FACTOR = 1.2  # open-loop rate over round robin's closed-loop throughput
IN_FLIGHT_FACTOR = 8  # open loop: at most concurrency x this many requests in flight
SEED = 11

TENANTS = 8
SYSTEM_TOKENS = 2000
UNIQUE_TOKENS = 100
ZIPF_EXPONENT = 1.1
HOT_SHARE = 0.8  # issue #31's "one tenant with ~80% of the requests": >3x one replica's share
SESSION_TURNS = 8
OPENING_TOKENS = 1000
TURN_TOKENS = 100
LONG_TOKENS = 2000

DEFAULT_PERSONALITIES = ("vllm", "llamacpp", "small-cache", "prefill-heavy")
QUICK_PERSONALITIES = ("vllm", "small-cache")
DEFAULT_WORKLOADS = ("uniform", "zipf", "sessions", "long", "hot")
QUICK_WORKLOADS = ("uniform", "zipf", "sessions")

RR = "round robin"
ORACLE = "pinned oracle"
# llmgw with its built-in cache_aware profile (the peers' rule): the default may not
# lose to it in any cell (issue #31).
LLMGW_CA = "llmgw cache_aware"
CACHE_AWARE_CONFIG = '[router]\ndefault_profile = "cache_aware"\n'
LLMGW = "llmgw"
LLMGW_KV = "llmgw kv-events"
VLLM = "vllm-router cache_aware"
SGLANG = "sglang-router cache_aware"
PEERS = (VLLM, SGLANG)

# The issue's targets.
TARGET_VS_PEER = 1.1  # llmgw TTFT p90 / best peer's, at most
TARGET_VS_RR = 1.0  # llmgw TTFT p90 / round robin's, at most
TARGET_BUSIEST = 1.15  # busiest replica / mean, at most
TARGET_THROUGHPUT = 2.0  # llmgw closed-loop req/s / round robin's, at least (shared prefixes)

# --engine llamacpp: real llama-server replicas of llmgw.testing.gguf's tiny model.
LLAMA_ENGINE = "llama-server"  # the bed's name where a personality's would be
LLAMA_SLOTS = 4  # -np: sequences a replica runs at once, each slot its own prompt cache
LLAMA_SLOT_CONTEXT = 12288  # tokens per slot (-c is this x slots): the longest prompt
# of the built-in workloads is ~2,100 words, ~8,000 tokens of the tiny model's bytes
LLAMA_THREADS = 1
# Flags beyond the model, the listener, --metrics, slots, context and threads: the prompt
# cache (cache_prompt, on by default in requests) reuses a slot's longest common prefix;
# a request goes to the idle slot whose previous prompt is most like its own (similarity
# over 0.1, llama-server's default); the host-memory prompt cache (--cache-ram) is off,
# so the slots' KV is the only cache and erasing the slots empties it;
# --slot-save-path enables the /slots actions (erase) used as the reset between turns.
# The tiny model says its context is 4096 tokens and llama-server caps a slot there:
# --override-kv raises it (its weights are random; nothing is lost).
LLAMA_FLAGS = (
    *("--cache-ram", "0", "--slot-prompt-similarity", "0.1"),
    *("--override-kv", f"llama.context_length=int:{LLAMA_SLOT_CONTEXT}"),
)

# --workload trace: a replay of a trace of Mooncake's format (one JSON object a line:
# timestamp ms, input_length, output_length, hash_ids one per BLOCK_TOKENS-token block).
TRACE_FILE = Path("shared") / "traces" / "mooncake_synthetic_trace.jsonl"
TRACE_BLOCK_TOKENS = 512
TRACE_SCALE = 16.0  # token counts (blocks, inputs, outputs) divided by this
TRACE_START = 0.0  # s into the trace
# A block comes back minutes later, not seconds: in the Mooncake trace 7% of the block
# references of its first 2 minutes repeat an earlier one of the same window, 17% of 5
# minutes, 36% of 10, 64% of the whole 17. So a window of minutes, replayed faster.
TRACE_SECONDS = 300.0  # of the trace (before --trace-speed)
TRACE_QUICK_SECONDS = 120.0
# Arrivals this many times as fast as the trace's, by engine: four llama-server replicas
# of the tiny model prefill ~8,000 tokens/s each here (one thread, short prompts), too
# few for 10x the trace at these scaled sizes (~35 requests/s of ~950 tokens).
TRACE_SPEED = {"sim": 10.0, "llamacpp": 4.0}
TRACE_WARM = 0.25  # of the replay unmeasured (at least the open-loop warm-up): caches fill
TRACE_MAX_PROMPT = 3800  # tokens after scaling: trailing blocks beyond are dropped (every
# sim personality's max_model_len is >= 4096; llama-server's slots hold 12,288)


def default_trace() -> Path:
    """../shared/traces/ beside the checkout (or beside a parent of it: a worktree)."""
    for parent in Path(__file__).resolve().parents[1:]:
        if (parent / TRACE_FILE).is_file():
            return parent / TRACE_FILE
    return Path(__file__).resolve().parents[2] / TRACE_FILE


WARM_MOST = 15.0  # s: a turn's measured window opens by then at the latest
PIN_HEADER = "x-bench-pin"  # the oracle's own, read and removed by its transport

# Printed estimate: what a turn costs beyond its bounded duration (idle wait, cache
# reset, requests in flight finishing), and what a personality costs to set up.
TURN_OVERHEAD = 0.8  # s per turn: idle waits, cache resets, scrapes
PERSONALITY_SETUP = 10.0  # s: four replicas and three routers
WARM_PER_TARGET = 1.0


@attrs.frozen
class Settings:
    rounds: int
    # Each turn: an unmeasured start (caches were reset: the target builds its own),
    # then the measured window; bounded by time and by a request count.
    closed_warm: float
    closed_seconds: float
    closed_requests: int
    open_warm: float
    open_seconds: float
    open_requests: int
    warm_requests: int  # per target, once per personality


DEFAULT = Settings(
    rounds=1,
    closed_warm=1.0,
    closed_seconds=4.0,
    closed_requests=3000,
    open_warm=1.0,
    open_seconds=4.0,
    open_requests=3000,
    warm_requests=16,
)
QUICK = Settings(
    rounds=1,
    closed_warm=0.5,
    closed_seconds=2.0,
    closed_requests=1500,
    open_warm=0.5,
    open_seconds=2.0,
    open_requests=1500,
    warm_requests=8,
)


# -- workloads -------------------------------------------------------------------------------


@attrs.frozen
class Request:
    messages: tuple[dict[str, str], ...]
    group: int  # tenant or session number (recorded in the samples)
    pin: int | None  # what the oracle pins on; None: it rotates
    words: int
    session: str | None = None
    band: str | None = None
    max_tokens: int = OUTPUT_TOKENS
    at: float = 0.0  # replay: seconds after the replay's start it arrives


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=n))


class Workload:
    name: str
    title: str
    shared: bool  # prefixes shared between requests: the throughput target applies
    # For the printed estimate only: a request's prompt tokens (on average), and those
    # it prefills when routing is decent.
    prompt_tokens: int
    uncached_tokens: int
    replay = False  # a trace replayed at its own arrival times, not the loops
    # Tokens a word of the text is on the engine (set per bed): 1 on llmgw-sim, ~4 on
    # the tiny model's byte-level vocabulary. Sizes are in tokens: n tokens, n / this words.
    tokens_per_word = 1.0

    def n(self, tokens: int) -> int:
        """Words for `tokens` tokens on the engine."""
        return max(1, round(tokens / self.tokens_per_word))

    def conversation(self, seed: str, index: int) -> list[Request]:
        raise NotImplementedError


class Tenants(Workload):
    """8 tenants' system prompts plus a unique user message; tenants drawn by weight."""

    def __init__(self, name: str, title: str, weights: Sequence[float], bronze: float = 0.0):
        self.name, self.title, self.shared = name, title, True
        self.prompt_tokens = SYSTEM_TOKENS + UNIQUE_TOKENS
        self.uncached_tokens = UNIQUE_TOKENS + SYSTEM_TOKENS // 4
        self.weights = list(weights)
        self.bronze = bronze
        self._systems: dict[tuple[str, int, float], str] = {}

    def system(self, seed: str, tenant: int) -> str:
        key = (seed, tenant, self.tokens_per_word)
        if key not in self._systems:
            rng = random.Random(f"rq:{seed}:system:{tenant}")
            # Distinct first words: two tenants share not even one cache block.
            offset = random.Random(f"rq:{seed}:offset").randrange(len(VOCABULARY))
            first = VOCABULARY[(offset + tenant) % len(VOCABULARY)]
            self._systems[key] = f"{first} {_words(rng, self.n(SYSTEM_TOKENS) - 1)}"
        return self._systems[key]

    def conversation(self, seed: str, index: int) -> list[Request]:
        rng = random.Random(f"rq:{seed}:request:{index}")
        tenant = rng.choices(range(TENANTS), self.weights)[0]
        user = _words(rng, self.n(UNIQUE_TOKENS))
        band = "bronze" if self.bronze and rng.random() < self.bronze else None
        messages = (
            {"role": "system", "content": self.system(seed, tenant)},
            {"role": "user", "content": user},
        )
        words = self.n(SYSTEM_TOKENS) + self.n(UNIQUE_TOKENS)
        return [Request(messages, tenant, tenant, words, band=band)]


class Sessions(Workload):
    name = "sessions"
    title = (
        f"sessions of {SESSION_TURNS} turns: a {OPENING_TOKENS}-token opening of their own, "
        f"+{TURN_TOKENS}-token user and {OUTPUT_TOKENS}-token assistant messages per turn, "
        "the whole conversation sent each turn, x-session-id"
    )
    shared = True
    prompt_tokens = OPENING_TOKENS + SESSION_TURNS * (TURN_TOKENS + OUTPUT_TOKENS) // 2
    uncached_tokens = 600

    def conversation(self, seed: str, index: int) -> list[Request]:
        rng = random.Random(f"rq:{seed}:session:{index}")
        session = f"rq-{seed}-{index}"
        opening = _words(rng, self.n(OPENING_TOKENS))
        history: list[dict[str, str]] = [{"role": "system", "content": opening}]
        out = []
        for _turn in range(SESSION_TURNS):
            history.append({"role": "user", "content": _words(rng, self.n(TURN_TOKENS))})
            words = sum(len(m["content"].split()) for m in history)
            out.append(Request(tuple(history), index, index, words, session=session))
            # The next turn carries this one's answer (the client's stand-in for it).
            answer = _words(rng, self.n(OUTPUT_TOKENS))
            history.append({"role": "assistant", "content": answer})
        return out


class Long(Workload):
    name = "long"
    title = f"{LONG_TOKENS}-token unique prompts, nothing shared"
    shared = False
    prompt_tokens = uncached_tokens = LONG_TOKENS

    def conversation(self, seed: str, index: int) -> list[Request]:
        rng = random.Random(f"rq:{seed}:long:{index}")
        messages = ({"role": "user", "content": _words(rng, self.n(LONG_TOKENS))},)
        return [Request(messages, 0, None, self.n(LONG_TOKENS))]


@attrs.frozen
class TraceSpec:
    """Which part of which trace, scaled how (see Trace)."""

    path: Path
    start: float  # s into the trace
    seconds: float  # of the trace
    scale: float  # token counts divided by this
    speed: float  # arrivals this many times as fast


def _block_word(block: int) -> str:
    """A word of its own for a block id: its base-26 digits, least significant first
    (consecutive ids differ in their first letter), at least three letters."""
    letters = []
    n = block
    while True:
        n, d = divmod(n, 26)
        letters.append(chr(ord("a") + d))
        if not n and len(letters) >= 3:
            return "".join(letters)


class Trace(Workload):
    """A replay of a trace of Mooncake's format (see the module docstring): request i
    arrives (timestamp - start) / speed s after the replay's start, its prompt is the
    text of its hash ids' blocks, each block's text fixed by its id alone (distinct ids:
    distinct first words), BLOCK_TOKENS / scale tokens a block (the last block its
    share of input_length), and it asks for output_length / scale tokens (at least 1, at
    most OUTPUT_TOKENS). Prompts longer than TRACE_MAX_PROMPT tokens lose their
    trailing blocks. The oracle pins a request by its first hash id."""

    name = "trace"
    shared = True
    replay = True

    def __init__(self, spec: TraceSpec) -> None:
        self.spec = spec
        self.title = (
            f"replay of {spec.path.name}, {spec.start:g}-{spec.start + spec.seconds:g} s, "
            f"token counts / {spec.scale:g} ({TRACE_BLOCK_TOKENS}-token blocks -> "
            f"{self.block_tokens:g}), outputs / {spec.scale:g} capped at {OUTPUT_TOKENS}, "
            f"arrivals x{spec.speed:g}"
        )
        self.prompt_tokens = self.uncached_tokens = 0
        self._rows: list[dict[str, Any]] | None = None
        self._blocks: dict[tuple[int, int], str] = {}
        self.truncated = 0

    @property
    def block_tokens(self) -> float:
        return TRACE_BLOCK_TOKENS / self.spec.scale

    @property
    def duration(self) -> float:
        """Seconds the replay lasts (arrivals only)."""
        return self.spec.seconds / self.spec.speed

    def rows(self) -> list[dict[str, Any]]:
        """The trace's requests in the window, in arrival order."""
        if self._rows is None:
            lo, hi = self.spec.start * 1e3, (self.spec.start + self.spec.seconds) * 1e3
            rows = []
            with self.spec.path.open() as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        if lo <= float(row["timestamp"]) < hi:
                            rows.append(row)
            rows.sort(key=lambda r: float(r["timestamp"]))
            self._rows = rows
            n = max(len(rows), 1)
            self.prompt_tokens = round(
                sum(min(r["input_length"] / self.spec.scale, TRACE_MAX_PROMPT) for r in rows) / n
            )
        return self._rows

    def block(self, block: int, words: int) -> str:
        key = (block, words)
        if key not in self._blocks:
            rng = random.Random(f"rq:trace:block:{block}")
            rest = _words(rng, words - 1) if words > 1 else ""
            self._blocks[key] = f"{_block_word(block)} {rest}".rstrip() + " "
        return self._blocks[key]

    def requests(self, tokens_per_word: float) -> list[Request]:
        """The replay's requests; a word of the text is `tokens_per_word` tokens on the
        engine (1 on llmgw-sim, ~4 on the tiny model's byte-level vocabulary)."""
        out = []
        block_words = max(1, round(self.block_tokens / tokens_per_word))
        cap = TRACE_MAX_PROMPT / self.block_tokens
        t0 = self.spec.start * 1e3
        self.truncated = 0
        for row in self.rows():
            ids = [int(h) for h in row["hash_ids"]]
            if not ids:
                continue
            scaled = float(row["input_length"]) / self.spec.scale
            last = scaled - self.block_tokens * (len(ids) - 1)  # the last block's share
            if len(ids) > cap:
                self.truncated += 1
                ids, last = ids[: max(1, int(cap))], self.block_tokens
            parts = [self.block(b, block_words) for b in ids[:-1]]
            last_words = max(1, round(min(last, self.block_tokens) / tokens_per_word))
            parts.append(" ".join(self.block(ids[-1], block_words).split()[:last_words]))
            text = "".join(parts)
            words = len(text.split())
            output = min(OUTPUT_TOKENS, max(1, round(row["output_length"] / self.spec.scale)))
            out.append(
                Request(
                    ({"role": "user", "content": text},),
                    ids[0],
                    ids[0],
                    words,
                    max_tokens=output,
                    at=(float(row["timestamp"]) - t0) / 1e3 / self.spec.speed,
                )
            )
        return out

    def conversation(self, seed: str, index: int) -> list[Request]:
        raise NotImplementedError("a trace is replayed, not looped")


def _zipf(n: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, n + 1)]


_PROMPT = f"{SYSTEM_TOKENS}-token system prompt + {UNIQUE_TOKENS} unique tokens"
_HOT = _zipf(TENANTS, ZIPF_EXPONENT)[0] / sum(_zipf(TENANTS, ZIPF_EXPONENT))


def workloads(trace: TraceSpec | None = None) -> dict[str, Workload]:
    spec = trace or TraceSpec(
        default_trace(), TRACE_START, TRACE_SECONDS, TRACE_SCALE, TRACE_SPEED["sim"]
    )
    return {
        w.name: w
        for w in (
            Tenants("uniform", f"{TENANTS} tenants (uniform) x {_PROMPT}", [1.0] * TENANTS),
            Tenants(
                "zipf",
                f"{TENANTS} tenants, Zipf {ZIPF_EXPONENT:g} (hottest {_HOT:.0%}) x {_PROMPT}",
                _zipf(TENANTS, ZIPF_EXPONENT),
            ),
            Sessions(),
            Long(),
            Tenants(
                "hot",
                f"{TENANTS} tenants, one with {HOT_SHARE:.0%} of the requests x {_PROMPT}",
                [HOT_SHARE * (TENANTS - 1) / (1 - HOT_SHARE)] + [1.0] * (TENANTS - 1),
            ),
            Tenants(
                "mixed",
                f"{TENANTS} tenants (uniform) x {_PROMPT}, half of them x-llmgw-band: bronze",
                [1.0] * TENANTS,
                bronze=0.5,
            ),
            Trace(spec),
        )
    }


WORKLOADS = tuple(workloads())


# -- client-side targets ------------------------------------------------------------------------


def _send_to(request: httpx.Request, url: httpx.URL) -> None:
    request.url = request.url.copy_with(scheme=url.scheme, host=url.host, port=url.port)
    request.headers["host"] = f"{url.host}:{url.port}"


class ShuffledRoundRobin(c.RoundRobinTransport):
    """Round robin in cycles of len(bases): each cycle visits every replica once, in a
    freshly shuffled (seeded) order, so that no cyclic order in the workload lines up
    with the rotation by accident."""

    def __init__(self, bases: Sequence[str], inner: httpx.AsyncBaseTransport, seed: int) -> None:
        super().__init__(bases, inner)
        rng = random.Random(seed)
        n = len(self.urls)

        def order() -> Any:
            while True:
                cycle = list(range(n))
                rng.shuffle(cycle)
                yield from cycle

        self._next = order()


class PinnedOracle(httpx.AsyncBaseTransport):
    """The reference: a request's pin (tenant or session, in PIN_HEADER, removed here)
    picks replica pin mod n; without a pin, strict rotation."""

    def __init__(self, bases: Sequence[str], inner: httpx.AsyncBaseTransport) -> None:
        self.urls = [httpx.URL(b) for b in bases]
        self.inner = inner
        self._rotation = itertools.count()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pin = request.headers.get(PIN_HEADER)
        if pin is not None:
            del request.headers[PIN_HEADER]
            i = int(pin) % len(self.urls)
        else:
            i = next(self._rotation) % len(self.urls)
        _send_to(request, self.urls[i])
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define
class Contender:
    name: str
    target: bench.Target
    client: httpx.AsyncClient
    router_pid: int | None = None  # None: client-side (round robin, oracle)
    router: c.RouterProc | None = None  # llmgw's, for its idle view and counters
    flags: str = ""


# -- the replicas' own counters -----------------------------------------------------------------


@attrs.frozen
class SimState:
    hits: float
    queries: float
    requests: float
    running: float
    waiting: float


def parse_state(text: str, fmt: str) -> SimState:
    """A replica's /metrics page read in its personality's metric names."""
    from prometheus_client.parser import text_string_to_metric_families

    v: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:request_success_total" and s.labels.get("finished_reason") == (
                "abort"
            ):
                continue
            v[s.name] = v.get(s.name, 0.0) + s.value
    if fmt == "vllm":
        return SimState(
            v.get("vllm:prefix_cache_hits_total", 0.0),
            v.get("vllm:prefix_cache_queries_total", 0.0),
            v.get("vllm:request_success_total", 0.0),
            v.get("vllm:num_requests_running", 0.0),
            v.get("vllm:num_requests_waiting", 0.0),
        )
    if fmt == "sglang":
        return SimState(
            v.get("sglang:cached_tokens_total", 0.0),
            v.get("sglang:prompt_tokens_total", 0.0),
            v.get("sglang:num_requests_total", 0.0),
            v.get("sglang:num_running_reqs", 0.0),
            v.get("sglang:num_queue_reqs", 0.0),
        )
    cached = v.get("llamacpp:prompt_tokens_cached_total", 0.0)
    return SimState(
        cached,
        cached + v.get("llamacpp:prompt_tokens_total", 0.0),
        # No request counter on llama-server's page: every request generates 32 tokens.
        v.get("llamacpp:tokens_predicted_total", 0.0) / OUTPUT_TOKENS,
        v.get("llamacpp:requests_processing", 0.0),
        v.get("llamacpp:requests_deferred", 0.0),
    )


def sim_states(sims: Sequence[str], fmt: str) -> list[SimState]:
    return [
        parse_state(httpx.get(f"{b}/metrics", timeout=5, trust_env=False).text, fmt) for b in sims
    ]


async def sim_states_async(
    client: httpx.AsyncClient, sims: Sequence[str], fmt: str
) -> list[SimState]:
    """As sim_states, without blocking the load generator (taken while a turn runs)."""
    return [parse_state((await client.get(f"{b}/metrics")).text, fmt) for b in sims]


REQUESTS_SOURCE = {
    "vllm": "vllm:request_success_total",
    "sglang": "sglang:num_requests_total",
    "llamacpp": f"llamacpp:tokens_predicted_total / {OUTPUT_TOKENS}",
}
CACHE_SOURCE = {
    "vllm": "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
    "sglang": "sglang:cached_tokens_total / sglang:prompt_tokens_total",
    "llamacpp": "llamacpp:prompt_tokens_cached_total / (that + llamacpp:prompt_tokens_total)",
}


def wait_sims_idle(sims: Sequence[str], fmt: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.running == 0 and s.waiting == 0 for s in sim_states(sims, fmt)):
            return
        time.sleep(0.2)
    c.log(f"replicas still busy after {timeout:g}s; going on anyway")


def wait_seen_idle(router: c.RouterProc, timeout: float = 10.0) -> None:
    """Until llmgw's own scrapes show every replica idle: its first picks of a turn must
    not rest on the previous turn's load (another target's leftovers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(e["running"] == 0 and e["waiting"] == 0 for e in router.endpoints()):
            return
        time.sleep(0.1)
    c.log(f"llmgw still sees busy replicas after {timeout:g}s; starting the turn anyway")


def reset_caches(sims: Sequence[str], slots: int | None = None) -> None:
    """Empty every replica's prefix cache: llmgw-sim's POST /reset_prefix_cache (vLLM's
    and SGLang's), or with `slots` (llama-server, which has no such call) POST
    /slots/{id}?action=erase for each slot, which drops the slot's cached prompt."""
    for base in sims:
        if slots is None:
            r = httpx.post(f"{base}/reset_prefix_cache", timeout=5, trust_env=False)
            r.raise_for_status()
            continue
        for slot in range(slots):
            r = httpx.post(
                f"{base}/slots/{slot}", params={"action": "erase"}, timeout=5, trust_env=False
            )
            r.raise_for_status()


def parse_llmgw(text: str) -> dict[str, float]:
    """llmgw's decisions by tier and its admission waits and refusals."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "llmgw_routing_decisions_total":
                key = f"tier:{s.labels.get('tier')}"
            elif s.name in (
                "llmgw_admission_wait_seconds_sum",
                "llmgw_admission_wait_seconds_count",
                "llmgw_admission_rejected_total",
            ):
                key = s.name
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def llmgw_counters(router: c.RouterProc) -> dict[str, float]:
    return parse_llmgw(httpx.get(f"{router.admin}/metrics", timeout=5, trust_env=False).text)


# -- load ----------------------------------------------------------------------------------------


def base_config(concurrency: int) -> bench.LoadConfig:
    return bench.LoadConfig(
        concurrency=concurrency,
        requests=1,  # the loops below bound themselves
        stream=True,
        request_timeout=REQUEST_TIMEOUT,
    )


async def send(
    who: Contender, config: bench.LoadConfig, req: Request, index: int, t0: float
) -> bench.Sample:
    prompt = bench.Prompt(
        index=index,
        group=req.group,
        session=req.session,
        text="",
        words=req.words,
        prefix_words=0,
        max_tokens=req.max_tokens,
    )
    cfg = attrs.evolve(config, band=req.band, extra_body={"messages": list(req.messages)})
    target = who.target
    if who.name == ORACLE and req.pin is not None:
        target = attrs.evolve(target, headers=((PIN_HEADER, str(req.pin)),))
    return await bench.runner.send_one(who.client, target, cfg, prompt, t0)


class Window:
    """A turn's measured window: when it opens (`start`, seconds after the turn's start)
    and when it closes (`end`).

    The caches were reset before the turn, and its start (every request a miss at once)
    is not what the window measures: it opens `least` s after the start, in a closed
    loop no earlier than when every worker has had its first answer (nor later than
    `most` s). It lasts `seconds`, and in a closed loop at least until `min_answers`
    answers came in it (at most 3x `seconds`): on a slow personality a window shorter
    than a request would hold no answers at all."""

    def __init__(
        self, t0: float, least: float, most: float, seconds: float, min_answers: int
    ) -> None:
        self.t0, self.least, self.most, self.seconds = t0, least, most, seconds
        self.min_answers = min_answers
        self.start: float | None = None
        self.enough_at: float | None = None  # when min_answers had come in
        self.answers = 0
        self.opened = trio.Event()
        self.first_wave = trio.Event()
        if not min_answers:
            self.first_wave.set()

    @property
    def end(self) -> float:
        """Seconds after the turn's start the window closes (inf before it opens)."""
        if self.start is None:
            return math.inf
        cap = self.start + 3 * self.seconds
        if self.enough_at is None:
            return cap
        return min(max(self.start + self.seconds, self.enough_at), cap)

    def is_open(self) -> bool:
        """True until the window has closed (during the warm-up too)."""
        return trio.current_time() - self.t0 < self.end

    def answered(self, sample: bench.Sample) -> None:
        if self.start is None or self.enough_at is not None or not sample.ok:
            return
        self.answers += 1
        if self.answers >= self.min_answers:
            self.enough_at = trio.current_time() - self.t0

    async def watch(self) -> None:
        with trio.move_on_at(self.t0 + self.most):
            await self.first_wave.wait()
        await trio.sleep_until(self.t0 + self.least)
        # An open loop's window is its schedule's (the same arrivals for every target,
        # however late this task runs); a closed loop's opens when it does.
        self.start = trio.current_time() - self.t0 if self.min_answers else self.least
        if not self.min_answers:
            self.enough_at = self.start
        self.opened.set()


async def closed_loop(
    who: Contender,
    wl: Workload,
    seed: str,
    window: Window,
    max_requests: int,
    concurrency: int,
) -> list[bench.Sample]:
    """`concurrency` workers until the window closes (or `max_requests` were sent); each
    works through conversations one request at a time. Requests in flight at the end
    finish."""
    config = base_config(concurrency)
    samples: list[bench.Sample] = []
    conversations = itertools.count()
    answered: set[int] = set()
    sent = 0

    def more() -> bool:
        return window.is_open() and sent < max_requests

    async def worker(w: int) -> None:
        nonlocal sent
        while more():
            ci = next(conversations)
            for turn, req in enumerate(wl.conversation(seed, ci)):
                if not more():
                    break
                sent += 1
                sample = await send(who, config, req, ci * 100 + turn, window.t0)
                samples.append(sample)
                window.answered(sample)
                answered.add(w)
                if len(answered) == concurrency:
                    window.first_wave.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(window.watch)
        for w in range(concurrency):
            nursery.start_soon(worker, w)
    return samples


@attrs.frozen
class OpenRun:
    samples: list[bench.Sample]
    arrivals: list[float]  # offsets from the turn's start, shed ones included
    shed: int
    in_flight_at_end: int  # requests in flight when the arrivals stopped


async def open_loop(
    who: Contender,
    wl: Workload,
    seed: str,
    window: Window,
    max_requests: int,
    concurrency: int,
    rate: float,
) -> OpenRun:
    """Poisson arrivals of requests at `rate` per second until the window closes. An
    arrival sends the next turn of the session that has waited longest for it (its
    previous answer in), else the first request of a new conversation: requests arrive
    at `rate` and every conversation keeps its order. An arrival finding concurrency x
    IN_FLIGHT_FACTOR requests in flight is shed. Requests in flight at the end finish."""
    config = base_config(concurrency)
    cap = concurrency * IN_FLIGHT_FACTOR
    samples: list[bench.Sample] = []
    arrivals: list[float] = []
    rng = random.Random(f"rq:{seed}:arrivals")
    t0 = window.t0
    in_flight = shed = 0
    conversations: dict[int, list[Request]] = {}
    ready: collections.deque[tuple[int, int]] = collections.deque()
    new = itertools.count()

    async def one(ci: int, turn: int) -> None:
        nonlocal in_flight
        in_flight += 1
        try:
            sample = await send(who, config, conversations[ci][turn], ci * 100 + turn, t0)
        finally:
            in_flight -= 1
        samples.append(sample)
        if turn + 1 < len(conversations[ci]):
            ready.append((ci, turn + 1))
        else:
            del conversations[ci]

    at = t0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(window.watch)
        for _ in range(max_requests):
            at += rng.expovariate(rate)
            if at - t0 >= window.end:
                break  # by the schedule, so every target gets the same arrivals
            await trio.sleep_until(at)
            arrivals.append(at - t0)
            if in_flight >= cap:
                shed += 1
                continue
            if ready:
                ci, turn = ready.popleft()
            else:
                ci, turn = next(new), 0
                conversations[ci] = wl.conversation(seed, ci)
            nursery.start_soon(one, ci, turn)
        at_end = in_flight
    return OpenRun(samples, arrivals, shed, at_end)


async def replay_loop(
    who: Contender,
    requests: Sequence[Request],
    window: Window,
    max_requests: int,
    concurrency: int,
) -> OpenRun:
    """Each request sent at its own arrival time (open loop), the first `max_requests`
    at most; one finding concurrency x IN_FLIGHT_FACTOR requests in flight is shed.
    Requests in flight at the end finish."""
    config = base_config(concurrency)
    cap = concurrency * IN_FLIGHT_FACTOR
    samples: list[bench.Sample] = []
    arrivals: list[float] = []
    t0 = window.t0
    in_flight = shed = 0

    async def one(i: int, req: Request) -> None:
        nonlocal in_flight
        in_flight += 1
        try:
            samples.append(await send(who, config, req, i, t0))
        finally:
            in_flight -= 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(window.watch)
        for i, req in enumerate(requests[:max_requests]):
            await trio.sleep_until(t0 + req.at)
            arrivals.append(req.at)
            if in_flight >= cap:
                shed += 1
                continue
            nursery.start_soon(one, i, req)
        at_end = in_flight
    return OpenRun(samples, arrivals, shed, at_end)


async def warm_up(who: Contender, n: int) -> None:
    """A few short requests (unmeasured): connections, the router's first paths."""
    config = base_config(8)
    rng = random.Random(f"rq:warm:{who.name}")
    t0 = trio.current_time()

    async def one(i: int) -> None:
        messages = ({"role": "user", "content": _words(rng, 64)},)
        await send(who, config, Request(messages, 0, None, 64), 90_000_000 + i, t0)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)


# -- one personality, one cell ---------------------------------------------------------------


@attrs.define
class Bed:
    """One personality's replicas and the contenders in front of them."""

    personality: str
    fmt: str
    sims: list[str]
    contenders: list[Contender]
    scraper: httpx.AsyncClient
    tokens_per_word: float = 1.0  # of the workloads' words, on this engine
    slots: int | None = None  # llama-server: its slots (erased as the cache reset)


@attrs.define
class Turn:
    """One target's closed or open turn; everything but `all_samples` covers the
    measured window only (from `warm` s after the start to `warm + window`)."""

    target: str
    phase: str  # "closed" | "open"
    round: int
    all_samples: list[bench.Sample]
    samples: list[bench.Sample]  # started in the measured window
    warm: float  # when the measured window opened, s after the turn's start
    window: float
    completed: int  # closed loop: ok answers inside the window; open: the window's arrivals'
    span: float  # what `completed` is counted over: the window, or to the last answer
    answered: int  # answers from the window's start to the turn's end
    rate: float | None = None  # open loop: the Poisson rate
    arrived: int = 0  # open loop: arrivals in the measured window (shed ones included)
    shed: int = 0  # open loop, whole turn
    in_flight_at_end: int | None = None  # open loop: when the arrivals stopped
    hits: float = 0.0
    queries: float = 0.0
    per_replica: list[float] = attrs.field(factory=list)
    cpu: float | None = None
    busy: float | None = None
    llmgw: dict[str, float] = attrs.field(factory=dict)


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    n = len(items)
    return [items[(k + j) % n] for j in range(n)]


async def run_turn(
    bed: Bed,
    who: Contender,
    wl: Workload,
    seed: str,
    phase: str,
    rnd: int,
    settings: Settings,
    concurrency: int,
    rate: float | None,
) -> Turn:
    wait_sims_idle(bed.sims, bed.fmt)
    if who.router is not None:
        wait_seen_idle(who.router)
    reset_caches(bed.sims, bed.slots)
    if phase == "closed":
        least, seconds = settings.closed_warm, settings.closed_seconds
    elif isinstance(wl, Trace):
        # The caches were reset: the replay's start, while they fill, is not measured.
        least = min(max(settings.open_warm, TRACE_WARM * wl.duration), wl.duration / 2)
        seconds = max(wl.duration - least, 0.1)
    else:
        least, seconds = settings.open_warm, settings.open_seconds
    pid = who.router_pid
    # What the counters read when the measured window opens (taken while the turn runs).
    mark: dict[str, Any] = {
        "sims": sim_states(bed.sims, bed.fmt),
        "cpu": c.cpu_seconds_tree(pid) if pid else None,
        "llmgw": llmgw_counters(who.router) if who.router is not None else {},
        "machine": c.machine_cpu(),
    }
    min_answers = concurrency if phase == "closed" else 0
    window = Window(trio.current_time(), least, WARM_MOST, seconds, min_answers)

    async def at_window() -> None:
        await window.opened.wait()
        mark["cpu"] = c.cpu_seconds_tree(pid) if pid else None
        mark["machine"] = c.machine_cpu()
        mark["sims"] = await sim_states_async(bed.scraper, bed.sims, bed.fmt)
        if who.router is not None:
            text = (await bed.scraper.get(f"{who.router.admin}/metrics")).text
            mark["llmgw"] = parse_llmgw(text)

    run: OpenRun | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(at_window)
        if phase == "closed":
            samples = await closed_loop(
                who, wl, seed, window, settings.closed_requests, concurrency
            )
        elif isinstance(wl, Trace):
            requests = wl.requests(bed.tokens_per_word)
            run = await replay_loop(who, requests, window, settings.open_requests, concurrency)
            samples = run.samples
        else:
            assert rate is not None
            run = await open_loop(who, wl, seed, window, settings.open_requests, concurrency, rate)
            samples = run.samples
        if not window.opened.is_set():
            nursery.cancel_scope.cancel()  # never opened (no request sent): as it was
    warm = window.start if window.start is not None else 0.0
    seconds = window.end - warm if window.start is not None else 0.0
    busy = c.busy_fraction(mark["machine"], c.machine_cpu())
    cpu = c.cpu_seconds_tree(pid) - mark["cpu"] if pid and mark["cpu"] is not None else None
    gw: dict[str, float] = {}
    if who.router is not None:
        gw = {k: v - mark["llmgw"].get(k, 0.0) for k, v in llmgw_counters(who.router).items()}
    # Answers are in; a replica may count a request an instant after its last event.
    wait_sims_idle(bed.sims, bed.fmt, timeout=5.0)
    after = sim_states(bed.sims, bed.fmt)
    before = mark["sims"]
    measured = [s for s in samples if s.start >= warm]
    if run is None:
        # Closed loop: answers inside the window over its length.
        completed = sum(1 for s in samples if s.ok and warm <= s.start + s.e2e <= warm + seconds)
        span = seconds
    else:
        # Open loop: the window's arrivals answered, over the time from its start to the
        # last of those answers (an engine that shares its prefill among all it holds
        # answers late and in a bunch; a count inside the window would miss them).
        done = [s for s in measured if s.ok]
        completed = len(done)
        span = max((s.start + s.e2e for s in done), default=warm + seconds) - warm
    turn = Turn(
        target=who.name,
        phase=phase,
        round=rnd,
        all_samples=samples,
        samples=measured,
        warm=warm,
        window=seconds,
        completed=completed,
        span=span,
        answered=sum(1 for s in samples if s.ok and s.start + s.e2e >= warm),
        rate=rate,
        arrived=sum(1 for a in run.arrivals if a >= warm) if run else 0,
        shed=run.shed if run else 0,
        in_flight_at_end=run.in_flight_at_end if run else None,
        hits=sum(a.hits - b.hits for a, b in zip(after, before, strict=True)),
        queries=sum(a.queries - b.queries for a, b in zip(after, before, strict=True)),
        per_replica=[a.requests - b.requests for a, b in zip(after, before, strict=True)],
        cpu=cpu,
        busy=busy,
        llmgw=gw,
    )
    failed = sum(1 for s in samples if not s.ok)
    ttft = bench.dist(s.ttft for s in measured if s.ok and s.ttft is not None)
    c.log(
        f"  {phase:6} {who.name}: {len(samples)} sent, {failed} failed; measured "
        f"{turn.completed / span:.1f} req/s done, TTFT p90 "
        f"{c.ms(ttft.p90 if ttft else None, 0)} ms"
        + (
            f"; {turn.arrived / seconds:.1f} req/s arrived "
            + (f"(Poisson {rate:.1f}), " if rate is not None else "(the trace's), ")
            + f"{turn.in_flight_at_end} in flight when arrivals stopped"
            if run
            else ""
        )
        + (f", {turn.shed} shed" if turn.shed else "")
    )
    return turn


async def run_cell(
    bed: Bed, wl: Workload, cell_index: int, settings: Settings, concurrency: int
) -> dict[str, Any]:
    turns: list[Turn] = []
    rates: list[float | None] = []
    notes: list[str] = []
    names = [w.name for w in bed.contenders]
    for rnd in range(settings.rounds):
        order = rotate(bed.contenders, cell_index + rnd)
        c.log(
            f"[{bed.personality} x {wl.name}] round {rnd + 1}: {', '.join(w.name for w in order)}"
        )
        seed = f"{SEED}:{bed.personality}:{wl.name}:{rnd}"
        if wl.replay:
            for who in order:
                turns.append(
                    await run_turn(bed, who, wl, seed, "open", rnd, settings, concurrency, None)
                )
            continue
        closed = {}
        for who in order:
            t = await run_turn(
                bed, who, wl, f"{seed}:closed", "closed", rnd, settings, concurrency, None
            )
            closed[who.name] = t
            turns.append(t)
        rr = closed[RR]
        rate = OPEN_FACTOR * rr.completed / rr.window if rr.completed else None
        rates.append(rate)
        if rate is None:
            notes.append(f"round {rnd + 1}: no open loop (round robin completed nothing)")
            continue
        for who in order:
            turns.append(
                await run_turn(
                    bed, who, wl, f"{seed}:open", "open", rnd, settings, concurrency, rate
                )
            )
    return {
        "personality": bed.personality,
        "workload": wl.name,
        "title": wl.title,
        "replay": wl.replay,
        "trace": (
            {
                "path": str(wl.spec.path),
                "start": wl.spec.start,
                "seconds": wl.spec.seconds,
                "scale": wl.spec.scale,
                "speed": wl.spec.speed,
                "requests": len(wl.rows()),
                "mean_prompt_tokens": wl.prompt_tokens,
                "truncated": wl.truncated,
                "tokens_per_word": bed.tokens_per_word,
            }
            if isinstance(wl, Trace)
            else None
        ),
        "shared": wl.shared,
        "rates": rates,
        "notes": notes,
        "targets": {n: aggregate([t for t in turns if t.target == n]) for n in names},
    }


def aggregate(turns: Sequence[Turn]) -> dict[str, Any]:
    closed = [t for t in turns if t.phase == "closed"]
    opened = [t for t in turns if t.phase == "open"]

    def summary(ts: Sequence[Turn]) -> bench.Summary | None:
        if not ts:
            return None
        return bench.summarize([s for t in ts for s in t.samples], sum(t.window for t in ts))

    def throughput(ts: Sequence[Turn]) -> float | None:
        span = sum(t.span for t in ts)
        return sum(t.completed for t in ts) / span if ts and span > 0 else None

    per_replica = [sum(xs) for xs in zip(*(t.per_replica for t in turns), strict=True)]
    mean = sum(per_replica) / len(per_replica) if per_replica else 0.0
    hits = sum(t.hits for t in turns)
    queries = sum(t.queries for t in turns)
    cpus = [t.cpu for t in turns if t.cpu is not None]
    answered = sum(t.answered for t in turns)
    errors: dict[str, int] = {}
    for t in turns:
        for s in t.all_samples:
            if s.error is not None:
                errors[s.error] = errors.get(s.error, 0) + 1
    llmgw: dict[str, float] = {}
    for t in turns:
        for k, v in t.llmgw.items():
            llmgw[k] = llmgw.get(k, 0.0) + v
    busy = [t.busy for t in turns if t.busy is not None]
    open_window = sum(t.window for t in opened)
    return {
        "closed": summary(closed),
        "open": summary(opened),
        "closed_throughput": throughput(closed),
        "open_throughput": throughput(opened),
        "open_rate": [t.rate for t in opened],
        "arrived_rate": sum(t.arrived for t in opened) / open_window if open_window else None,
        "in_flight_at_end": [t.in_flight_at_end for t in opened],
        "shed": sum(t.shed for t in opened),
        "sent": sum(len(t.all_samples) for t in turns),
        "failed": sum(1 for t in turns for s in t.all_samples if not s.ok),
        "measured": sum(len(t.samples) for t in turns),
        "errors": errors,
        "hit_rate": hits / queries if queries else None,
        "hits": hits,
        "queries": queries,
        "per_replica": per_replica,
        "busiest_over_mean": max(per_replica) / mean if mean > 0 else None,
        "router_cpu_seconds": sum(cpus) if cpus else None,
        "cpu_per_request": sum(cpus) / answered if cpus and answered else None,
        "cores_busy": sum(busy) / len(busy) if busy else None,
        "llmgw": llmgw,
    }


def start_llama_servers(fleet: c.Fleet, binary: str) -> tuple[list[Proc], list[str], list[str]]:
    """REPLICAS llama-server processes of the tiny GGUF model on loopback ports of their
    own; returns them, their base URLs and the first one's argv (port and paths elided)."""
    from llmgw.testing.gguf import write_tiny_gguf

    weights = write_tiny_gguf(fleet.logdir / "tiny.gguf")
    saves = fleet.logdir / "slots"
    saves.mkdir(exist_ok=True)
    procs, bases = [], []
    shown: list[str] = []
    for i in range(REPLICAS):
        port = fleet.reserve_port()
        base = f"http://{LOOPBACK}:{port}"
        args = [
            *("-m", str(weights), "--host", LOOPBACK, "--port", str(port), "-a", MODEL),
            *("--metrics", "--no-webui", "-np", str(LLAMA_SLOTS)),
            *("-c", str(LLAMA_SLOTS * LLAMA_SLOT_CONTEXT), "-t", str(LLAMA_THREADS)),
            *("--slot-save-path", str(saves)),
            *LLAMA_FLAGS,
        ]
        procs.append(fleet.start(binary, *args, name=f"llama-server-{i}", health=f"{base}/health"))
        bases.append(base)
        if not shown:
            shown = ["llama-server", *args]
            shown[shown.index(str(port))] = "PORT"
            shown[shown.index(str(weights))] = "tiny.gguf"
            shown[shown.index(str(saves))] = "DIR"
    return procs, bases, shown


def measure_tokens_per_word(base: str) -> float:
    """Tokens a workload word (VOCABULARY, space-separated) is on the replica's model,
    by its own POST /tokenize."""
    text = _words(random.Random("rq:tokens-per-word"), 500)
    r = httpx.post(f"{base}/tokenize", json={"content": text}, timeout=10, trust_env=False)
    r.raise_for_status()
    return len(r.json()["tokens"]) / 500


def llama_version(binary: str) -> str:
    import subprocess

    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    text = (out.stdout + out.stderr).strip().splitlines()
    return next((line for line in text if line.startswith("version")), "version unknown")


async def run_personality(
    fleet: c.Fleet,
    personality: str,
    wls: Sequence[Workload],
    first_cell: int,
    settings: Settings,
    concurrency: int,
    peers: dict[str, Path | None],
    peer_reasons: dict[str, str],
    llama_server: str | None = None,
    compare: tuple[str, Path] | None = None,
    kv_events: bool = False,
) -> dict[str, Any]:
    procs: list[Proc] = []
    sims: list[str] = []
    events: list[str] = []  # each replica's KV-event address (--kv-events)
    c.log(f"[{personality}] starting {REPLICAS} replicas and the routers")
    llama = personality == LLAMA_ENGINE
    if llama:
        assert llama_server is not None
        fmt = "llamacpp"
        procs, sims, argv = start_llama_servers(fleet, llama_server)
        tokens_per_word = measure_tokens_per_word(sims[0])
        about = (
            f"{REPLICAS} real llama-server replicas ({llama_version(llama_server)}) of "
            f"llmgw.testing.gguf's tiny model; argv {' '.join(argv)}; a workload word is "
            f"{tokens_per_word:.2f} tokens (byte-level vocabulary)"
        )
        engine: dict[str, Any] = {"argv": argv, "slots": LLAMA_SLOTS}
    else:
        fmt = zoo.get(personality).metrics_format
        publish = ("--kv-events-endpoint", "tcp://127.0.0.1:0") if kv_events else ()
        for i in range(REPLICAS):
            proc, base = fleet.sim(
                f"{personality}-{i}",
                "--personality",
                personality,
                "--seed",
                str(i),
                *publish,
                model=MODEL,
            )
            procs.append(proc)
            sims.append(base)
            if kv_events:
                events.append(proc.ready["kv_events"][0])
        tokens_per_word = 1.0  # llmgw-sim: 4 characters a token, a word 3 letters + space
        about = zoo.get(personality).summary
        engine = dict(zoo.get(personality).engine)
    # llmgw's own targets: (name, router, how it was configured), each router in front
    # of the same replicas.
    ours: list[tuple[str, c.RouterProc, str]] = []

    def router(target: str, flags: str, models: Sequence[str], **kwargs: Any) -> None:
        endpoints = [
            (f"{personality}-{i}", base, m)
            for i, (base, m) in enumerate(zip(sims, models, strict=True))
        ]
        gw = fleet.router(endpoints, **kwargs)
        procs.insert(0, gw.proc)
        ours.append((target, gw, flags))

    plain = [MODEL] * len(sims)
    router(
        LLMGW,
        'default configuration, no store (store.url = "")',
        plain,
        name=f"llmgw-{personality}",
    )
    router(
        LLMGW_CA,
        'router.default_profile = "cache_aware", no store',
        plain,
        config=CACHE_AWARE_CONFIG,
        name=f"llmgw-ca-{personality}",
    )
    if events:
        # The default configuration, told where each engine publishes its events (the
        # --endpoint flag's fourth field), as an operator running vLLM with
        # --kv-events-config would.
        router(
            LLMGW_KV,
            "default configuration, no store; each endpoint's kv_events address",
            [f"{MODEL}={address}" for address in events],
            name=f"llmgw-kv-{personality}",
        )
    if compare is not None:
        router(
            compare[0],
            f"default configuration, no store; llmgw imported from {compare[1]}",
            plain,
            name=f"llmgw-other-{personality}",
            src=compare[1],
        )
    for _, gw, _ in ours:
        gw.wait_scraped()
    started: dict[str, tuple[int, str]] = {}  # name -> (pid, flags)
    peer_urls: dict[str, str] = {}
    skipped = dict(peer_reasons)
    for name, start, kind in (
        (VLLM, c.start_vllm_router, "vllm-router"),
        (SGLANG, c.start_sglang_router, "sglang-router"),
    ):
        binary = peers.get(name)
        if binary is None:
            continue
        try:
            pr = start(fleet, binary, sims, "cache_aware", name=f"{kind}-{personality}")
        except (RuntimeError, TimeoutError, OSError) as e:
            skipped[name] = f"did not start: {str(e).splitlines()[0]}"
            c.log(f"[{personality}] {name} left out: {skipped[name]}")
            continue
        procs.insert(0, pr.proc)
        started[name] = (pr.pid, pr.flags)
        peer_urls[name] = pr.base
    async with contextlib.AsyncExitStack() as stack:
        cfg = base_config(concurrency)
        pool = concurrency * IN_FLIGHT_FACTOR

        async def client(transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
            return await stack.enter_async_context(bench.runner.open_client(cfg, transport))

        contenders = [
            Contender(
                RR,
                bench.Target(sims[0], MODEL, name=RR),
                await client(ShuffledRoundRobin(sims, c.pooled_transport(pool), seed=SEED)),
            ),
            Contender(
                ORACLE,
                bench.Target(sims[0], MODEL, name=ORACLE),
                await client(PinnedOracle(sims, c.pooled_transport(pool))),
            ),
        ]
        for name, gw, flags in ours:
            contenders.append(
                Contender(
                    name,
                    bench.Target(gw.base, MODEL, name=name),
                    await client(c.pooled_transport(pool)),
                    router_pid=gw.pid,
                    router=gw,
                    flags=flags,
                )
            )
        for name in PEERS:
            if name in started:
                pid, flags = started[name]
                contenders.append(
                    Contender(
                        name,
                        bench.Target(peer_urls[name], MODEL, name=name),
                        await client(c.pooled_transport(pool)),
                        router_pid=pid,
                        flags=flags,
                    )
                )
        for who in contenders:
            await warm_up(who, settings.warm_requests)
        scraper = await stack.enter_async_context(httpx.AsyncClient(timeout=5, trust_env=False))
        for wl in wls:
            wl.tokens_per_word = tokens_per_word
        bed = Bed(
            personality,
            fmt,
            sims,
            contenders,
            scraper,
            tokens_per_word=tokens_per_word,
            slots=LLAMA_SLOTS if llama else None,
        )
        cells = []
        for k, wl in enumerate(wls):
            cells.append(await run_cell(bed, wl, first_cell + k, settings, concurrency))
    children = {w.name: c.children_of(w.router_pid) for w in contenders if w.router_pid}
    fleet.stop(procs)
    return {
        "personality": personality,
        "summary": about,
        "engine": engine,
        "metrics_format": fmt,
        "requests_source": REQUESTS_SOURCE[fmt]
        + (" (the trace's outputs vary: generated tokens over the mean)" if llama else ""),
        "cache_source": CACHE_SOURCE[fmt],
        "skipped": skipped,
        "router_flags": {w.name: w.flags for w in contenders if w.flags},
        "router_children": {k: v for k, v in children.items() if v},
        "cells": cells,
    }


# -- verdicts and output -------------------------------------------------------------------------


def _p90(summary: bench.Summary | None) -> float | None:
    return summary.ttft.p90 if summary is not None and summary.ttft is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def verdicts(cell: dict[str, Any]) -> dict[str, Any]:
    t = cell["targets"]
    gw, rr = t.get(LLMGW), t.get(RR)
    peers = [n for n in PEERS if n in t]

    def best(phase: str) -> tuple[str | None, float | None]:
        found = [(p, _p90(t[p][phase])) for p in peers if _p90(t[p][phase]) is not None]
        return min(found, key=lambda x: x[1] or math.inf) if found else (None, None)

    best_closed, best_closed_p90 = best("closed")
    best_open, best_open_p90 = best("open")
    out: dict[str, Any] = {"best_peer": best_closed, "best_peer_open": best_open}
    if cell.get("replay"):
        out["best_peer"] = best_open  # a replay has no closed loop

    def check(value: float | None, limit: float, at_most: bool) -> dict[str, Any]:
        if value is None:
            return {"value": None, "met": None}
        return {"value": value, "met": value <= limit if at_most else value >= limit}

    out["ttft_vs_peer_closed"] = check(
        _ratio(_p90(gw["closed"]), best_closed_p90), TARGET_VS_PEER, True
    )
    out["ttft_vs_peer_open"] = check(_ratio(_p90(gw["open"]), best_open_p90), TARGET_VS_PEER, True)
    out["ttft_vs_rr_closed"] = check(
        _ratio(_p90(gw["closed"]), _p90(rr["closed"])), TARGET_VS_RR, True
    )
    out["ttft_vs_rr_open"] = check(_ratio(_p90(gw["open"]), _p90(rr["open"])), TARGET_VS_RR, True)
    ca = t.get(LLMGW_CA)
    phase = "open" if cell.get("replay") else "closed"
    out["ttft_vs_cache_aware"] = check(
        _ratio(_p90(gw[phase]), _p90(ca[phase])) if ca else None, 1.0, True
    )
    out["busiest"] = check(gw["busiest_over_mean"], TARGET_BUSIEST, True)

    def tput(name: str) -> float | None:
        return _ratio(t[name]["closed_throughput"], rr["closed_throughput"])

    if cell["shared"]:
        out["throughput"] = check(tput(LLMGW), TARGET_THROUGHPUT, False)
    else:
        out["throughput"] = {"value": tput(LLMGW), "met": None, "n/a": True}
    out["oracle_throughput"] = tput(ORACLE)
    out["failed"] = {n: x["failed"] for n, x in t.items()}
    return out


def _fmt_check(v: dict[str, Any]) -> str:
    if v.get("value") is None:
        return "-"
    if v.get("n/a"):
        return f"{v['value']:.2f}x n/a"
    return f"{v['value']:.2f}x {'met' if v['met'] else 'MISSED'}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def report_replay(p: dict[str, Any], cell: dict[str, Any]) -> None:
    tr = cell["trace"]
    rows = []
    for name, x in cell["targets"].items():
        op = x["open"]
        ttft = op.ttft if op else None
        rows.append(
            [
                name,
                f"{x['failed']}/{x['sent']}",
                c.ms(ttft.p50 if ttft else None, 0),
                c.ms(ttft.p90 if ttft else None, 0),
                c.ms(ttft.p99 if ttft else None, 0),
                c.ms(op.e2e.p50 if op and op.e2e else None, 0),
                (
                    f"{x['arrived_rate']:.1f} -> {x['open_throughput']:.1f}"
                    if x["arrived_rate"] is not None and x["open_throughput"] is not None
                    else "-"
                ),
                _pct(x["hit_rate"]),
                "-" if x["busiest_over_mean"] is None else f"{x['busiest_over_mean']:.2f}x",
                c.ms(x["cpu_per_request"], 2),
            ]
        )
    c.print_table(
        f"{p['personality']} x trace: {cell['title']}; {tr['requests']} requests, mean "
        f"prompt {tr['mean_prompt_tokens']} tokens after scaling ({tr['truncated']} cut to "
        f"{TRACE_MAX_PROMPT}), a word {tr['tokens_per_word']:.2f} tokens on this engine; "
        "streamed, open loop at the trace's arrival times; times in ms",
        [
            "target",
            "failed/sent",
            "TTFT p50",
            "TTFT p90",
            "TTFT p99",
            "e2e p50",
            "req/s arrived -> done",
            "prefix hit rate",
            "busiest / mean",
            "router CPU ms/req",
        ],
        rows,
    )


def report_cell(p: dict[str, Any], cell: dict[str, Any], concurrency: int) -> None:
    if cell.get("replay"):
        report_replay(p, cell)
    rates = ", ".join("-" if r is None else f"{r:.1f}" for r in cell["rates"])
    rows = []
    for name, x in cell["targets"].items():
        if cell.get("replay"):
            break
        cl, op = x["closed"], x["open"]
        rows.append(
            [
                name,
                f"{x['failed']}/{x['sent']}",
                c.ms(cl.ttft.p50 if cl and cl.ttft else None, 0),
                c.ms(_p90(cl), 0),
                c.ms(cl.ttft.p99 if cl and cl.ttft else None, 0),
                c.ms(cl.e2e.p50 if cl and cl.e2e else None, 0),
                "-" if x["closed_throughput"] is None else f"{x['closed_throughput']:.1f}",
                (
                    f"{x['arrived_rate']:.1f} -> {x['open_throughput']:.1f}"
                    if x["arrived_rate"] is not None and x["open_throughput"] is not None
                    else "-"
                ),
                c.ms(_p90(op), 0),
                _pct(x["hit_rate"]),
                "-" if x["busiest_over_mean"] is None else f"{x['busiest_over_mean']:.2f}x",
                c.ms(x["cpu_per_request"], 2),
            ]
        )
    if rows:
        c.print_table(
            f"{p['personality']} x {cell['workload']}: {cell['title']}; {OUTPUT_TOKENS} output "
            f"tokens, streamed; closed loop at concurrency {concurrency}, open loop Poisson at "
            f"{rates} req/s ({OPEN_FACTOR:g}x round robin's closed loop); times in ms",
            [
                "target",
                "failed/sent",
                "TTFT p50",
                "TTFT p90",
                "TTFT p99",
                "e2e p50",
                "closed req/s",
                "open req/s arrived -> done",
                "open TTFT p90",
                "prefix hit rate",
                "busiest / mean",
                "router CPU ms/req",
            ],
            rows,
        )
    gw = cell["targets"][LLMGW]["llmgw"]
    tiers = ", ".join(
        f"{k.split(':', 1)[1]} {v:.0f}" for k, v in sorted(gw.items()) if k.startswith("tier:")
    )
    waits = gw.get("llmgw_admission_wait_seconds_count", 0.0)
    wait = gw.get("llmgw_admission_wait_seconds_sum", 0.0) / waits if waits else None
    print(
        f"llmgw: decisions by tier {tiers or '-'}; admission queued {waits:.0f} "
        f"(mean wait {c.ms(wait, 0)} ms), refused {gw.get('llmgw_admission_rejected_total', 0):.0f}"
    )
    for name, x in cell["targets"].items():
        if x["errors"] or x["shed"]:
            print(f"{name}: errors {x['errors'] or '-'}, open-loop arrivals shed {x['shed']}")
    in_flight = ", ".join(
        f"{name} {'/'.join(str(n) for n in x['in_flight_at_end'])}"
        for name, x in cell["targets"].items()
        if x["in_flight_at_end"]
    )
    if in_flight:
        print(f"open loop, requests in flight when the arrivals stopped: {in_flight}")
    rr_open, rr_closed = _p90(cell["targets"][RR]["open"]), _p90(cell["targets"][RR]["closed"])
    if rr_open is not None and rr_closed is not None and rr_open < rr_closed:
        print(
            "round robin's open-loop TTFT p90 is below its closed-loop one: the open "
            "loop may not have saturated it (a closed loop at this concurrency can be "
            "latency-bound rather than at capacity)"
        )
    for note in cell["notes"]:
        print(note)
    print()


def report_summary(result: dict[str, Any]) -> None:
    rows = []
    for p in result["personalities"]:
        for cell in p["cells"]:
            v = cell["verdicts"]
            failed = v["failed"]
            rows.append(
                [
                    f"{p['personality']} x {cell['workload']}",
                    v["best_peer"] or "- (no peer)",
                    _fmt_check(v["ttft_vs_peer_closed"]),
                    _fmt_check(v["ttft_vs_peer_open"]),
                    _fmt_check(v["ttft_vs_rr_closed"]),
                    _fmt_check(v["ttft_vs_rr_open"]),
                    _fmt_check(v["ttft_vs_cache_aware"]),
                    _fmt_check(v["busiest"]),
                    _fmt_check(v["throughput"]),
                    "-" if v["oracle_throughput"] is None else f"{v['oracle_throughput']:.2f}x",
                    ", ".join(f"{n} {k}" for n, k in failed.items() if k) or "0",
                ]
            )
    c.print_table(
        "Targets, llmgw with its default configuration (ratios are llmgw's over the other's)",
        [
            "cell",
            "best peer (closed TTFT p90; a replay's)",
            f"TTFT p90 / best peer's, closed (<= {TARGET_VS_PEER:g}x)",
            f"same, open (<= {TARGET_VS_PEER:g}x)",
            f"TTFT p90 / round robin's, closed (<= {TARGET_VS_RR:g}x)",
            f"same, open (<= {TARGET_VS_RR:g}x)",
            "TTFT p90 / llmgw cache_aware's, closed; a replay's (<= 1x)",
            f"busiest replica / mean (<= {TARGET_BUSIEST:g}x)",
            f"closed req/s / round robin's (>= {TARGET_THROUGHPUT:g}x where shared)",
            "oracle's req/s / round robin's",
            "failed requests",
        ],
        rows,
    )
    met = missed = 0
    for p in result["personalities"]:
        for cell in p["cells"]:
            for v in cell["verdicts"].values():
                if isinstance(v, dict) and "met" in v and v["met"] is not None:
                    met += v["met"]
                    missed += not v["met"]
    print(f"{met} met, {missed} MISSED (cells x targets that could be evaluated)")


def report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"routing_quality  {result['date']}  llmgw {result['revision']}  {result['machine']}")
    print(
        f"{s['rounds']} round(s) per cell; per target a closed-loop turn (>= "
        f"{s['closed_warm']:g} s unmeasured, until every worker's first answer, then >= "
        f"{s['closed_seconds']:g} s and {result['concurrency']} answers measured) and an "
        f"open-loop turn ({s['open_warm']:g} s unmeasured, {s['open_seconds']:g} s measured); "
        f"estimated "
        f"{result['estimate_seconds'] / 60:.0f} min, took {result['wall_seconds'] / 60:.1f} min"
    )
    if any(cell.get("replay") for p in result["personalities"] for cell in p["cells"]):
        print(
            "trace cells: one replay per target at the trace's arrival times, its first "
            f"{TRACE_WARM:.0%} unmeasured (at least the open-loop warm-up)"
        )
    for name, version in result["peer_versions"].items():
        print(f"{name}: {version}")
    for p in result["personalities"]:
        print()
        print(
            f"== personality {p['personality']}: {p['summary']}; requests per replica from "
            f"{p['requests_source']}, prefix hits from {p['cache_source']}"
        )
        for name, flags in p["router_flags"].items():
            print(f"   {name}: {flags}")
        for name, reason in p["skipped"].items():
            print(f"   {name}: skipped ({reason})")
        for name, kids in p["router_children"].items():
            print(f"   {name}: child processes {kids} (their CPU counted)")
        print()
        for cell in p["cells"]:
            report_cell(p, cell, result["concurrency"])
    report_summary(result)


def typical_e2e(personality: str, wl: Workload, concurrency: int) -> tuple[float, float, float]:
    """Rough (cold first wave, unloaded, closed-loop) times of `wl` on `personality`, for
    the printed estimate only: the closed loop's first wave prefills every prompt whole
    (the caches were reset); later a request prefills its uncached tokens and decodes 32
    steps, and in a closed loop at `concurrency` takes at least what Little's law gives
    at the replica's capacity (prefill-bound or batch-bound)."""
    cfg = zoo.get(personality).engine_config()
    per_replica = concurrency / REPLICAS
    batch = min(per_replica, cfg.max_num_seqs)
    decode = OUTPUT_TOKENS * (cfg.decode_step_ms + cfg.decode_ms_per_seq * batch) / 1e3
    prefill = wl.uncached_tokens * cfg.prefill_us_per_token * 1e-6
    unloaded = prefill + decode
    capacity = min(1 / prefill if prefill else math.inf, cfg.max_num_seqs / unloaded)
    cold = per_replica * wl.prompt_tokens * cfg.prefill_us_per_token * 1e-6 + decode
    return max(cold, unloaded), unloaded, max(unloaded, per_replica / capacity)


def estimate(
    settings: Settings,
    names: Sequence[str],
    wls: Sequence[Workload],
    n_targets: int,
    concurrency: int,
) -> float:
    """Seconds the run should take: per turn its unmeasured start, its measured window,
    the requests in flight finishing, and the turn's overhead."""
    total = 0.0
    for name in names:
        total += PERSONALITY_SETUP + n_targets * WARM_PER_TARGET
        for wl in wls:
            if isinstance(wl, Trace):
                total += n_targets * settings.rounds * (wl.duration + 5 + 2 * TURN_OVERHEAD)
                continue
            # llama-server: its simulated personality's figures, a rough guess.
            cold, unloaded, e2e = typical_e2e(
                "llamacpp" if name == LLAMA_ENGINE else name, wl, concurrency
            )
            # A closed window waits for `concurrency` answers (at most 3x its length).
            window = min(max(settings.closed_seconds, e2e), 3 * settings.closed_seconds)
            closed = max(settings.closed_warm, cold) + window + e2e
            opened = max(settings.open_warm, unloaded) + settings.open_seconds + e2e
            total += n_targets * settings.rounds * (closed + opened + 2 * TURN_OVERHEAD)
    return total


async def main_async(
    fleet: c.Fleet,
    settings: Settings,
    names: Sequence[str],
    wl_names: Sequence[str],
    concurrency: int,
    peers: dict[str, Path | None],
    peer_reasons: dict[str, str],
    trace: TraceSpec,
    llama_server: str | None,
    compare: tuple[str, Path] | None = None,
    kv_events: bool = False,
) -> dict[str, Any]:
    wls = workloads(trace)
    out = []
    for k, name in enumerate(names):
        out.append(
            await run_personality(
                fleet,
                name,
                [wls[w] for w in wl_names],
                k * len(wl_names),
                settings,
                concurrency,
                peers,
                peer_reasons,
                llama_server,
                compare,
                kv_events,
            )
        )
        for cell in out[-1]["cells"]:
            cell["verdicts"] = verdicts(cell)
    return {"personalities": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="shorter turns and a smaller matrix")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead")
    p.add_argument(
        "--personality",
        action="append",
        choices=zoo.NAMES,
        help=f"repeatable (default {', '.join(DEFAULT_PERSONALITIES)}; "
        f"--quick {', '.join(QUICK_PERSONALITIES)})",
    )
    p.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help=f"repeatable (default {', '.join(DEFAULT_WORKLOADS)}; "
        f"--quick {', '.join(QUICK_WORKLOADS)})",
    )
    p.add_argument(
        "--engine",
        choices=("sim", "llamacpp"),
        default="sim",
        help="sim: llmgw-sim personalities (default); llamacpp: four real llama-server "
        "replicas of the tiny GGUF model (scripts/llama_server.sh builds the binary)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help=f"trace file of the trace workload (Mooncake's format; default {default_trace()})",
    )
    p.add_argument(
        "--trace-start",
        type=float,
        default=TRACE_START,
        help=f"s into the trace where the replay starts (default {TRACE_START:g})",
    )
    p.add_argument(
        "--trace-seconds",
        type=float,
        default=None,
        help=f"s of the trace replayed (default {TRACE_SECONDS:g}, "
        f"--quick {TRACE_QUICK_SECONDS:g})",
    )
    p.add_argument(
        "--trace-scale",
        type=float,
        default=TRACE_SCALE,
        help=f"token counts divided by this (default {TRACE_SCALE:g}: "
        f"{TRACE_BLOCK_TOKENS}-token blocks of {TRACE_BLOCK_TOKENS / TRACE_SCALE:g})",
    )
    p.add_argument(
        "--trace-speed",
        type=float,
        default=None,
        help="arrivals this many times as fast as the trace's (default "
        + ", ".join(f"{k} {v:g}" for k, v in TRACE_SPEED.items())
        + ")",
    )
    p.add_argument("--no-peers", action="store_true", help="no vllm-router or sglang-router")
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"closed-loop concurrency, every cell (default {CONCURRENCY})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds per cell (default 1; the run's time grows with it)",
    )
    p.add_argument(
        "--peers-venv",
        type=Path,
        default=c.PEERS_VENV,
        help=f"venv holding vllm-router and sglang-router (default {c.PEERS_VENV})",
    )
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="one more target: llmgw (default configuration) imported from CHECKOUT/src, "
        "say a `git worktree` of an earlier revision, to measure a change side by side",
    )
    p.add_argument(
        "--kv-events",
        action="store_true",
        help="one more target: llmgw routing on the engines' own KV-cache index (every "
        "llmgw-sim publishes its events; that router is told where)",
    )
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.trace_scale <= 0 or (args.trace_speed is not None and args.trace_speed <= 0):
        p.error("--trace-scale and --trace-speed must be positive")
    if args.trace_seconds is not None and args.trace_seconds <= 0:
        p.error("--trace-seconds must be positive")
    settings = QUICK if args.quick else DEFAULT
    if args.rounds is not None:
        settings = attrs.evolve(settings, rounds=args.rounds)
    trace = TraceSpec(
        args.trace or default_trace(),
        args.trace_start,
        args.trace_seconds or (TRACE_QUICK_SECONDS if args.quick else TRACE_SECONDS),
        args.trace_scale,
        args.trace_speed or TRACE_SPEED[args.engine],
    )
    llama_server = None
    if args.engine == "llamacpp":
        if args.personality:
            p.error("--personality is for --engine sim")
        from llmgw.agent.adapters.llamacpp import find_llama_server

        llama_server = find_llama_server()
        if llama_server is None:
            p.error("llama-server not found: scripts/llama_server.sh builds it")
        names = [LLAMA_ENGINE]
    else:
        names = list(
            dict.fromkeys(
                args.personality or (QUICK_PERSONALITIES if args.quick else DEFAULT_PERSONALITIES)
            )
        )
    wl_names = list(
        dict.fromkeys(args.workload or (QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS))
    )
    if "trace" in wl_names and not trace.path.is_file():
        p.error(f"no trace file {trace.path} (--trace PATH)")
    peers: dict[str, Path | None] = {}
    reasons: dict[str, str] = {}
    versions: dict[str, str] = {}
    for name, binary, dist in (
        (VLLM, "vllm-router", "vllm-router"),
        (SGLANG, "sglang-router", "sglang-router"),
    ):
        if args.no_peers:
            peers[name], reasons[name] = None, "--no-peers"
            continue
        peers[name] = c.peer_binary(binary, args.peers_venv)
        if peers[name] is None:
            reasons[name] = f"no {binary} in {args.peers_venv}: run benchmarks/setup_peers.sh"
        else:
            versions[dist] = c.peer_version(dist, args.peers_venv)
    compare = None
    if args.compare is not None:
        src = args.compare.resolve() / "src"
        if not (src / "llmgw" / "__init__.py").is_file():
            p.error(f"--compare {args.compare}: no src/llmgw there (a checkout of llmgw?)")
        rev = subprocess.run(
            ["git", "-C", str(args.compare), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        compare = (f"llmgw {rev or args.compare.name}", src)
    if args.kv_events and args.engine != "sim":
        p.error("--kv-events: llmgw-sim publishes KV-cache events; llama-server does not")
    n_targets = (
        3 + (compare is not None) + args.kv_events + sum(1 for b in peers.values() if b is not None)
    )
    all_wls = workloads(trace)
    eta = estimate(settings, names, [all_wls[w] for w in wl_names], n_targets, args.concurrency)
    c.log(
        f"{len(names)} personalities x {len(wl_names)} workloads x {n_targets} targets: "
        f"estimated {eta / 60:.0f} min ({', '.join(names)} x {', '.join(wl_names)})"
    )
    for name, reason in reasons.items():
        c.log(f"{name} skipped: {reason}")
    machine = c.machine()  # the load average at the start
    started = time.monotonic()
    result = None
    try:
        with c.fleet() as fleet:
            result = c.run_trio(
                main_async,
                fleet,
                settings,
                names,
                wl_names,
                args.concurrency,
                peers,
                reasons,
                trace,
                llama_server,
                compare,
                args.kv_events,
            )
    except* KeyboardInterrupt:
        pass  # trio may deliver it inside an exception group
    if result is None:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    result.update(
        benchmark="routing_quality",
        date=time.strftime("%Y-%m-%d %H:%M:%S %z"),
        machine=machine,
        revision=c.revision(),
        settings=attrs.asdict(settings),
        engine=args.engine,
        concurrency=args.concurrency,
        open_factor=OPEN_FACTOR,
        peer_versions=versions,
        estimate_seconds=eta,
        wall_seconds=time.monotonic() - started,
        targets={
            "ttft_p90_vs_best_peer_at_most": TARGET_VS_PEER,
            "ttft_p90_vs_round_robin_at_most": TARGET_VS_RR,
            "busiest_over_mean_at_most": TARGET_BUSIEST,
            "closed_throughput_vs_round_robin_at_least": TARGET_THROUGHPUT,
        },
    )
    if args.json:
        print(json.dumps(bench.to_jsonable(result), indent=2, default=str))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
