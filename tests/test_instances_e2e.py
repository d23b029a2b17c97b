"""Several instances on one PostgreSQL (issue #32, "several instances"), through real
processes: a follower's fleet API and dashboard over admin TLS and on its overview, a
paused leader, and instances whose wall clocks disagree.

The clock skew is injected with ``_LLMGW_TEST_CLOCK_OFFSET`` (llmgw.control.leadership:
a test-only offset of a process's wall clock; faketime is not available here).
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime

import httpx
import pytest

from llmgw.control.leadership import CLOCK_OFFSET_ENV
from tests.pg_cluster import TempCluster
from tests.procs import FleetServer, agent, fleet_server, scratch_dir
from tests.test_failover_e2e import config, leading
from tests.test_tls_listeners import make_certs
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def _lease(text: str, lease: str) -> str:
    return text.replace('lease = "6s"', f'lease = "{lease}"')


# -- admin TLS -----------------------------------------------------------------------


@pytest.fixture
def tls_pair(pg_cluster: TempCluster) -> Iterator[tuple[list[FleetServer], ssl.SSLContext]]:
    """Two instances whose admin listeners take TLS with client certificates, and one
    agent; the context an operator's client uses (trusts the CA, presents ops.pem)."""
    certs = scratch_dir("llmgw-tls-")
    ca = make_certs(certs, "ops")
    tls = (
        f'[admin_tls]\ncert = "{certs / "server.pem"}"\nkey = "{certs / "server.key"}"\n'
        f'client_ca = "{ca.cert}"\n'
    )
    context = ssl.create_default_context(cafile=str(ca.cert))
    context.load_cert_chain(str(certs / "ops.pem"), str(certs / "ops.key"))
    url = pg_cluster.new_database()
    with ExitStack() as stack:
        servers = [stack.enter_context(fleet_server(tls + config(url))) for _ in range(2)]
        every = ",".join(s.agent_address for s in servers)
        stack.enter_context(agent(every, "n0", address="127.0.0.97", gpus="2x80GB"))
        yield servers, context


def _https(srv: FleetServer) -> str:
    return srv.admin.replace("http://", "https://")


def _tls_leading(srv: FleetServer, context: ssl.SSLContext) -> bool:
    try:
        text = httpx.get(f"{_https(srv)}/metrics", verify=context, timeout=5).text
    except httpx.HTTPError:
        return False
    return re.search(r"^llmgw_fleet_leading 1(\.0)?$", text, re.MULTILINE) is not None


def test_a_follower_passes_fleet_calls_to_the_leader_over_admin_tls(
    tls_pair: tuple[list[FleetServer], ssl.SSLContext],
) -> None:
    servers, context = tls_pair
    leader = wait_for(lambda: [s for s in servers if _tls_leading(s, context)], "a leader")[0]
    follower = next(s for s in servers if s is not leader)

    def nodes(srv: FleetServer) -> set[str] | None:
        r = httpx.get(f"{_https(srv)}/api/v1/nodes", verify=context, timeout=10)
        assert r.status_code == 200, f"{srv.admin}: {r.status_code} {r.text[:300]}"
        return {n["id"] for n in r.json()["nodes"]} or None

    assert wait_for(lambda: nodes(leader), "the agent registered with the leader") == {"n0"}
    assert nodes(follower) == {"n0"}
    page = httpx.get(f"{_https(follower)}/fleet", verify=context, timeout=10)
    assert page.status_code == 200 and "n0" in page.text, page.text[:300]


# -- the dashboard's overview ---------------------------------------------------------


def test_a_followers_overview_shows_the_leaders_fleet(pg_cluster: TempCluster) -> None:
    url = pg_cluster.new_database()
    with ExitStack() as stack:
        servers = [stack.enter_context(fleet_server(config(url))) for _ in range(2)]
        every = ",".join(s.agent_address for s in servers)
        stack.enter_context(agent(every, "n0", address="127.0.0.98", gpus="2x80GB"))
        leader = wait_for(lambda: [s for s in servers if leading(s)], "a leader")[0]
        follower = next(s for s in servers if s is not leader)
        leader.wait(lambda: leader.ready_replicas("m", 2), "two replicas")

        def overview(srv: FleetServer) -> str:
            r = httpx.get(f"{srv.admin}/", timeout=10)
            assert r.status_code == 200, r.text[:300]
            return r.text

        assert "1 node<" in overview(leader)
        page = overview(follower)
        assert "1 node<" in page, page
        assert re.search(r">\s*2 / 2\s*<", page), page


# -- a paused leader -------------------------------------------------------------------


def test_a_paused_leaders_followers_answer_503_within_the_lease(pg_cluster: TempCluster) -> None:
    """SIGSTOP the leader: a follower answers its fleet API with 503 and Retry-After
    within the lease (6 s), never 502 nor after a long hang, until it leads itself."""
    url = pg_cluster.new_database()
    lease = 6.0
    with ExitStack() as stack:
        servers = [stack.enter_context(fleet_server(config(url))) for _ in range(2)]
        leader = wait_for(lambda: [s for s in servers if leading(s)], "a leader")[0]
        follower = next(s for s in servers if s is not leader)
        assert httpx.get(f"{follower.admin}/api/v1/nodes", timeout=10).status_code == 200
        os.killpg(leader.proc.pid, signal.SIGSTOP)
        try:
            answers: list[tuple[int, str | None, float]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(answers) < 100:
                started = time.monotonic()
                try:
                    r = httpx.get(f"{follower.admin}/api/v1/nodes", timeout=20)
                except httpx.TimeoutException:
                    pytest.fail(f"no answer within 20 s; before: {answers}")
                took = time.monotonic() - started
                answers.append((r.status_code, r.headers.get("retry-after"), took))
                if r.status_code == 200:
                    break
            else:
                pytest.fail(f"the follower never answered for the fleet itself: {answers}")
        finally:
            os.killpg(leader.proc.pid, signal.SIGCONT)
        assert answers[0][0] == 503, answers  # the leader's lease is still live then
        for status, retry_after, took in answers:
            assert status in (200, 503), answers
            assert took < lease, answers
            if status == 503:
                assert retry_after is not None and int(retry_after) >= 1, answers
        assert leading(follower)


# -- skewed clocks ----------------------------------------------------------------------

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"


def _terms(output: str) -> list[tuple[float, float]]:
    """The spans an instance's log says it led: (from, to), to = inf while it leads."""
    spans: list[tuple[float, float]] = []
    start: float | None = None
    for line in output.splitlines():
        found = re.match(_STAMP, line)
        if found is None:
            continue
        at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if "leading the control plane (fencing token" in line and "no longer" not in line:
            start = at
        elif "no longer leading the control plane" in line and start is not None:
            spans.append((start, at))
            start = None
    if start is not None:
        spans.append((start, float("inf")))
    return spans


def test_instances_with_skewed_clocks_never_both_lead(pg_cluster: TempCluster) -> None:
    """One instance's wall clock two minutes behind the other's: it leads, the other
    starts; the lease is timed by PostgreSQL's clock, so the other never takes a lease
    being renewed, and at no time do both lead (sampled through their metrics, and by
    their logs)."""
    url = pg_cluster.new_database()
    text = _lease(config(url), "30s")  # renewed every 10 s: the window below sees one
    with ExitStack() as stack:
        behind = stack.enter_context(fleet_server(text, env={CLOCK_OFFSET_ENV: "-120"}))
        wait_for(lambda: leading(behind), "the first instance leads")
        other = stack.enter_context(fleet_server(text))
        samples: list[tuple[bool, bool]] = []
        window = time.monotonic() + 14  # past the leader's next renewal (10 s)
        while time.monotonic() < window and len(samples) < 1000:
            samples.append((leading(behind), leading(other)))
            time.sleep(0.05)  # spaces the samples; the window is what is waited for
        spans = [_terms(behind.proc.output()), _terms(other.proc.output())]
    assert len(samples) >= 5  # (each is two /metrics scrapes: slow on a loaded machine)
    assert not any(a and b for a, b in samples), samples
    overlaps = [
        (a, b) for a in spans[0] for b in spans[1] if max(a[0], b[0]) < min(a[1], b[1]) - 0.2
    ]
    assert overlaps == [], spans
    # The live lease stayed where it was: nobody took it by a clock of its own.
    assert not any(b for _, b in samples) and sum(a for a, _ in samples) > len(samples) // 2


def test_the_lease_is_timed_by_postgresqls_clock(pg_cluster: TempCluster) -> None:
    """The leader's lease row expires by the database's clock, whatever the leader's
    own wall clock says (here two minutes ahead)."""
    import psycopg

    url = pg_cluster.new_database()
    with fleet_server(config(url), env={CLOCK_OFFSET_ENV: "120"}) as srv:
        wait_for(lambda: leading(srv), "it leads")
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT expires_at - EXTRACT(EPOCH FROM clock_timestamp()) FROM leadership"
            ).fetchone()
    assert row is not None
    assert 0 < float(row[0]) <= 6.5, row
