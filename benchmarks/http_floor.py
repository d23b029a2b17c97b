"""The floor under llmgw's CPU per request: its HTTP server and client alone, with and
without a disconnect watch per request, beside llmgw itself, in one run.

    python benchmarks/http_floor.py [--rounds N] [--seconds S] [--connections C]

Everything runs on 127.0.0.1 and is started and stopped by this script. One nginx
process answers a fixed completion on two ports (benchmarks/workers.py's, costing
almost no CPU), and wrk (one thread) posts small completion requests to each target
in turn, interleaved (each round starting one target later):

* **forward**: an ASGI app on llmgw.http.server that reads the body and forwards it
  with llmgw.http.client's pool, alternating the two ports: the floor of llmgw's own
  HTTP layer (no routing, admission, metrics, logs or accounting);
* **forward + task watch**: the same, watching for the client's disconnect as an
  ASGI app must under any server: a nursery and a task per request waiting on
  ``receive()``, cancelled when the answer is out (what llmgw's router did);
* **forward + server watch**: the same, with llmgw.http.server's WATCH_DISCONNECT
  extension (one watcher task per connection, what the router now uses);
* **llmgw**: llmgw-server with its default configuration (a worker per core) and no
  store, in front of the same two ports.

Reported: CPU per request (utime + stime of the target's process tree) and
requests/s. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from typing import Any

import trio

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _common as c
import _wrk
import workers as w

MODES = {
    "forward": "forward",
    "forward + task watch": "task",
    "forward + server watch": "server",
}
LLMGW = "llmgw"


def serve(mode: str, port: int, upstreams: list[str]) -> None:
    """The forwarding app (run in a child process of this script)."""
    from llmgw.http.asgi import WATCH_DISCONNECT
    from llmgw.http.client import Pool
    from llmgw.http.server import HttpServerConfig
    from llmgw.http.server import serve as http_serve
    from llmgw.units import Address

    urls = itertools.cycle(f"{u}/v1/completions" for u in upstreams)
    pool = Pool(5.0)
    json_type = [(b"content-type", b"application/json")]

    async def forward(body: bytes, send: Any) -> None:
        response = await pool.post(next(urls), body, json_type)
        data = await response.aread(1 << 20)
        await response.aclose()
        headers = [*json_type, (b"content-length", b"%d" % len(data))]
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if mode == "forward":
            await forward(body, send)
        elif mode == "task":
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    if (await receive())["type"] == "http.disconnect":
                        nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                await forward(body, send)
                nursery.cancel_scope.cancel()
        else:
            with trio.CancelScope() as cancel:
                watching = scope["extensions"][WATCH_DISCONNECT](cancel.cancel)
                with watching:
                    await forward(body, send)

    async def main() -> None:
        await http_serve(
            app,
            Address(c.LOOPBACK, port),
            HttpServerConfig(),
            shutdown_trigger=trio.sleep_forever,
        )

    trio.run(main)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument(
        "--serve", nargs=3, metavar=("MODE", "PORT", "UPSTREAMS"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.serve:
        mode, port, upstreams = args.serve
        serve(mode, int(port), upstreams.split(","))
        return 0
    wrk = _wrk.find()
    if wrk is None:
        raise SystemExit(_wrk.INSTALL_HINT)
    with c.fleet() as fleet:
        _, bases = w.start_nginx(fleet, 2)
        targets: dict[str, tuple[int, str]] = {}
        for name, mode in MODES.items():
            port = fleet.reserve_port()
            argv = [sys.executable, __file__, "--serve", mode, str(port), ",".join(bases)]
            proc = c.Proc(argv, fleet.logdir / f"floor-{mode}.log")
            fleet.procs.append(proc)
            base = f"http://{c.LOOPBACK}:{port}"
            proc.wait_http(f"{base}/health", timeout=15.0)  # any path is forwarded: 200
            targets[name] = (proc.pid, base)
        gw = fleet.router(
            [(f"nginx-{i}", b, w.MODEL) for i, b in enumerate(bases)], config='[store]\nurl = ""\n'
        )
        gw.wait_scraped(timeout=30.0)
        targets[LLMGW] = (gw.pid, gw.base)
        bodies = w.wrk_bodies(fleet.logdir / "bodies.jsonl")
        script = _wrk.write_script(fleet.logdir / "wrk.lua", bodies, threads=1, cap=10**9, addrs=[])
        results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in targets}
        names = list(targets)

        async def run() -> None:
            for name in names:  # warm: first connections, pools, imports
                await _wrk.run(
                    wrk,
                    targets[name][1] + "/v1/completions",
                    script,
                    threads=1,
                    connections=args.connections,
                    seconds=1,
                )
            for rnd in range(args.rounds):
                for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                    pid, base = targets[name]
                    cpu0 = c.cpu_seconds_tree(pid)
                    t0 = time.monotonic()
                    res = await _wrk.run(
                        wrk,
                        base + "/v1/completions",
                        script,
                        threads=1,
                        connections=args.connections,
                        seconds=args.seconds,
                    )
                    wall = time.monotonic() - t0
                    cpu = c.cpu_seconds_tree(pid) - cpu0
                    results[name].append((cpu, res.ok, wall))
                    per = cpu / max(1, res.ok) * 1e3
                    rate = res.ok / res.duration
                    c.log(f"  round {rnd + 1} {name:24} {per:.3f} ms/request, {rate:.0f}/s")
                    if res.failed:
                        c.log(f"  {res.failed} failed")

        trio.run(run)
    floor = None
    rows = []
    for name in names:
        cpu = sum(r[0] for r in results[name])
        ok = sum(r[1] for r in results[name])
        per = cpu / max(1, ok) * 1e3
        floor = floor if floor is not None else per
        each = sorted(r[0] / max(1, r[1]) * 1e3 for r in results[name])
        rows.append(
            [
                name,
                f"{per:.3f}",
                f"{each[0]:.3f}-{each[-1]:.3f}",
                f"{per / floor:.2f}x",
                f"{ok / sum(r[2] for r in results[name]):.0f}",
            ]
        )
    print(f"http_floor  {c.machine()}  {c.revision()}; load average {os.getloadavg()[0]:.2f}")
    print(f"wrk -t 1 -c {args.connections}, {args.rounds} rounds x {args.seconds:g} s, interleaved")
    c.print_table(
        "CPU per request (utime + stime of the target's processes), one nginx on 2 ports behind",
        ["target", "ms/request", "per round", "vs forward", "requests/s"],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
