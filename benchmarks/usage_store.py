"""Store throughput: usage records into SQLite and PostgreSQL, and API key lookups.

    python benchmarks/usage_store.py [--records 200000] [--batch 500] [--pg-url URL] [--json]

For each backend (SQLite: a file in a temporary directory, WAL, synchronous=NORMAL;
PostgreSQL: a throwaway cluster from tests/pg_cluster.py with durable defaults —
fsync and synchronous_commit on — unless --pg-url names another server, whose
database must be empty or already migrated):

* direct: ``record_usage`` with batches of `--batch` records, one after the other
  (each batch one transaction; PostgreSQL uses COPY);
* batcher: ``UsageBatcher.record()`` called `--records` times from one trio task as
  fast as it can, ``run()`` flushing in batches of `--batch`; the time until the
  last record is written, and the cost of ``record()`` itself (the hot path);
* lookups: ``lookup_key`` of existing keys, one at a time and 32 at once (reads
  through worker threads: SQLite's per-thread connections, PostgreSQL's pool).

Nothing is asserted; the machine's cores are shared by the client, the store threads
and, for PostgreSQL, the server.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import trio

import _common as c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg_cluster

import trio.lowlevel

from llmgw.domain.usage import Usage, UsageRecord
from llmgw.store import TimedUsage, UsageBatcher, open_store
from llmgw.store.sql.threaded import ThreadedStore


def records(n: int, keys: list[str]) -> list[UsageRecord]:
    return [
        UsageRecord(
            model=f"model-{i % 7}",
            endpoint=f"ep-{i % 5}",
            status=200 if i % 50 else 500,
            usage=Usage(100 + i % 300, 20 + i % 100, None),
            latency=0.5 + (i % 10) / 10,
            ttft=0.05,
            key_id=keys[i % len(keys)],
            band="gold",
            tenant=None,
        )
        for i in range(n)
    ]


async def measure(url: str, n: int, batch: int) -> dict[str, Any]:
    store = cast(ThreadedStore, await open_store(url))
    out: dict[str, Any] = {}
    try:
        made = [await store.create_key(f"bench-{i}") for i in range(50)]
        key_ids = [r.id for r, _ in made]
        recs = records(n, key_ids)

        # direct: batches of `batch`, one after the other
        now = time.time()
        stamped: list[TimedUsage] = [(now + i * 1e-3, r) for i, r in enumerate(recs)]
        start = time.perf_counter()
        for i in range(0, n, batch):
            await store.record_usage(stamped[i : i + batch])
        out["direct_records_per_s"] = n / (time.perf_counter() - start)

        # batcher: record() as fast as possible, run() writing behind it
        batcher = UsageBatcher(store, max_batch=batch, flush_interval=1.0, max_buffer=n + 1)
        record_cost = 0.0
        async with trio.open_nursery() as nursery:
            await nursery.start(batcher.run)
            start = time.perf_counter()
            for i in range(0, n, 1000):
                t = time.perf_counter()
                for r in recs[i : i + 1000]:
                    batcher.record(r)
                record_cost += time.perf_counter() - t
                # Let the flusher run, as a server's other tasks would.
                await trio.lowlevel.checkpoint()
            while batcher.written < n:  # noqa: ASYNC110 - polling a counter
                await trio.sleep(0.001)
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        out["batcher_records_per_s"] = n / elapsed
        out["record_call_us"] = record_cost / n * 1e6
        out["batcher_dropped"] = batcher.dropped

        # usage summary over everything written (2n rows)
        start = time.perf_counter()
        await store.usage_summary("model", bucket=60)
        out["summary_rows"] = 2 * n
        out["summary_ms"] = (time.perf_counter() - start) * 1e3

        # key lookups
        secrets = [s for _, s in made]
        m = 2000
        start = time.perf_counter()
        for i in range(m):
            assert await store.lookup_key(secrets[i % len(secrets)]) is not None
        out["lookup_serial_per_s"] = m / (time.perf_counter() - start)

        async def worker(j: int) -> None:
            for i in range(j, m, 32):
                await store.lookup_key(secrets[i % len(secrets)])

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for j in range(32):
                nursery.start_soon(worker, j)
        out["lookup_c32_per_s"] = m / (time.perf_counter() - start)
    finally:
        await store.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--pg-url", help="an existing PostgreSQL database instead of a temp one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = trio.run(measure, f"sqlite://{tmp}/bench.db", args.records, args.batch)
    if args.pg_url:
        results["postgres"] = trio.run(measure, args.pg_url, args.records, args.batch)
    else:
        from tests.pg_cluster import TempCluster

        cluster = TempCluster(fast=False).start()
        try:
            url = cluster.new_database()
            results["postgres"] = trio.run(measure, url, args.records, args.batch)
        finally:
            cluster.stop()

    if args.json:
        print(json.dumps(results, indent=2))
        return
    names = list(results)

    def row(label: str, key: str, fmt: str) -> list[str]:
        return [label, *(format(results[b][key], fmt) for b in names)]

    rows = [
        row("usage, direct (records/s)", "direct_records_per_s", ",.0f"),
        row("usage, through UsageBatcher (records/s)", "batcher_records_per_s", ",.0f"),
        row("UsageBatcher.record() (µs/call)", "record_call_us", ".2f"),
        row(
            f"usage_summary by model per minute, {2 * args.records:,} rows (ms)",
            "summary_ms",
            ".0f",
        ),
        row("lookup_key, one at a time (/s)", "lookup_serial_per_s", ",.0f"),
        row("lookup_key, 32 concurrent (/s)", "lookup_c32_per_s", ",.0f"),
    ]
    c.print_table(
        f"store throughput ({args.records:,} records, batches of {args.batch})", ["", *names], rows
    )


if __name__ == "__main__":
    main()
