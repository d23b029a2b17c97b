"""llmgw-server: the router and, when models declare deployment profiles, the control plane."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import attrs
import trio

from llmgw import config as cfg
from llmgw import server, units
from llmgw.agent.adapters.llamacpp import BUILD_HINT, find_llama_server
from llmgw.assembly import Workers, assemble
from llmgw.demo import DEMO_GPUS, DEMO_OVERLAY, llamacpp_overlay, run_demo
from llmgw.store.base import StoreError
from llmgw.workers import sockets
from llmgw.workers.pool import worker_count
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    READY_FILE_HELP,
    CliError,
    add_log_flags,
    check_ready_file,
    fail,
    find_error,
    os_error_line,
    os_reason,
    parser,
    ready_file,
    setup_logging,
    write_ready_file,
)

PROG = "llmgw-server"


def parse_endpoint(spec: str) -> dict[str, Any]:
    """``id=URL=model[,model][=KV_EVENTS]`` as a static endpoint table (KV_EVENTS: the
    engine's KV-cache event address, e.g. tcp://host:5557)."""
    parts = spec.split("=", 3)
    if len(parts) not in (3, 4) or not all(parts):
        raise CliError(f"--endpoint {spec!r}: expected id=URL=model[,model][=tcp://HOST:PORT]")
    ident, url, models = parts[:3]
    table: dict[str, Any] = {
        "id": ident,
        "url": url,
        "models": [m for m in models.split(",") if m],
    }
    if len(parts) == 4:
        table["kv_events"] = parts[3]
    return table


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "OpenAI-compatible LLM gateway and GPU-fleet control plane.")
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    p.add_argument(
        "--listen",
        metavar="ADDR",
        help="client API address (default :8080); port 0 picks a free one (see --ready-file)",
    )
    p.add_argument(
        "--admin-listen", metavar="ADDR", help="metrics/admin address (default 127.0.0.1:9090)"
    )
    p.add_argument("--agent-listen", metavar="ADDR", help="agent address (default :7443)")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes serving the client API on its one port (default: the config's "
        "`workers`; 0: one per core)",
    )
    p.add_argument("--ready-file", metavar="PATH", help=READY_FILE_HELP)
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="ID=URL=MODEL[,MODEL][=KV_EVENTS]",
        help="a static engine endpoint (repeatable); adds to [[endpoints]]; KV_EVENTS is "
        "its engine's KV-cache event address (tcp://HOST:PORT), as `kv_events`",
    )
    p.add_argument("--demo", action="store_true", help="run a self-contained demo fleet")
    p.add_argument(
        "--engine",
        choices=("sim", "llamacpp"),
        default="sim",
        help="the demo's engine: simulated (default) or llama.cpp on a tiny generated model",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    add_log_flags(p)
    return p


def load_config(
    args: argparse.Namespace, demo: bool = False, overlay: dict[str, Any] | None = None
) -> cfg.Config:
    overrides: dict[str, Any] = {}
    for flag in ("listen", "admin_listen", "agent_listen", "workers"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    base = cfg.read_toml(args.config) if args.config else {}
    endpoints = [*base.get("endpoints", []), *(parse_endpoint(e) for e in args.endpoint)]
    if demo:
        overlay = overlay or DEMO_OVERLAY
        base = cfg.merge(
            # Loopback unless told otherwise: the demo's client port has no keys.
            {**overlay, "listen": "127.0.0.1:8080", "agent_listen": "127.0.0.1:7443"},
            {**base, "models": [*overlay["models"], *base.get("models", [])]},
        )
    if endpoints:
        overrides["endpoints"] = endpoints
    return cfg.load(data=base, overrides=overrides)


def _config_error(exc: cfg.ConfigError) -> NoReturn:
    if len(exc.problems) == 1:
        fail(PROG, exc.problems[0], EXIT_USAGE)
    count = len(exc.problems)
    print(f"{PROG}: error: the configuration has {count} problems:", file=sys.stderr)
    for problem in exc.problems:
        print(f"  {problem}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _llamacpp_demo_weights() -> Path:
    """A temporary directory with the tiny GGUF model, or exit 1 saying what is missing."""
    if find_llama_server() is None:
        fail(PROG, f"--engine llamacpp needs llama-server: {BUILD_HINT}", EXIT_RUNTIME)
    folder = Path(tempfile.mkdtemp(prefix="llmgw-demo-gguf-"))
    try:
        from llmgw.testing.gguf import write_tiny_gguf

        return write_tiny_gguf(folder / "tiny.gguf")
    except BaseException as exc:
        # main() removes the folder after the run; one that never got there, here.
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, ImportError):
            fail(
                PROG,
                f"--engine llamacpp writes its model with gguf and numpy ({exc}): "
                "pip install gguf numpy",
                EXIT_RUNTIME,
            )
        raise


def _reachable(address: str) -> str:
    """A bound address as a client on this host reaches it: every interface through
    loopback."""
    parsed = units.parse_address(address)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(parsed.host, parsed.host)
    return str(units.Address(host, parsed.port))


async def _bind(address: str) -> list[trio.SocketListener]:
    """Sockets listening on `address` (a `listen` or `admin_listen` value), or CliError
    naming it: bound here rather than in llmgw.assembly, whose OSError would not say which
    of its addresses failed."""
    parsed = units.parse_address(address)
    try:
        return await trio.open_tcp_listeners(parsed.port, host=parsed.bind_host)
    except OSError as exc:
        raise CliError(f"cannot listen on {address}: {os_reason(exc)}", EXIT_RUNTIME) from None


@attrs.frozen
class Bound:
    """The admin listeners, and either the client listeners (one process) or the
    client sockets reserved for workers."""

    admin: list[trio.SocketListener]
    client: list[trio.SocketListener] | None
    workers: Workers | None


@contextlib.asynccontextmanager
async def _bind_both(config: cfg.Config, args: argparse.Namespace) -> AsyncIterator[Bound]:
    """The client and admin sockets, closed on the way out (the gateway closes them
    too, but not when it fails before it takes them, say opening the store)."""
    listeners: list[trio.SocketListener] = []
    reserved: list[socket.socket] = []
    try:
        count = worker_count(config)
        client: list[trio.SocketListener] | None = None
        workers = None
        if count > 1:
            try:
                reserved = sockets.reserve(config.listen)
            except OSError as exc:
                raise CliError(
                    f"cannot listen on {config.listen}: {os_reason(exc)}", EXIT_RUNTIME
                ) from None
            workers = Workers(count, reserved, args.log_level, args.log_format)
        else:
            client = await _bind(config.listen)
            listeners += client
        admin = await _bind(config.admin_listen)
        listeners += admin
        yield Bound(admin, client, workers)
    finally:
        for listener in listeners:
            listener.socket.close()
        for sock in reserved:
            sock.close()


async def _serve(config: cfg.Config, args: argparse.Namespace) -> None:
    ready = args.ready_file
    async with (
        _bind_both(config, args) as bound,
        assemble(
            config,
            client_listeners=bound.client,
            admin_listeners=bound.admin,
            workers=bound.workers,
        ) as gateway,
    ):
        await server.serve(
            gateway,
            on_listening=partial(write_ready_file, ready) if ready else None,
            # SIGHUP: the same files and flags read again (their [[endpoints]] applied).
            reload_config=partial(load_config, args),
        )


async def _run_demo(
    config: cfg.Config, args: argparse.Namespace, fake_gpus: str | None = DEMO_GPUS
) -> None:
    ready = args.ready_file
    listening: server.Listening = {}

    def on_listening(bound: server.Listening) -> None:
        listening.update(bound)
        if ready is not None:
            write_ready_file(ready, bound)

    def announce(line: str) -> None:
        # Where it listens (with the port picked for port 0).
        client = _reachable(listening.get("listen", [config.listen])[0])
        admin = _reachable(listening.get("admin_listen", [config.admin_listen])[0])
        print(
            f"{line}\n"
            f"  try: curl http://{client}/v1/chat/completions "
            "-H 'content-type: application/json' "
            '-d \'{"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}]}\'\n'
            f"  dashboard: http://{admin}/\n"
            f"  fleet: http://{admin}/api/v1/nodes, "
            f"http://{admin}/api/v1/replicas, "
            f"http://{admin}/metrics",
            flush=True,
        )

    async with _bind_both(config, args) as bound:
        await run_demo(
            config,
            announce=announce,
            fake_gpus=fake_gpus,
            on_listening=on_listening,
            client_listeners=bound.client,
            admin_listeners=bound.admin,
            workers=bound.workers,
        )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.engine != "sim" and not args.demo:
        fail(PROG, "--engine is for --demo", EXIT_USAGE)
    weights = _llamacpp_demo_weights() if args.engine == "llamacpp" else None
    try:
        _main(args, weights)
    finally:
        if weights is not None:
            shutil.rmtree(weights.parent, ignore_errors=True)


def _main(args: argparse.Namespace, weights: Path | None) -> None:
    overlay = llamacpp_overlay(weights) if weights is not None else None
    try:
        config = load_config(args, demo=args.demo, overlay=overlay)
    except cfg.ConfigError as exc:
        _config_error(exc)
    except CliError as exc:
        fail(PROG, str(exc), exc.code)
    try:
        check_ready_file(args.ready_file)
    except CliError as exc:
        fail(PROG, str(exc), exc.code)
    if args.print_config:
        sys.stdout.write(cfg.dump_toml(config))
        raise SystemExit(EXIT_OK)
    # Runtime endpoints (the store's) are read later, when the gateway is assembled: a
    # fleet made only of them says so with discovery.start_empty.
    d = config.discovery
    if not (config.endpoints or config.control_plane or d.file or d.start_empty or args.demo):
        fail(
            PROG,
            "nothing to serve: declare [[endpoints]] (or --endpoint id=URL=model) for a "
            "router in front of running engines, [discovery] file for endpoints another "
            "program lists, or [[models]] with [[models.profiles]] for the control plane to "
            "deploy; to start empty and add endpoints at runtime (POST /api/v1/endpoints), "
            "set discovery.start_empty = true; try --demo",
            EXIT_USAGE,
        )
    setup_logging(args)
    try:
        with ready_file(args.ready_file):
            if args.demo:
                gpus = None if weights is not None else DEMO_GPUS
                trio.run(_run_demo, config, args, gpus)
            else:
                trio.run(_serve, config, args)
    except cfg.ConfigError as exc:
        _config_error(exc)
    except CliError as exc:
        fail(PROG, str(exc), exc.code)
    except StoreError as exc:
        fail(PROG, f"store: {exc}", EXIT_RUNTIME)
    except OSError as exc:
        fail(PROG, os_error_line(exc, "cannot serve"), EXIT_RUNTIME)
    except KeyboardInterrupt:
        pass
    except BaseExceptionGroup as group:
        # From inside a nursery: the agent listener's port, a ready file unwritable.
        err = find_error(group, OSError)
        if err is None:
            raise
        fail(PROG, os_error_line(err, "cannot serve"), EXIT_RUNTIME)
