"""Failover between llmgw-server instances on one PostgreSQL (issue #20).

    python benchmarks/failover.py [--runs 5] [--leases 10s,4s] [--json]
                                  [--max-requests 400] [--agent-max-backoff 30s]
                                  [--workers 0] [--keep]

Each run, for each lease setting (runs interleaved: 10s, 4s, 10s, 4s, ... so drift of
the shared machine hits both alike), on a fresh database of one throwaway PostgreSQL
cluster (tests/pg_cluster.py, durable: fsync on, as the benchmarks run it):

* 3 ``llmgw-server`` instances with the configuration of tests/test_fleet_e2e.py's
  ``control_config`` (control pass every 200 ms, ``unreachable_after = "2s"``,
  ``lost_after = "5s"``, scrapes every 200 ms) plus the store and the lease under test
  (``control.lease``: absent for 10s, the default). Those short unreachable/lost
  timings are what the failover tests use: a killed node is noticed in seconds, and
  they set the controller's timings that a takeover waits on: heartbeat =
  min(5 s, unreachable_after / 3) = 0.67 s, settle = min(10 s, unreachable_after) =
  2 s after a term starts (a term after a takeover settles at least 5 s: agents
  looking for the new leader retry at least every 2 s). llmgw's default number of
  data-plane workers (``--workers``, LLMGW_WORKERS; 0: one per core);
* 2 ``llmgw-agent`` processes given all three servers (tests/procs.py's ``agent``,
  with the agent's own default reconnect backoff, at most ``--agent-max-backoff`` =
  30 s; with several servers it pauses at most 2 s between attempts), two fake 80 GB
  GPUs each;
* one model ``m`` with 2 replicas on ``llmgw-sim``.

It waits until that has settled (a leader, both replicas ready, every instance routing
to both), starts a client sending completions for ``m`` one at a time through the two
instances that do not lead (every 50 ms; at most ``--max-requests`` per run), then
kills the leader with SIGKILL and measures, from the kill:

* **leader**: until another instance reports ``llmgw_fleet_leading 1`` (both
  survivors' admin ``/metrics`` polled every 50 ms);
* **agents**: until the new leader's ``/api/v1/nodes`` shows both nodes ``ready``
  (the agents reconnected to it);
* **adopted**: until it lists both replicas of ``m`` ready with the ids they had
  (adopted, not placed anew);
* **1st cmd**: until its ``llmgw_fleet_commands_total{command="start"}`` rises above 0
  (a follower has issued none). After a takeover the new leader adopts what runs and
  has nothing to command, so the script makes a command due the moment it leads: it
  adds a runtime model ``added`` (1 replica) through the new leader's admin API
  (``POST /api/v1/models``) as soon as it reports leading. The first command is then
  that replica's StartShard, issued on the first pass after the term settles (or, if
  an agent was not back by then, a StartShard placing m anew: see extra starts);
* **added ready**: until that replica is ready (the StartShard reached an agent and
  its engine came up: the command was not only counted but carried out);
* **extra starts**: StartShard commands the new leader issued besides the added
  replica's (its start counter minus one): replicas of ``m`` placed anew because the
  agent running them was not back when the term settled. Then the script waits (at
  most 30 s) until the new leader lists only m's two original replicas again;
* **restarted**: engines of ``m`` whose pid changed or died (the agents' pid records
  and /proc, before the kill and after that wait): there must be none;
* **failed/sent**: requests through the surviving instances from the kill to the end
  of the run, and how many did not answer 200.

All on 127.0.0.1; bounded in count (runs at most 20, requests per run at most 2,000)
and time (every wait has a deadline; a run that misses one is reported, not hung).
Every process is stopped, and the cluster and the logs removed (``--keep`` keeps the
logs), on exit, Ctrl-C and SIGTERM included. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import httpx

import _common as c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.*

from llmgw import units

T = TypeVar("T")

MAX_RUNS = 20
MAX_REQUESTS = 2000
POLL = 0.05  # seconds between polls of the survivors
DEADLINE = 60.0  # seconds any one wait may take


ADDED = {
    "name": "added",
    "replicas": 1,
    "profiles": [{"name": "sim", "engine": "sim", "weights": "sim"}],
}

_LEADING = re.compile(r"^llmgw_fleet_leading (\S+)$", re.M)
_STARTS = re.compile(r'^llmgw_fleet_commands_total\{command="start"\} (\S+)$', re.M)


def config(url: str, lease: float | None) -> str:
    from tests.test_failover_e2e import MODEL
    from tests.test_fleet_e2e import control_config

    text = control_config([MODEL], extra=f'[store]\nurl = "{url}"\n')
    if lease is None:  # the default (10 s)
        return text
    return text.replace("[control]\n", f'[control]\nlease = "{units.format_duration(lease)}"\n')


def machine() -> str:
    """_common.machine() without its load average (read when called: here, the end;
    this script prints /proc/loadavg from its start and its end instead)."""
    return c.machine().split(", load average")[0]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Survivors:
    """Polls the instances that were not killed (one keep-alive client)."""

    def __init__(self) -> None:
        self.http = httpx.Client(timeout=2.0, trust_env=False)

    def close(self) -> None:
        self.http.close()

    def metrics(self, srv: Any) -> str:
        r = self.http.get(f"{srv.admin}/metrics")
        r.raise_for_status()
        return r.text

    def leading(self, srv: Any) -> bool:
        try:
            found = _LEADING.search(self.metrics(srv))
        except (httpx.HTTPError, OSError):
            return False
        return found is not None and float(found.group(1)) == 1.0

    def starts(self, srv: Any) -> float:
        found = _STARTS.search(self.metrics(srv))
        return 0.0 if found is None else float(found.group(1))

    def get(self, srv: Any, path: str) -> Any:
        r = self.http.get(f"{srv.admin}{path}")
        r.raise_for_status()
        return r.json()

    def add_model(self, srv: Any) -> httpx.Response | None:
        """POST the runtime model ``added`` to `srv`; None on a 503 (no leader yet)."""
        r = self.http.post(f"{srv.admin}/api/v1/models", json=ADDED)
        return None if r.status_code == 503 else r

    def nodes_ready(self, srv: Any) -> bool:
        nodes = self.get(srv, "/api/v1/nodes")["nodes"]
        return len(nodes) == 2 and all(n["state"] == "ready" for n in nodes)

    def listed(self, srv: Any, model: str) -> set[str]:
        """The ids of `model`'s replicas in any state but stopped."""
        return {
            r["id"]
            for r in self.get(srv, "/api/v1/replicas")["replicas"]
            if r["model"] == model and r["state"] != "stopped"
        }

    def ready(self, srv: Any, model: str, count: int) -> set[str]:
        """The ids of `model`'s ready replicas, or an empty set unless `count` of them."""
        found = {
            r["id"]
            for r in self.get(srv, "/api/v1/replicas")["replicas"]
            if r["model"] == model
            and r["state"] == "ready"
            and all(n["shard_state"] == "ready" for n in r["nodes"])
        }
        return found if len(found) == count else set()


class Load:
    """Completions for ``m`` through `servers` in turn, one at a time every POLL seconds,
    until stopped (at most `limit` requests); each answer recorded."""

    def __init__(self, servers: list[Any], limit: int) -> None:
        self.servers = servers
        self.limit = limit
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def sent(self) -> int:
        return self.ok + len(self.failed)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=10.0, trust_env=False) as client:
            i = 0
            while not self._stop.is_set() and i < self.limit:
                srv = self.servers[i % len(self.servers)]
                i += 1
                try:
                    r = client.post(
                        f"{srv.base}/v1/completions",
                        json={"model": "m", "prompt": "hi", "max_tokens": 2},
                    )
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{srv.base}: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failed.append(f"{srv.base}: {type(exc).__name__}: {exc}")
                self._stop.wait(POLL)


def poll(check: Callable[[], T | None], what: str, timeout: float = DEADLINE) -> T:
    """`check()` every POLL seconds until truthy (HTTP errors count as not yet)."""
    from tests.waiting import TRANSIENT, wait_for

    return wait_for(
        check, what, timeout, interval=POLL, transient=(*TRANSIENT, ValueError, KeyError)
    )


def one_run(url: str, lease: float | None, args: argparse.Namespace) -> dict[str, Any]:
    from tests.procs import FleetServer, agent, alive, fleet_server
    from tests.waiting import wait_for

    out: dict[str, Any] = {"errors": []}
    text = config(url, lease)
    watch = Survivors()
    with ExitStack() as stack:
        stack.callback(watch.close)
        servers = [stack.enter_context(fleet_server(text)) for _ in range(3)]
        every = ",".join(s.agent_address for s in servers)
        agents = [
            stack.enter_context(
                agent(
                    every,
                    f"n{i}",
                    address=f"127.0.0.{171 + i}",  # no test uses these
                    gpus="2x80GB",
                    max_backoff=args.agent_max_backoff,
                )
            )
            for i in range(2)
        ]
        leader = wait_for(lambda: [s for s in servers if watch.leading(s)], "a leader", 60)[0]
        replicas = wait_for(lambda: watch.ready(leader, "m", 2), "two replicas ready", 60)
        for s in servers:

            def routes(s: FleetServer = s) -> bool:
                return len(s.endpoints()) == 2

            wait_for(routes, f"{s.base} routes to both", 30)
        survivors = [s for s in servers if s is not leader]

        def engines() -> dict[str, int]:
            return {n: pid for a in agents for n, pid in a.engines().items()}

        def two_engines() -> dict[str, int] | None:
            found = engines()
            return found if len(found) == 2 else None

        before = wait_for(two_engines, "two engine pids", 10)
        with Load(survivors, args.max_requests) as load:
            wait_for(lambda: load.ok >= 10, "requests flowing", 30)
            sent_before, failed_before = load.sent, len(load.failed)
            leader.proc.kill(signal.SIGKILL)
            killed = time.monotonic()

            def since() -> float:
                return round(time.monotonic() - killed, 3)

            try:
                new = poll(
                    lambda: next((s for s in survivors if watch.leading(s)), None), "a new leader"
                )
                out["leader"] = since()
                r = poll(lambda: watch.add_model(new), "the model added")
                out["added_posted"] = since()
                if r.status_code != 201:
                    out["errors"].append(f"POST /api/v1/models: {r.status_code} {r.text[:200]}")
                pending = {"agents", "adopted", "first_cmd", "added_ready"}
                deadline = time.monotonic() + DEADLINE
                while pending and time.monotonic() < deadline:
                    checks: dict[str, Callable[[], bool]] = {
                        "agents": lambda: watch.nodes_ready(new),
                        "adopted": lambda: watch.ready(new, "m", 2) == replicas,
                        "first_cmd": lambda: watch.starts(new) > 0,
                        "added_ready": lambda: bool(watch.ready(new, "added", 1)),
                    }
                    for key in sorted(pending):
                        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
                            if checks[key]():
                                out[key] = since()
                                pending.discard(key)
                    time.sleep(POLL)
                for key in sorted(pending):
                    out["errors"].append(f"{key}: not within {DEADLINE:g}s")
                    if key == "adopted":
                        with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
                            seen = watch.get(new, "/api/v1/replicas")["replicas"]
                            out["errors"].append(f"replicas: {seen}")
                # One StartShard expected (the added replica's): more means it placed
                # replicas of m anew (agents back after its settle); then wait until it
                # has only m's original two again, so what it stopped is seen below.
                with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
                    out["extra_starts"] = int(watch.starts(new)) - 1
                    if out["extra_starts"]:
                        out["errors"].append(
                            f"{out['extra_starts']} StartShard commands besides the added "
                            f"replica's: {sorted(watch.listed(new, 'm'))} listed for m"
                        )
                try:
                    poll(lambda: watch.listed(new, "m") == replicas, "m back to its two", 30)
                except TimeoutError as exc:
                    out["errors"].append(str(exc))
            except TimeoutError as exc:
                out["errors"].append(str(exc))
        out["sent"] = load.sent - sent_before
        out["failed"] = len(load.failed) - failed_before
        out["failures"] = load.failed[failed_before:][:5]
        if failed_before:
            out["errors"].append(f"{failed_before} requests failed before the kill")
        after = engines()
        out["restarted"] = sum(
            1 for name, pid in before.items() if after.get(name) != pid or not alive(pid)
        )
        out["engines"] = {"before": before, "after": after}
    return out


# -- output ----------------------------------------------------------------------------------

COLUMNS = ("leader", "agents", "adopted", "first_cmd", "added_ready")
HEADS = ("run", "leader s", "agents s", "adopted s", "1st cmd s", "added ready s")


def cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(label: str, runs: list[dict[str, Any]]) -> None:
    rows = []
    for i, r in enumerate(runs, 1):
        rows.append(
            [
                str(i),
                *(cell(r.get(k)) for k in COLUMNS),
                str(r.get("extra_starts", "-")),
                str(r.get("restarted", "-")),
                f"{r.get('failed', '-')}/{r.get('sent', '-')}",
            ]
        )
    for name, fn in (("median", statistics.median), ("max", max)):
        row = [name]
        for k in COLUMNS:
            values = [r[k] for r in runs if r.get(k) is not None]
            row.append(cell(fn(values)) if values else "-")
        for k in ("extra_starts", "restarted"):
            total = sum(r.get(k, 0) for r in runs)
            row.append(f"{total} in all" if name == "max" else "")
        failed = sum(r.get("failed", 0) for r in runs)
        sent = sum(r.get("sent", 0) for r in runs)
        row.append(f"{failed}/{sent} in all" if name == "max" else "")
        rows.append(row)
    c.print_table(label, [*HEADS, "extra starts", "engines restarted", "failed/sent"], rows)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--leases", default="10s,4s", help="control.lease settings (10s: the default, unset)"
    )
    parser.add_argument("--max-requests", type=int, default=400, help="per run")
    parser.add_argument("--agent-max-backoff", default="30s", help="the agent's own default")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="data-plane workers per instance (LLMGW_WORKERS; 0, llmgw's default: one per core)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    args = parser.parse_args()
    args.runs = max(1, min(MAX_RUNS, args.runs))
    args.max_requests = max(20, min(MAX_REQUESTS, args.max_requests))
    leases = [float(units.parse_duration(x)) for x in args.leases.split(",")]

    os.environ["LLMGW_WORKERS"] = str(args.workers)  # the instances inherit it
    import tests.procs
    from tests.pg_cluster import TempCluster

    scratch = Path(tempfile.mkdtemp(prefix="llmgw-failover-"))
    tests.procs.SCRATCH = scratch
    load_start = loadavg()
    started = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {units.format_duration(x): [] for x in leases}
    with contextlib.ExitStack() as stack:
        signal.signal(signal.SIGTERM, _interrupt)  # stop everything as on Ctrl-C
        if args.keep:
            c.log(f"logs in {scratch}")
        else:
            stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        cluster = TempCluster(fast=False).start()
        stack.callback(cluster.stop)
        for i in range(args.runs):
            for lease in leases:
                name = units.format_duration(lease)
                c.log(f"run {i + 1}/{args.runs}, lease {name}")
                result = one_run(cluster.new_database(), None if lease == 10.0 else lease, args)
                c.log(
                    "  "
                    + ", ".join(f"{k} {cell(result.get(k))}" for k in COLUMNS)
                    + f", extra starts {result.get('extra_starts', '-')}"
                    + f", restarted {result['restarted']}, failed {result['failed']}"
                    + f"/{result['sent']}"
                    + "".join(f"\n  ! {e}" for e in result["errors"])
                )
                results[name].append(result)
    load_end = loadavg()
    elapsed = time.monotonic() - started

    if args.json:
        print(
            json.dumps(
                {
                    "revision": c.revision(),
                    "machine": machine(),
                    "loadavg": {"start": load_start, "end": load_end},
                    "runs": results,
                },
                indent=2,
            )
        )
        return
    print(
        f"failover  llmgw {c.revision()}  {machine()}\n"
        f"load average (1/5/15 min) at start {load_start}, at end {load_end}; "
        f"{args.runs} runs per lease in {elapsed:.0f} s\n"
        f"3 instances ({args.workers or 'one per core'} worker(s) each), 2 agents (reconnect "
        f"backoff at most {args.agent_max_backoff}, 2s while looking for the leader), model m "
        "x2 on llmgw-sim; control_config: unreachable 2s, lost 5s -> heartbeat 0.67s, a "
        "term settles 5s; seconds from SIGKILL "
        f"of the leader; survivors polled every {POLL * 1000:.0f} ms\n"
    )
    for name, runs in results.items():
        table(
            f"control.lease = {name} (renewed every {cell(units.parse_duration(name) / 3)} s)", runs
        )
    errors = [
        (n, i, e) for n, runs in results.items() for i, r in enumerate(runs, 1) for e in r["errors"]
    ]
    failures = [
        (n, i, f)
        for n, runs in results.items()
        for i, r in enumerate(runs, 1)
        for f in r["failures"]
    ]
    for n, i, e in errors:
        print(f"lease {n} run {i}: {e}")
    for n, i, f in failures:
        print(f"lease {n} run {i}: request failed: {f}")


if __name__ == "__main__":
    main()
