"""llmgw-agent: the node side of the control plane."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from llmgw import logs, units
from llmgw.agent.config import FLAGS, AgentConfig, check, load_file, overlay, servers
from llmgw.agent.servers import Servers
from llmgw.config import ConfigError, TlsConfig
from llmgw.errors import first_line
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    add_log_flags,
    duration_at_least,
    fail,
    parse_or_fail,
    parser,
)

PROG = "llmgw-agent"
# Flags parse as durations here; their bounds are the config file's rules
# (llmgw.agent.config), checked once both are merged, and named by flag.
DURATION = duration_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "Node agent: registers this machine's GPUs and runs engine replicas.")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with any of the settings below (server, node_id, labels, fabrics, "
        "fake_gpus, [tls], ...); flags override it, --label flags merge into its labels",
    )
    # Checked in main, not by argparse: its "required" error ignores exit_on_error and
    # prints the whole usage instead of one line.
    p.add_argument(
        "--server",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="control plane address (required, here or in --config); several, separated "
        "by commas, for servers sharing one store: the agent finds the one that leads",
    )
    p.add_argument("--node-id", metavar="ID", help="node identity (default: hostname)")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="node label")
    p.add_argument("--fabric", action="append", default=[], metavar="NAME", help="fabric name")
    p.add_argument("--fake-gpus", metavar="SPEC", help="pretend GPUs, e.g. 4x80GB")
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="management address engines bind and the router reaches (default: the address "
        "of the interface that routes to the server; 127.0.0.1 for a loopback server)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="this agent's certificate (mTLS)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key")
    p.add_argument("--tls-ca", metavar="FILE", help="CA that signed the server's certificate")
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="engine logs and pid records (default: /var/lib/llmgw-agent as root, "
        "else $XDG_STATE_HOME/llmgw-agent or ~/.local/state/llmgw-agent)",
    )
    p.add_argument(
        "--heartbeat",
        type=DURATION,
        metavar="DURATION",
        help="heartbeat interval until the server sets one at registration (default 5s)",
    )
    p.add_argument(
        "--max-backoff",
        type=DURATION,
        metavar="DURATION",
        help="longest wait between reconnect attempts (default 30s)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=DURATION,
        metavar="DURATION",
        help="on exit, how long engines get after SIGTERM before SIGKILL (default 15s)",
    )
    add_log_flags(p, level=None, fmt=None)  # the --config file may set them
    return p


def _labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--label: expected KEY=VALUE, got {item!r}")
        labels[key.strip()] = value.strip()
    return labels


def default_state_dir() -> Path:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/llmgw-agent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw-agent"


def management_address(server_host: str, server_port: int) -> str:
    """The local address of the interface that routes to the server (no packet is
    sent: a UDP socket's connect only picks a route); 127.0.0.1 for a loopback one."""
    host = server_host or "127.0.0.1"
    if host == "localhost":
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, server_port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise RuntimeError(f"cannot resolve the server's host {host!r}: {e.strerror}") from None
    family, _type, _proto, _name, sockaddr = infos[0]
    if ipaddress.ip_address(sockaddr[0]).is_loopback:
        return "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(sockaddr)
        except OSError as e:
            raise RuntimeError(f"no route to the server {host}: {e.strerror or e}") from None
        return str(s.getsockname()[0])


#: Flags whose value, when given, replaces the file's (the rest are handled by hand).
_PLAIN = (
    "server",
    "node_id",
    "address",
    "fake_gpus",
    "state_dir",
    "heartbeat",
    "max_backoff",
    "shutdown_grace",
    "log_level",
    "log_format",
)


def resolve(args: argparse.Namespace) -> AgentConfig:
    """The agent's settings: the --config file (if any) with the flags given over it.

    Raises ConfigError: the file's problems name its keys, the flags' name the flags.
    A --label flag that is not KEY=VALUE raises ValueError."""
    base = load_file(args.config) if args.config else AgentConfig()
    flags: dict[str, Any] = {key: getattr(args, key) for key in _PLAIN}
    flags = {key: value for key, value in flags.items() if value is not None}
    if args.label:
        flags["labels"] = _labels(args.label)
    if args.fabric:
        flags["fabrics"] = tuple(f.strip() for f in args.fabric if f.strip())
    for key in ("cert", "key", "ca"):
        if getattr(args, f"tls_{key}") is not None:
            flags[f"tls.{key}"] = getattr(args, f"tls_{key}")
    config = overlay(base, flags)
    problems = check(config, flags, name=FLAGS.__getitem__)
    if config.server is None:
        problems.insert(
            0, "the following arguments are required: --server (or server in the --config file)"
        )
    if (config.tls.cert is None) != (config.tls.key is None):
        problems.append(
            "--tls-cert and --tls-key go together (tls.cert and tls.key in the --config file)"
        )
    if problems:
        raise ConfigError(problems)
    return attrs.evolve(config, fabrics=tuple(dict.fromkeys(f.strip() for f in config.fabrics)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_or_fail(build_parser(), argv)

    # -- usage and configuration: exit 2, one line --------------------------------------
    try:
        config = resolve(args)
    except ConfigError as e:
        fail(PROG, "; ".join(e.problems), EXIT_USAGE)
    except ValueError as e:
        fail(PROG, str(e), EXIT_USAGE)
    assert config.server is not None  # resolve requires it
    addresses = [str(units.parse_address(a)) for a in servers(config.server)]
    server = units.parse_address(addresses[0])
    node_id = config.node_id or socket.gethostname()
    tls = (
        TlsConfig(cert=config.tls.cert, key=config.tls.key, client_ca=config.tls.ca)
        if config.tls.cert is not None and config.tls.key is not None
        else None
    )

    logs.setup(config.log_level, config.log_format)
    try:
        address = config.address.strip("[]") if config.address else None
        address = address or management_address(server.host, server.port)
        state_dir = Path(config.state_dir) if config.state_dir else default_state_dir()
        state_dir.mkdir(parents=True, exist_ok=True)
    except (RuntimeError, OSError) as e:
        fail(PROG, str(e) if isinstance(e, RuntimeError) else f"state dir: {e}", EXIT_RUNTIME)

    from llmgw.agent.agent import Agent, NodeSettings

    try:
        from llmgw.transport.grpc import GrpcConnector
    except ImportError as e:  # pragma: no cover - the transport ships with llmgw
        fail(PROG, f"the gRPC transport is not available: {e}", EXIT_RUNTIME)

    if tls is None:
        logging.getLogger(PROG).warning(
            "no TLS: the connection to %s is plaintext and unauthenticated; "
            "use --tls-cert/--tls-key/--tls-ca outside a trusted network",
            config.server,
        )
    settings = NodeSettings(
        node_id=node_id,
        address=address,
        labels=dict(config.labels),
        fabrics=config.fabrics,
        fake_gpus=config.fake_gpus,
    )
    agent = Agent(
        Servers(addresses, lambda address: GrpcConnector(address, tls=tls, node_id=node_id)),
        settings,
        state_dir=state_dir,
        heartbeat_interval=config.heartbeat,
        max_backoff=config.max_backoff,
        shutdown_grace=config.shutdown_grace,
    )

    async def run() -> None:
        # The receiver stays open until the engines are stopped, so a second Ctrl-C
        # cannot interrupt that (it is bounded by --shutdown-grace).
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    async for signum in signals:
                        logging.getLogger(PROG).info(
                            "%s: stopping engines, then exiting", signal.Signals(signum).name
                        )
                        nursery.cancel_scope.cancel()

                nursery.start_soon(on_signal)
                await agent.run()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass
    except Exception as e:
        fail(PROG, first_line(e), EXIT_RUNTIME)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
