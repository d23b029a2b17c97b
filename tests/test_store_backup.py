"""docs/operations.md's SQLite backup, as written there: `VACUUM INTO` through Python's
sqlite3 module while a real llmgw-server writes usage records to the store, and the
copy restored under another server, whose clients' keys then work."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import trio

from llmgw.store import open_store
from llmgw.store.migrations import latest
from llmgw.store.migrations.sqlite import MIGRATIONS

from .procs import scratch_dir, server, sim, wait_for

CONFIG = """
[store]
url = "sqlite://{path}"
[router]
scrape_interval = "200ms"
scrape_timeout = "150ms"
"""

# The command docs/operations.md gives (there as `python3 -c`).
BACKUP = (
    "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('VACUUM INTO ?', (sys.argv[2],))"
)


def _create_key(url: str) -> str:
    async def create() -> str:
        store = await open_store(url)
        try:
            _, secret = await store.create_key("ops")
            return secret
        finally:
            await store.aclose()

    return trio.run(create)


def _usage_rows(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM usage_records").fetchone()[0])


def _ask(base: str, key: str | None) -> int:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    r = httpx.post(
        f"{base}/v1/completions",
        json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
        headers=headers,
        timeout=10,
    )
    return r.status_code


def test_a_live_sqlite_store_backs_up_and_restores() -> None:
    live = scratch_dir("llmgw-live-") / "llmgw.db"
    key = _create_key(f"sqlite://{live}")
    with (
        sim() as (_, engine),
        server("--endpoint", f"e={engine}=sim-model", config=CONFIG.format(path=live)) as srv,
    ):
        srv.wait_scraped()
        assert _ask(srv.base, key) == 200
        wait_for(lambda: _usage_rows(live) > 0, "a usage record written", 10)

        # Traffic (and so usage writes) goes on while the backup runs.
        stop = threading.Event()
        answered: list[int] = []

        def traffic() -> None:
            while not stop.is_set():
                answered.append(_ask(srv.base, key))

        sender = threading.Thread(target=traffic)
        sender.start()
        try:
            wait_for(lambda: len(answered) >= 20, "traffic during the backup", 20)
            backup = scratch_dir("llmgw-backup-") / "llmgw-backup.db"
            done = subprocess.run(
                [sys.executable, "-c", BACKUP, str(live), str(backup)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            count = len(answered)
            wait_for(lambda: len(answered) >= count + 20, "traffic after the backup", 20)
        finally:
            stop.set()
            sender.join(30)
        assert set(answered) == {200}

    with sqlite3.connect(backup) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        assert version == latest(MIGRATIONS)
        assert db.execute("SELECT name FROM api_keys").fetchall() == [("ops",)]
    assert _usage_rows(backup) > 0

    # Restored as the store of another server: the key still opens the client port.
    restored = scratch_dir("llmgw-restored-") / "llmgw.db"
    restored.write_bytes(backup.read_bytes())
    with (
        sim() as (_, engine),
        server("--endpoint", f"e={engine}=sim-model", config=CONFIG.format(path=restored)) as srv,
    ):
        srv.wait_scraped()
        assert _ask(srv.base, None) == 401
        assert _ask(srv.base, key) == 200
