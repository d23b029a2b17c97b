"""The control plane's lease (llmgw.control.leadership) and its clock (issue #32): a
leader's own reckoning on trio's virtual clock against a fake store, and the lease's
clock in both real stores (PostgreSQL's own; SQLite's caller's)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from llmgw.control.leadership import LEASE, MARGIN, Leadership
from llmgw.store import open_store
from llmgw.store.sql.threaded import ThreadedStore
from tests.pg_cluster import TempCluster

# On trio's virtual clock: the fake store's tests (the real stores' use threads).
virtual = pytest.mark.parametrize(
    "anyio_backend", [("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})]
)


class FakeStore:
    """A lease store: grants the first claim; renewals hang once `hang` is set; reads
    say the lease has `remaining` seconds by the store's clock, which is `skew` away
    from anything this process's clocks say."""

    def __init__(self, *, grant: bool = True, remaining: float = 10.0) -> None:
        self.grant = grant
        self.remaining = remaining
        self.hang = False
        self.skew = 1e6

    def wall_clock(self) -> float:
        return time.time()  # nothing the lease may go by

    async def claim_leadership(self, *args: Any) -> int | None:
        return 1 if self.grant else None

    async def renew_leadership(self, *args: Any) -> bool:
        if self.hang:
            await trio.sleep_forever()
        return True

    async def resign_leadership(self, *args: Any) -> bool:
        return True

    async def read_leadership(self, name: str) -> tuple[Any, ...]:
        now = self.skew + 5000.0
        return ("other", "a:1", "b:2", 7, now + self.remaining, now)


@virtual
async def test_a_leader_stops_acting_a_margin_before_its_lease_by_its_own_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Renewals that stop answering: the leader steps down (says so, wakes waiters)
    at (1 - MARGIN) of the lease after its last renewal was sent, before any other
    instance may claim it."""
    store = FakeStore()
    leadership = Leadership(store, instance="me", ttl=10)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="llmgw.control")
    async with trio.open_nursery() as nursery:
        await nursery.start(leadership.run)
        assert await leadership.wait_leading() == 1
        claimed = trio.current_time()
        store.hang = True  # the next renewal (at ttl / 3) never comes back
        await trio.sleep(10 * (1 - MARGIN) - 0.01)
        assert leadership.leading()
        await leadership.wait_not_leading()
        stepped_down = trio.current_time() - claimed
        await trio.testing.wait_all_tasks_blocked()
        assert leadership.token is None  # stepped down then, not at a next renewal
        nursery.cancel_scope.cancel()
    assert stepped_down == pytest.approx(10 * (1 - MARGIN), abs=0.02)
    assert stepped_down < 10  # before the store's lease could end
    assert any("no longer leading" in r.getMessage() for r in caplog.records)


@virtual
async def test_the_leader_named_is_timed_by_the_stores_clock() -> None:
    """A follower's view of the leader's lease: its remaining time by the store's
    clock, counted on the follower's own (which is a million seconds off)."""
    store = FakeStore(grant=False, remaining=6.0)
    leadership = Leadership(store, instance="me", ttl=30)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(leadership.run)
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()
        leader = leadership.current_leader()
        assert leader is not None and leader.instance == "other"
        assert leader.admin_address == "b:2" and leader.token == 7
        await trio.sleep(5.9)  # the next read is at ttl / 3 = 10 s (virtual time)
        assert leadership.current_leader() is not None
        await trio.sleep(0.2)
        assert leadership.current_leader() is None, trio.current_time() - started
        nursery.cancel_scope.cancel()


# -- the real stores ---------------------------------------------------------------------


async def test_on_postgresql_the_lease_goes_by_the_databases_clock(
    pg_cluster: TempCluster,
) -> None:
    """Two instances' stores, one clock two minutes behind: the one behind holds the
    lease and the other cannot take it while it is live (by its own clock the lease
    ended long ago); the lease's end and read time are PostgreSQL's."""
    url = pg_cluster.new_database()
    behind = await open_store(url, clock=lambda: time.time() - 120)
    other = await open_store(url)
    try:
        assert await behind.claim_leadership(LEASE, "behind", "a:1", "b:1", 30.0) == 1
        assert await other.claim_leadership(LEASE, "other", "a:2", "b:2", 30.0) is None
        assert await behind.renew_leadership(LEASE, "behind", 1, 30.0)
        row = await other.read_leadership(LEASE)
        assert row is not None and row[0] == "behind"
        *_, token, expires, now = row
        assert token == 1
        assert abs(now - time.time()) < 60  # the database's clock (this host's here)
        assert 25 < expires - now <= 30
        # Let go: the other takes it at once, with the next token.
        assert await behind.resign_leadership(LEASE, "behind", 1)
        assert await other.claim_leadership(LEASE, "other", "a:2", "b:2", 30.0) == 2
    finally:
        await behind.aclose()
        await other.aclose()


async def test_on_sqlite_the_lease_goes_by_the_callers_clock(tmp_path: Path) -> None:
    """SQLite is one host's file: the lease is timed by the clock the store was given
    (that host's), which tests set."""
    now = [1_700_000_000.0]
    store = await open_store(f"sqlite://{tmp_path}/llmgw.db", clock=lambda: now[0])
    try:
        assert isinstance(store, ThreadedStore) and not store.database_clock
        assert await store.claim_leadership(LEASE, "a", "", "", 10.0) == 1
        row = await store.read_leadership(LEASE)
        assert row is not None and row[4] == now[0] + 10 and row[5] == now[0]
        now[0] += 9.0
        assert await store.claim_leadership(LEASE, "b", "", "", 10.0) is None
        now[0] += 2.0
        assert await store.claim_leadership(LEASE, "b", "", "", 10.0) == 2
    finally:
        await store.aclose()


async def test_a_follower_answers_503_with_retry_after_when_the_leader_is_gone() -> None:
    """The leader named in the store does not take connections (killed): a fleet call
    to a follower is answered 503 with Retry-After (the rest of the lease), not 502; the
    follower's own routes stay its own."""
    import socket

    from llmgw.admin.leader import ToLeader
    from llmgw.control.leadership import Leader

    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store: Any = FakeStore(grant=False)
    leadership = Leadership(store, instance="me", ttl=10)
    leadership.leader = Leader("other", "", f"127.0.0.1:{port}", 7, trio.current_time() + 4.5)
    local: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        local.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def call(path: str) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
        await to_leader(scope, receive, send)
        return sent

    to_leader = ToLeader(app, leadership)
    with trio.fail_after(10):
        start, body = await call("/api/v1/nodes")
    assert start["status"] == 503, (start, body)
    assert 1 <= int(dict(start["headers"])[b"retry-after"]) <= 5  # the lease's rest
    # (it was tried: the leader's lease is live; then the rest of the lease to wait)
    assert b"did not answer" in body["body"] and b"no_leader" in body["body"]
    start, _ = await call("/api/v1/endpoints")
    assert start["status"] == 200 and local == ["/api/v1/endpoints"]


def test_the_follower_presents_renewed_admin_certificates(tmp_path: Path) -> None:
    """The admin listener takes renewed files on SIGHUP; what a follower presents to the
    leader follows them: a new context once they change, the same one until then."""
    import os

    from llmgw.admin.leader import LeaderTls
    from llmgw.transport.certs import make_ca, make_server_cert

    ca = make_ca(tmp_path)
    pair = make_server_cert(tmp_path, ca)
    tls = LeaderTls(str(pair.cert), str(pair.key), str(ca.cert))
    first = tls.context
    assert not tls.renewed() and tls.context is first
    make_server_cert(tmp_path, ca)  # renewed in place, as an operator would
    later = os.stat(pair.cert).st_mtime + 1  # (a clock too coarse to tell them apart)
    os.utime(pair.cert, (later, later))
    assert tls.renewed() and tls.context is not first
    assert not tls.renewed()
    # A renewal that cannot be read keeps the context there is.
    pair.key.write_text("not a key")
    os.utime(pair.key, (later + 1, later + 1))
    kept = tls.context
    assert not tls.renewed() and tls.context is kept
