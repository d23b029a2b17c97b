"""A fleet of agents reconnecting to a restarted `llmgw-server`, over real gRPC.

    python benchmarks/agent_reconnect.py [--agents 200] [--workers 4] [--json]
                                         [--restarts term,kill,kill:10]

One real `llmgw-server` process in control-plane mode (its one model has 0 replicas,
so nothing is ever placed) on 127.0.0.1, and N in-process agents
(`llmgw.agent.agent.Agent`, the code `llmgw-agent` runs, with the production
reconnect settings: full-jitter exponential backoff from 0.5 s, at most 30 s) spread
over a few worker processes of this script, each agent with its own gRPC channel and
stream, 8 pretended GPUs and no engines. The server runs the default control timings
(heartbeat 5 s, settle 10 s, unreachable 15 s).

Phases:

1. *connect*: all agents start at once (a first connect has no delay); time until the
   server lists all of them, from the workers' start.
2. *steady*: `--steady` seconds with everyone heartbeating; the server's mean CPU.
3. *restart*, once per `--restarts` entry ``HOW[:DOWN]``: the server is stopped
   (``term``: SIGTERM, it drains and ends every stream; ``kill``: SIGKILL, the kernel
   resets the connections), DOWN seconds pass (default 0: a supervisor restarting it
   at once; ``kill:10`` is an outage, during which the agents' backoff grows), and a
   new server starts on the same ports.
   Measured from the stop: when each node re-registered (its ``since`` in
   ``/api/v1/nodes``, polled every 0.5 s until all are back), the percentiles and a
   histogram of those times (the spread is the jitter), and how many came back
   after the new server's *settle* window (their replicas would not have been
   adopted but stopped and placed again). Server CPU is utime + stime of its pid
   from ``/proc/<pid>/stat`` sampled every 100 ms; the peak is the busiest 1 s
   window after the new server answered ``/healthz`` (its start-up imports, before,
   are reported apart).

Loopback only, bounded in agents (at most 2,000) and time (every wait has a
deadline); every process is stopped and the state directory removed on exit,
Ctrl-C and SIGTERM included. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c

MAX_AGENTS = 2000
HIST_BARS = 24  # at most this many histogram bars, of 0.5, 1, 2, 5 or 10 s each
NODE_PREFIX = "bench-"

CONFIG = """
listen = "127.0.0.1:{listen}"
admin_listen = "127.0.0.1:{admin}"
agent_listen = "127.0.0.1:{agent}"

[store]
url = ""

[[models]]
name = "idle"
replicas = 0

[[models.profiles]]
name = "sim"
engine = "sim"
weights = "sim"
"""


# -- the worker: N agents in one trio run --------------------------------------------------


async def run_agents(server: str, first: int, count: int, state_root: Path, gpus: str) -> None:
    from llmgw.agent.agent import Agent, NodeSettings
    from llmgw.transport.grpc import GrpcConnector

    async with trio.open_nursery() as nursery:
        for i in range(first, first + count):
            node_id = f"{NODE_PREFIX}{i:04d}"
            agent = Agent(
                GrpcConnector(server, node_id=node_id),
                NodeSettings(
                    node_id=node_id, address="127.0.0.1", hostname=node_id, fake_gpus=gpus
                ),
                state_dir=state_root / node_id,
                adapters={},  # no engines: nothing to probe, nothing to launch
            )
            nursery.start_soon(agent.run)


def worker_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run_agents, args.server, args.first, args.count, Path(args.state), args.gpus)


# -- measuring -----------------------------------------------------------------------------


class CpuSampler:
    """utime + stime of one pid every `interval`, in a thread: (wall time, CPU seconds)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), c.cpu_seconds(self.pid)))
            except (OSError, ValueError, IndexError):
                return  # the process is gone
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, t0: float, t1: float) -> float:
        """CPU seconds used between two wall times (nearest samples)."""
        times = [t for t, _ in self.samples]
        i = max(0, bisect.bisect_left(times, t0) - 1)
        j = min(len(times) - 1, bisect.bisect_left(times, t1))
        return self.samples[j][1] - self.samples[i][1] if j > i else 0.0

    def peak(self, after: float, window: float = 1.0) -> tuple[float, float] | None:
        """The busiest `window` after wall time `after`: (CPU share of one core, start)."""
        best: tuple[float, float] | None = None
        s = [x for x in self.samples if x[0] >= after]
        j = 0
        for i in range(len(s)):
            while j < len(s) and s[j][0] - s[i][0] < window:
                j += 1
            if j >= len(s):
                break
            share = (s[j][1] - s[i][1]) / (s[j][0] - s[i][0])
            if best is None or share > best[0]:
                best = (share, s[i][0])
        return best


def nodes(admin: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{admin}/api/v1/nodes", timeout=10, trust_env=False)
    r.raise_for_status()
    return [n for n in r.json()["nodes"] if n["id"].startswith(NODE_PREFIX)]


def wait_all(admin: str, count: int, timeout: float, poll: float = 0.5) -> list[dict[str, Any]]:
    """Poll until `count` agents are registered and connected; their node views."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            found = [n for n in nodes(admin) if n["connected"] and n["state"] == "ready"]
            seen = len(found)
            if seen >= count:
                return found
        time.sleep(poll)
    raise TimeoutError(f"only {seen} of {count} agents registered after {timeout:g}s")


def percentiles(values: list[float]) -> dict[str, float]:
    xs = sorted(values)

    def q(p: float) -> float:
        k = (len(xs) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {
        "min": xs[0],
        "p10": q(0.10),
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "max": xs[-1],
        "mean": statistics.fmean(xs),
        "stdev": statistics.pstdev(xs),
    }


def histogram(values: list[float]) -> list[tuple[float, float, int]]:
    """(bin start, bin end, count) from the first non-empty bin to the last."""
    low, high = min(values), max(values)
    width = next((w for w in (0.5, 1, 2, 5) if (high - low) / w < HIST_BARS), 10)
    first = math.floor(low / width)
    bins = [0] * (math.floor(high / width) - first + 1)
    for v in values:
        bins[math.floor(v / width) - first] += 1
    return [((first + i) * width, (first + i + 1) * width, n) for i, n in enumerate(bins)]


# -- the run -------------------------------------------------------------------------------


class Bench:
    def __init__(self, fleet: c.Fleet, args: argparse.Namespace, state: Path) -> None:
        from llmgw import config as cfg
        from llmgw.assembly import control_timings

        self.fleet = fleet
        self.args = args
        self.state = state
        # Fixed for the run (held, so nothing takes them while the server is down): every
        # restart binds the same ones, and the agents reconnect to the same address.
        self.ports = {name: fleet.reserve_port() for name in ("listen", "admin", "agent")}
        self.admin = f"http://127.0.0.1:{self.ports['admin']}"
        self.config = state / "llmgw.toml"
        self.config.write_text(CONFIG.format(**self.ports))
        timings = control_timings(cfg.load(path=self.config).control)
        self.heartbeat, self.settle = timings.heartbeat, timings.settle
        self.server: c.Proc | None = None
        self.workers: list[c.Proc] = []

    def start_server(self, name: str) -> tuple[c.Proc, CpuSampler, float, float]:
        """A new server; (process, its CPU sampler, spawn time, time /healthz answered)."""
        spawned = time.time()
        proc = c.Proc(
            [str(c.BIN / "llmgw-server"), "--config", str(self.config)],
            self.fleet.logdir / f"{name}.log",
        )
        self.fleet.procs.append(proc)
        sampler = CpuSampler(proc.pid)
        proc.wait_http(f"{self.admin}/healthz")
        self.server = proc
        return proc, sampler, spawned, time.time()

    def start_workers(self) -> None:
        n, w = self.args.agents, max(1, min(self.args.workers, self.args.agents))
        per = [n // w + (1 if i < n % w else 0) for i in range(w)]
        first = 0
        for i, count in enumerate(per):
            argv = [
                sys.executable, __file__, "--worker",
                "--server", f"127.0.0.1:{self.ports['agent']}",
                "--first", str(first), "--count", str(count),
                "--state", str(self.state / "agents"), "--gpus", self.args.gpus,
            ]  # fmt: skip
            proc = c.Proc(argv, self.fleet.logdir / f"worker-{i}.log")
            self.fleet.procs.insert(0, proc)  # stopped after the servers
            self.workers.append(proc)
            first += count

    def check_workers(self) -> None:
        for w in self.workers:
            if w.popen.poll() is not None:
                raise RuntimeError(f"a worker exited with {w.popen.returncode}:\n{w.output(4000)}")

    def connect_phase(self) -> dict[str, Any]:
        _proc, sampler, spawned, up = self.start_server("server-0")
        t0 = time.time()
        self.start_workers()
        c.log(f"server up; started {self.args.agents} agents in {len(self.workers)} workers")
        found = wait_all(self.admin, self.args.agents, timeout=self.args.timeout)
        done = time.time()
        self.check_workers()
        times = [n["since"] - t0 for n in found]
        peak = sampler.peak(up)
        c.log(f"all {len(found)} registered, the last {max(times):.2f}s after the start")
        # Steady state: everyone heartbeating.
        time.sleep(self.args.steady)
        t1 = time.time()
        steady_cpu = sampler.cpu_between(t1 - self.args.steady, t1) / self.args.steady
        self.sampler = sampler
        return {
            "server_start_seconds": up - spawned,
            "all_registered_seconds": max(times),
            "seen_after_seconds": done - t0,
            "registration": percentiles(times),
            "peak_cpu": peak[0] if peak else None,
            "steady_cpu": steady_cpu,
            "steady_seconds": self.args.steady,
        }

    def restart_phase(self, how: str, down: float, index: int) -> dict[str, Any]:
        assert self.server is not None
        old = self.server
        c.log(f"restart {index} ({how}, down {down:g} s): stopping the server")
        stopped = time.time()
        sig = signal.SIGKILL if how == "kill" else signal.SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old.pid, sig)
        old.popen.wait(60)
        exited = time.time()
        self.sampler.stop()
        if down:
            time.sleep(down)
        _proc, sampler, spawned, up = self.start_server(f"server-{index}")
        self.sampler = sampler
        found = wait_all(self.admin, self.args.agents, timeout=self.args.timeout)
        seen = time.time()
        self.check_workers()
        since = [n["since"] for n in found]
        from_stop = [s - stopped for s in since]
        from_up = [s - up for s in since]
        last = max(since)
        peak = sampler.peak(up)
        startup_cpu = sampler.cpu_between(spawned, up)
        reconnect_cpu = sampler.cpu_between(up, last + 0.5)
        # Registered after the settle window (counted from when /healthz answered, a
        # little after the controller started): not adopted, had they run replicas.
        late = sum(1 for s in since if s - up > self.settle)
        c.log(
            f"all {len(found)} back {max(from_stop):.2f}s after the stop "
            f"({max(from_up):.2f}s after the new server was up)"
        )
        return {
            "how": how,
            "down": down,
            "old_exit_seconds": exited - stopped,
            "down_seconds": spawned - stopped,
            "server_start_seconds": up - spawned,
            "all_registered_from_stop": max(from_stop),
            "all_registered_from_up": max(from_up),
            "seen_after_seconds": seen - stopped,
            "from_stop": percentiles(from_stop),
            "from_up": percentiles(from_up),
            "histogram_from_stop": histogram(from_stop),
            "registered_after_settle": late,
            "settle_seconds": self.settle,
            "peak_cpu": peak[0] if peak else None,
            "peak_at_from_up": (peak[1] - up) if peak else None,
            "startup_cpu_seconds": startup_cpu,
            "reconnect_cpu_seconds": reconnect_cpu,
        }


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def report(result: dict[str, Any]) -> None:
    conn = result["connect"]
    n = result["agents"]
    rows = [
        [
            "connect (all at once)",
            fmt_s(conn["all_registered_seconds"]),
            " / ".join(f"{conn['registration'][k]:.2f}" for k in ("p10", "p50", "p90", "max")),
            "-",
            fmt_pct(conn["peak_cpu"]),
            "-",
        ]
    ]
    for r in result["restarts"]:
        p = r["from_stop"]
        rows.append(
            [
                f"restart ({r['how']}" + (f", {r['down']:g} s outage)" if r["down"] else ")"),
                fmt_s(r["all_registered_from_stop"]),
                " / ".join(f"{p[k]:.2f}" for k in ("p10", "p50", "p90", "max")),
                f"{r['registered_after_settle']} of {n}",
                fmt_pct(r["peak_cpu"]),
                f"{r['reconnect_cpu_seconds']:.2f} s",
            ]
        )
    c.print_table(
        f"{n} agents over gRPC, {result['workers']} worker processes; {result['machine']}; "
        f"llmgw {result['revision']}",
        [
            "phase",
            "all registered",
            "re-registered p10 / p50 / p90 / max (s)",
            f"after settle ({result['settle_seconds']:g} s)",
            "peak server CPU (1 s)",
            "server CPU to reconnect all",
        ],
        rows,
    )
    print(
        f"steady state: server CPU {fmt_pct(conn['steady_cpu'])} of a core with {n} agents "
        f"heartbeating every {result['heartbeat_seconds']:g} s "
        f"(mean over {conn['steady_seconds']:g} s); server start (spawn to /healthz) "
        f"{conn['server_start_seconds']:.2f} s"
    )
    for r in result["restarts"]:
        print(
            f"\nrestart ({r['how']}, down {r['down']:g} s): re-registration times from the stop "
            f"(old server exited after {r['old_exit_seconds']:.2f} s, new one answered "
            f"/healthz {r['down_seconds'] + r['server_start_seconds']:.2f} s after the stop; "
            f"its start-up took {r['startup_cpu_seconds']:.2f} s CPU)"
        )
        top = max(count for _, _, count in r["histogram_from_stop"]) or 1
        for start, end, count in r["histogram_from_stop"]:
            bar = "#" * max(1 if count else 0, round(40 * count / top))
            print(f"  {start:5.1f}-{end:<5.1f} s {count:4d} {bar}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--workers", type=int, default=4, help="agent processes (default 4)")
    p.add_argument(
        "--restarts",
        default="term,kill,kill:10",
        help="comma-separated HOW[:DOWN]: term (SIGTERM) or kill (SIGKILL), then DOWN "
        "seconds before the new server starts (default %(default)s)",
    )
    p.add_argument("--steady", type=float, default=6.0, help="steady-state seconds (default 6)")
    p.add_argument("--gpus", default="8x80GB", help="pretended GPUs per agent")
    p.add_argument("--timeout", type=float, default=60.0, help="bound on every wait")
    p.add_argument("--json", action="store_true", help="every number as JSON on stdout")
    # Worker mode (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    if not 1 <= args.agents <= MAX_AGENTS:
        p.error(f"--agents must be in 1..{MAX_AGENTS}")
    restarts: list[tuple[str, float]] = []
    for item in (r.strip() for r in args.restarts.split(",") if r.strip()):
        how, _, down = item.partition(":")
        try:
            seconds = float(down or 0)
        except ValueError:
            seconds = -1.0
        if how not in ("term", "kill") or not 0 <= seconds <= 60:
            p.error(f"--restarts: {item!r} is not term or kill, optionally :0..60 seconds")
        restarts.append((how, seconds))
    if len(restarts) > 5 or not 0 < args.steady <= 120 or args.timeout > 600:
        p.error("at most 5 restarts, --steady in (0, 120], --timeout at most 600")

    state = Path(tempfile.mkdtemp(prefix="llmgw-reconnect-"))
    try:
        with c.fleet() as fleet:
            bench = Bench(fleet, args, state)
            result: dict[str, Any] = {
                "agents": args.agents,
                "workers": max(1, min(args.workers, args.agents)),
                "machine": c.machine(),
                "revision": c.revision(),
                "heartbeat_seconds": bench.heartbeat,
                "settle_seconds": bench.settle,
                "connect": bench.connect_phase(),
                "restarts": [],
            }
            for i, (how, down) in enumerate(restarts, 1):
                result["restarts"].append(bench.restart_phase(how, down, i))
            bench.sampler.stop()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        report(result)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: everything was stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
