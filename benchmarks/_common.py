"""Shared helpers of the router benchmarks (router_overhead.py, routing_quality.py).

* processes: simulators and the router on loopback ports of their own (port 0, read
  back from their ready files), always stopped on exit (normal return, exception,
  Ctrl-C, SIGTERM, and an atexit backstop);
* the peer routers of benchmarks/.venv-peers (setup_peers.sh): vllm-router and
  sglang-router started with a policy, on held loopback ports, sglang-router kept off
  the network (HF_ENDPOINT at a refused loopback port, HF_HOME of the run);
* a client-side round-robin transport (the "direct" baseline);
* interleaved turns A, B, A, B with a hook before and after each turn, one
  warm client per target;
* /proc readers (CPU seconds, RSS) and Prometheus text scraping;
* statistics for side-by-side reporting (mean difference with a 95% interval);
* tables printed with rich when it is importable, plain text otherwise.

Nothing here asserts: the scripts print what they measured next to the targets.
Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llmgw import bench
from llmgw.bench.transport import FastTransport
from llmgw.testing.procs import LOOPBACK, Proc, reserve_port

BIN = Path(sys.executable).parent


# -- processes ---------------------------------------------------------------------------


class Fleet:
    """Every process a benchmark started; `close()` stops them all (idempotent)."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
        self._ports = contextlib.ExitStack()
        self._closed = False
        atexit.register(self.close)

    def reserve_port(self) -> int:
        """A loopback port held until `close()` (llmgw.testing.procs.reserve_port), for a
        program that must be told its port (llama-server, a server restarted in place)."""
        return self._ports.enter_context(reserve_port())

    def start(
        self,
        program: str,
        *args: str,
        name: str,
        health: str | None = None,
        env: dict[str, str] | None = None,
        ready: bool = False,
    ) -> Proc:
        """Start `program`; with `ready`, pass it ``--ready-file`` and wait for that
        (``proc.ready`` holds the bound addresses); then wait for `health` if given."""
        argv = [str(BIN / program), *args]
        ready_file = self.logdir / f"{name}.ready.json"
        if ready:
            argv += ["--ready-file", str(ready_file)]
        proc = Proc(argv, self.logdir / f"{name}.log", env)
        self.procs.append(proc)
        if ready:
            proc.wait_ready_file(ready_file, timeout=30.0)
        if health is not None:
            proc.wait_http(health, timeout=30.0)
        return proc

    def sim(self, name: str, *args: str, model: str) -> tuple[Proc, str]:
        argv = ["--host", LOOPBACK, "--port", "0", "--model", model, *args]
        proc = self.start("llmgw-sim", *argv, name=name, ready=True)
        return proc, proc.url()

    def router(
        self,
        endpoints: Sequence[tuple[str, str, str]],
        config: str | None = None,
        name: str = "llmgw-server",
        src: Path | None = None,
    ) -> RouterProc:
        """An llmgw-server in front of `endpoints` (id, url, model); `name` names its
        log, ready and config files (several routers in one fleet need their own).
        With `src`, llmgw is imported from that source tree (another checkout's
        ``src``, to run two revisions side by side) instead of the installed one."""
        argv = ["--listen", f"{LOOPBACK}:0", "--admin-listen", f"{LOOPBACK}:0"]
        if config is not None:
            path = self.logdir / f"{name}.toml"
            path.write_text(config)
            argv += ["--config", str(path)]
        for ident, url, model in endpoints:
            argv += ["--endpoint", f"{ident}={url}={model}"]
        # The router alone, unless `config` names a store: without this it would open the
        # default one (SQLite in the working directory) and record usage.
        env = {} if config is not None and "[store]" in config else {"LLMGW_STORE__URL": ""}
        if src is not None:
            env["PYTHONPATH"] = str(src)
        proc = self.start("llmgw-server", *argv, name=name, env=env, ready=True)
        return RouterProc(proc, proc.url("listen"), proc.url("admin_listen"))

    def stop(self, procs: Sequence[Proc]) -> None:
        """Stop these processes now, in the order given (routers before their engines),
        and forget them."""
        for proc in procs:
            if proc in self.procs:
                self.procs.remove(proc)
                proc.stop(5.0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Router first, so it does not log every simulator going away.
        try:
            for proc in reversed(self.procs):
                proc.stop(5.0)
        finally:
            self._ports.close()


@contextlib.contextmanager
def fleet(factory: Callable[[], Fleet] = Fleet) -> Iterator[Fleet]:
    """A Fleet that is closed however the block ends; SIGTERM acts like Ctrl-C."""

    def on_term(signum: int, frame: Any) -> None:
        # Whatever handles Ctrl-C now (trio's handler while trio runs, which delivers
        # KeyboardInterrupt at a safe point; Python's default otherwise) handles this too.
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    f = factory()
    try:
        yield f
    finally:
        # A second Ctrl-C while stopping must not leave orphans.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            f.close()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)


@attrs.define
class RouterProc:
    proc: Proc
    base: str
    admin: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def endpoints(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.admin}/api/v1/endpoints", timeout=5, trust_env=False)
        r.raise_for_status()
        return list(r.json()["endpoints"])

    def wait_scraped(self, timeout: float = 15.0) -> None:
        """Until every endpoint has been scraped once (the router then scores on data)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(e.get("engine") is not None for e in self.endpoints()):
                return
            time.sleep(0.1)
        raise TimeoutError(f"router endpoints not scraped after {timeout:g}s")


# -- peer routers (benchmarks/.venv-peers, made by setup_peers.sh) ---------------------------

PEERS_VENV = Path(__file__).resolve().parent / ".venv-peers"


@attrs.define
class PeerRouter:
    """A vllm-router or sglang-router process in front of some replicas."""

    name: str
    kind: str  # "vllm-router" | "sglang-router"
    policy: str
    base: str
    proc: Proc
    metrics_url: str
    # The command line as printed (ports this run happened to get replaced by names).
    flags: str

    @property
    def pid(self) -> int:
        return self.proc.pid


def peer_binary(name: str, venv: Path = PEERS_VENV) -> Path | None:
    """`name` (vllm-router, sglang-router) in the peers' venv, or None when not installed."""
    path = venv / "bin" / name
    return path if path.exists() else None


def peer_version(dist: str, venv: Path = PEERS_VENV) -> str:
    """The installed version of distribution `dist` in the peers' venv ("?" if unknown)."""
    try:
        out = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                f"import importlib.metadata as m; print(m.version({dist!r}))",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def _peer_flags(argv: Sequence[str], ports: dict[int, str]) -> str:
    shown = {str(port): label for port, label in ports.items()}
    urls = sum(1 for a in argv if a.startswith("http://"))
    return " ".join(shown.get(a, a) for a in argv[1:] if not a.startswith("http://")).replace(
        "--worker-urls", "--worker-urls " + " ".join(f"URL{i + 1}" for i in range(urls))
    )


def start_vllm_router(
    fleet: Fleet,
    binary: Path,
    bases: Sequence[str],
    policy: str,
    name: str | None = None,
    timeout: float = 60.0,
) -> PeerRouter:
    """PyPI's vllm-router in front of `bases` with `policy` and its defaults otherwise
    (router_overhead.py's flags: loopback listeners, a Prometheus port, warnings only,
    a 1 s look at the replicas while starting). RuntimeError or TimeoutError (the
    process stopped) when its /health does not answer within `timeout`."""
    # It cannot report a port it picked: it is given held ones (it binds with
    # SO_REUSEADDR, as Rust's std does on Unix).
    port, metrics_port = fleet.reserve_port(), fleet.reserve_port()
    argv = [
        str(binary),
        "--host", LOOPBACK,
        "--port", str(port),
        "--worker-urls", *bases,
        "--policy", policy,
        "--prometheus-host", LOOPBACK,
        "--prometheus-port", str(metrics_port),
        "--log-level", "warning",
        "--worker-startup-check-interval", "1",
        "--worker-startup-timeout-secs", str(int(timeout)),
    ]  # fmt: skip
    name = name or f"vllm-router-{policy}"
    proc = Proc(argv, fleet.logdir / f"{name}.log")
    fleet.procs.append(proc)
    base = f"http://{LOOPBACK}:{port}"
    try:
        proc.wait_http(f"{base}/health", timeout=timeout)
    except (RuntimeError, TimeoutError):
        fleet.stop([proc])
        raise
    return PeerRouter(
        f"vllm-router {policy}",
        "vllm-router",
        policy,
        base,
        proc,
        f"http://{LOOPBACK}:{metrics_port}/metrics",
        _peer_flags(argv, {port: "PORT", metrics_port: "PORT2"}),
    )


def start_sglang_router(
    fleet: Fleet,
    binary: Path,
    bases: Sequence[str],
    policy: str,
    name: str | None = None,
    timeout: float = 60.0,
) -> PeerRouter:
    """PyPI's sglang-router (`sglang-router launch`) in front of `bases`, started like
    start_vllm_router; RuntimeError when it has not taken every replica within `timeout`.

    It loads a tokenizer for each worker's model from the Hugging Face hub (unused by
    its HTTP router): HF_ENDPOINT is a held loopback port here, which refuses, and
    HF_HOME a directory of this run, so no traffic leaves 127.0.0.1 and no token of the
    user's is read (as in router_overhead.py)."""
    port, metrics_port, hub_port = fleet.reserve_port(), fleet.reserve_port(), fleet.reserve_port()
    argv = [
        str(binary), "launch",
        "--host", LOOPBACK,
        "--port", str(port),
        "--worker-urls", *bases,
        "--policy", policy,
        "--prometheus-host", LOOPBACK,
        "--prometheus-port", str(metrics_port),
        "--log-level", "warn",
        "--worker-startup-check-interval", "1",
        "--worker-startup-timeout-secs", str(int(timeout)),
    ]  # fmt: skip
    hub_home = fleet.logdir / "sglang-hf-home"
    env = {"HF_ENDPOINT": f"http://{LOOPBACK}:{hub_port}", "HF_HOME": str(hub_home)}
    name = name or f"sglang-router-{policy}"
    proc = Proc(argv, fleet.logdir / f"{name}.log", env)
    fleet.procs.append(proc)
    base = f"http://{LOOPBACK}:{port}"
    # /health answers before any worker is registered; /readiness counts them.
    deadline = time.monotonic() + timeout
    healthy = 0
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            break
        try:
            r = httpx.get(f"{base}/readiness", timeout=2, trust_env=False)
            healthy = int(r.json().get("healthy_workers", 0)) if r.status_code == 200 else 0
        except (httpx.HTTPError, ValueError):
            healthy = 0
        if healthy == len(bases):
            break
        time.sleep(0.1)
    if healthy != len(bases):
        output = proc.output(2000)
        fleet.stop([proc])
        raise RuntimeError(
            f"sglang-router ({policy}) took {healthy} of {len(bases)} replicas in "
            f"{timeout:g} s; its log {proc.log}:\n{output}"
        )
    flags = _peer_flags(argv, {port: "PORT", metrics_port: "PORT2"})
    flags += f"; env HF_ENDPOINT=http://{LOOPBACK}:PORT3 (refused) HF_HOME=RUNDIR/{hub_home.name}"
    return PeerRouter(
        f"sglang-router {policy}",
        "sglang-router",
        policy,
        base,
        proc,
        f"http://{LOOPBACK}:{metrics_port}/metrics",
        flags,
    )


def cpu_seconds_tree(pid: int) -> float:
    """cpu_seconds of `pid` plus those of its live direct children (a launcher that
    runs the server in a child process is counted whole)."""
    total = cpu_seconds(pid)
    for child in children_of(pid):
        with contextlib.suppress(OSError, ValueError):
            total += cpu_seconds(child)
    return total


def children_of(pid: int) -> list[int]:
    """Direct child processes of `pid` (from /proc; empty when unknown)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                out += [int(x) for x in text.split()]
    return out


# -- /proc --------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name may contain spaces and parentheses: fields follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    # After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes_tree(pid: int) -> int:
    """rss_bytes of `pid` plus those of its live direct children (llmgw's workers)."""
    total = rss_bytes(pid)
    for child in children_of(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += rss_bytes(child)
    return total


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def cpu_first(pid: int, nice: int = -10) -> Iterator[str | None]:
    """Give process `pid` the CPU before the benchmark's other processes while the
    block runs, as a gateway on reserved cores would have it; yields what was done,
    or None when not permitted (it needs root or CAP_SYS_NICE).

    Each process here runs in its own session, and with Linux's autogroup scheduling
    (on by default) a session's group competes as a whole: a process's own nice value
    then only ranks it inside its group. So the group's nice is raised too."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    try:
        before = os.getpriority(os.PRIO_PROCESS, pid)
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        yield None
        return
    group_before: str | None = None
    try:
        group_before = autogroup.read_text().split("nice")[-1].strip()
        autogroup.write_text(str(nice))
    except OSError:
        group_before = None
    try:
        yield f"nice {nice}" + (f", autogroup nice {nice}" if group_before is not None else "")
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, before)
            if group_before is not None:
                autogroup.write_text(group_before)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user]
    total = sum(fields[:8])
    idle = fields[3] + fields[4]
    return (total - idle) / _TICKS, total / _TICKS


def busy_fraction(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Share of all cores busy between two machine_cpu() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else None


def clock_tick() -> float:
    """Resolution of cpu_seconds (usually 10 ms)."""
    return 1.0 / _TICKS


# -- Prometheus text --------------------------------------------------------------------------


def scrape(url: str, names: Sequence[str]) -> dict[str, float]:
    """The sum over all label sets of each named sample in `url`'s metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(names, 0.0)
    text = httpx.get(url, timeout=5, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def scrape_by_label(url: str, name: str, label: str) -> dict[str, float]:
    """Sample `name` in `url`'s metrics summed per value of `label` (e.g. per endpoint)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    text = httpx.get(url, timeout=5, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                out[key] = out.get(key, 0.0) + sample.value
    return out


# -- client-side round robin ----------------------------------------------------------------


class RoundRobinTransport(httpx.AsyncBaseTransport):
    """Sends each request to the next base URL in turn (what a plain L4/L7 balancer does).

    The target URL's scheme, host and port are replaced; the path is kept. Connections
    are pooled per replica by the wrapped transport.
    """

    def __init__(self, bases: Sequence[str], inner: httpx.AsyncBaseTransport) -> None:
        self.urls = [httpx.URL(b) for b in bases]
        self.inner = inner
        self._next = itertools.cycle(range(len(self.urls)))
        self.sent = [0] * len(self.urls)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        i = next(self._next)
        self.sent[i] += 1
        u = self.urls[i]
        request.url = request.url.copy_with(scheme=u.scheme, host=u.host, port=u.port)
        request.headers["host"] = f"{u.host}:{u.port}"
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def pooled_transport(concurrency: int) -> httpx.AsyncBaseTransport:
    """The load generator's transport for `concurrency` workers: llmgw.bench's
    FastTransport (O(1) keep-alive pool, about half the CPU of httpx's own)."""
    return FastTransport(concurrency=concurrency)


# -- interleaved turns ------------------------------------------------------------------------


@attrs.define
class Turn:
    """One run of one target in one round, with what the hooks measured around it."""

    round: int
    target: str
    result: bench.BenchResult
    extra: dict[str, Any] = attrs.field(factory=dict)


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value


async def interleave(
    targets: Sequence[tuple[bench.Target, httpx.AsyncBaseTransport]],
    config: bench.LoadConfig,
    *,
    rounds: int,
    warm_requests: int = 0,
    before: Callable[[int, bench.Target], Any] | None = None,
    after: Callable[[int, bench.Target, bench.BenchResult], Any] | None = None,
    rotate: bool = False,
) -> list[list[bench.BenchResult]]:
    """Targets A, B, A, B, ... for `rounds` rounds; per target the list of its turns.
    With `rotate` each round starts one target later (A B C, B C A, C A B, ...): with
    three targets a fixed order would always give the same one the turn right after
    the warm-up, or after the same neighbour.

    Like `bench.run_interleaved` (same prompt indices for every target within a round,
    fresh indices each round), but each target keeps its own client (its transport may
    be a round robin over several replicas; the client closes it at the end), an
    unmeasured warm-up of `warm_requests` requests per target comes first (prompt
    indices far from the measured ones), and `before`/`after` run around every
    measured turn (synchronous or async), e.g. to read a process's CPU time.
    """
    per_target: list[list[bench.BenchResult]] = [[] for _ in targets]
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(bench.runner.open_client(config, transport))
            for _, transport in targets
        ]
        if warm_requests:
            warm = attrs.evolve(
                config, requests=warm_requests, duration=15.0, start_index=50_000_000
            )
            for client, (target, _) in zip(clients, targets, strict=True):
                await bench.run_with_client(client, target, warm)
        start_index = config.start_index
        for r in range(rounds):
            step = attrs.evolve(config, start_index=start_index)
            used = 0
            n = len(targets)
            for i in [(r + j) % n for j in range(n)] if rotate else range(n):
                target = targets[i][0]
                if before is not None:
                    await _maybe_await(before(r, target))
                result = await bench.run_with_client(clients[i], target, step)
                if after is not None:
                    await _maybe_await(after(r, target, result))
                per_target[i].append(result)
                used = max(used, len(result.samples))
            start_index += used
    return per_target


# -- statistics ------------------------------------------------------------------------------


def mean_diff(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """mean(b) - mean(a) and the half-width of its ~95% interval (Welch, normal approx)."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    va = math.fsum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = math.fsum((x - mb) ** 2 for x in b) / (len(b) - 1)
    return mb - ma, 1.96 * math.sqrt(va / len(a) + vb / len(b))


def ok_values(result: bench.BenchResult, what: str) -> list[float]:
    """e2e or ttft of the successful samples (seconds)."""
    out = []
    for s in result.samples:
        if s.ok:
            v = getattr(s, what)
            if v is not None:
                out.append(float(v))
    return out


# -- output ----------------------------------------------------------------------------------


def ms(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x * 1e3:.{digits}f}"


def dist_ms(d: bench.Dist | None, digits: int = 1) -> str:
    """p50 / p90 / p99 (mean) in milliseconds."""
    if d is None:
        return "-"
    return f"{d.p50 * 1e3:.{digits}f} / {d.p90 * 1e3:.{digits}f} / {d.p99 * 1e3:.{digits}f}"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table with rich when available, else aligned plain text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _plain_table(title, columns, rows)
        return
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    # Wide even when piped (README pastes), so that cells are not folded (router_overhead's
    # last table has six router columns).
    width = os.get_terminal_size().columns if sys.stdout.isatty() else 260
    Console(width=max(100, width)).print(table)


def _plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, name in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(title)
    print(line(columns))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print()


def log(message: str) -> None:
    """Progress on stderr, so --json output on stdout stays clean."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {sys.version.split()[0]}, "
        f"load average at start {load[0]:.2f}"
    )


def revision() -> str:
    """The repository's commit, marked "+edits" when src/ differs from it (else "?")."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + ("+edits" if dirty else "")


def run_trio(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return trio.run(fn, *args)
