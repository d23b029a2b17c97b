"""Profile a running llmgw-sim: cold vs cached time to first token, decode rates.

    python benchmarks/sim_profile.py                 # starts its own simulator
    python benchmarks/sim_profile.py --url http://127.0.0.1:8000 --model sim-model

Prints, and with --json emits, the median TTFT of a ~2,000-token prompt seen for the
first time and again (prefix cache hit), and the decode rate at batch 1 and batch 16:
tokens/s of each sequence between its first and last token, and aggregate tokens/s
while all of them ran. Flags after `--` go to the simulator it starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

BIN = Path(sys.executable).parent


async def stream(
    http: httpx.AsyncClient, model: str, prompt: str, max_tokens: int
) -> tuple[float, list[float]]:
    """(time to first token, arrival time of every token) of one streamed chat."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    start = time.perf_counter()
    stamps: list[float] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("no tokens streamed")
    return stamps[0] - start, stamps


def unique_prompt(chars: int) -> str:
    salt = uuid.uuid4().hex
    text = (salt + " the quick brown fox jumps over the lazy dog ") * (chars // 50 + 1)
    return text[:chars]


async def ttft_cold_vs_cached(http: httpx.AsyncClient, model: str, rounds: int) -> dict[str, float]:
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        prompt = unique_prompt(8000)  # ~2,000 tokens at ~4 characters per token
        cold.append((await stream(http, model, prompt, 1))[0])
        warm.append((await stream(http, model, prompt, 1))[0])
    return {
        "ttft_cold_ms": statistics.median(cold) * 1e3,
        "ttft_cached_ms": statistics.median(warm) * 1e3,
    }


async def decode_rate(
    http: httpx.AsyncClient, model: str, batch: int, tokens: int
) -> dict[str, float]:
    results: list[list[float]] = []

    async def one(i: int) -> None:
        results.append((await stream(http, model, f"sequence {i} {uuid.uuid4()}", tokens))[1])

    async with trio.open_nursery() as nursery:
        for i in range(batch):
            nursery.start_soon(one, i)
    per_seq = [(len(s) - 1) / (s[-1] - s[0]) for s in results]
    # Aggregate over the window in which every sequence was decoding.
    lo = max(s[0] for s in results)
    hi = min(s[-1] for s in results)
    in_window = sum(1 for s in results for t in s if lo <= t <= hi)
    return {
        f"batch{batch}_tok_s_per_seq": statistics.median(per_seq),
        f"batch{batch}_tok_s_aggregate": in_window / (hi - lo) if hi > lo else float("nan"),
    }


async def profile(url: str, model: str, rounds: int, tokens: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await stream(http, model, "warm up", 2)
        out = await ttft_cold_vs_cached(http, model, rounds)
        for batch in (1, 16):
            out |= await decode_rate(http, model, batch, tokens)
    return out


def wait_up(ready: Path, proc: subprocess.Popen[bytes]) -> str:
    """The simulator's URL, once its ready file names the port it listens on."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llmgw-sim exited with {proc.returncode}")
        if ready.exists():  # written by a rename: complete once it exists
            return f"http://{json.loads(ready.read_text())['listen'][0]}"
        time.sleep(0.05)
    raise SystemExit("llmgw-sim did not come up")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sim_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, sim_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--url", help="a running simulator (default: start one)")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--rounds", type=int, default=5, help="cold/cached pairs (default 5)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per decode sequence")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    proc: subprocess.Popen[bytes] | None = None
    url = args.url
    scratch = tempfile.TemporaryDirectory(prefix="llmgw-sim-profile-")
    if url is None:
        ready = Path(scratch.name) / "ready.json"
        cmd = [str(BIN / "llmgw-sim"), "--port", "0", "--ready-file", str(ready)]
        cmd += ["--model", args.model, *sim_args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        url = wait_up(ready, proc)
    try:
        results: dict[str, Any] = trio.run(profile, url, args.model, args.rounds, args.tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        scratch.cleanup()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:32} {value:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
