"""llmgw-server: the router and, when models declare deployment profiles, the control plane."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import trio

from llmgw import config as cfg
from llmgw import server
from llmgw_cli._common import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, CliError, fail, parser

PROG = "llmgw-server"


def parse_endpoint(spec: str) -> dict[str, Any]:
    """``id=URL=model[,model]`` as a static endpoint table."""
    parts = spec.split("=", 2)
    if len(parts) != 3 or not all(parts):
        raise CliError(f"--endpoint {spec!r}: expected id=URL=model[,model]")
    ident, url, models = parts
    return {"id": ident, "url": url, "models": [m for m in models.split(",") if m]}


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "OpenAI-compatible LLM gateway and GPU-fleet control plane.")
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    p.add_argument("--listen", metavar="ADDR", help="client API address (default :8080)")
    p.add_argument(
        "--admin-listen", metavar="ADDR", help="metrics/admin address (default 127.0.0.1:9090)"
    )
    p.add_argument("--agent-listen", metavar="ADDR", help="agent address (default :7443)")
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="ID=URL=MODEL[,MODEL]",
        help="a static engine endpoint (repeatable); adds to [[endpoints]]",
    )
    p.add_argument("--demo", action="store_true", help="run a self-contained demo fleet")
    p.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    return p


def load_config(args: argparse.Namespace) -> cfg.Config:
    overrides: dict[str, Any] = {}
    for flag in ("listen", "admin_listen", "agent_listen"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    base = cfg.read_toml(args.config) if args.config else {}
    if args.endpoint:
        overrides["endpoints"] = [
            *base.get("endpoints", []),
            *(parse_endpoint(e) for e in args.endpoint),
        ]
    return cfg.load(data=base, overrides=overrides)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args)
    except cfg.ConfigError as exc:
        if len(exc.problems) == 1:
            fail(PROG, exc.problems[0], EXIT_USAGE)
        print(
            f"{PROG}: error: the configuration has {len(exc.problems)} problems:", file=sys.stderr
        )
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except CliError as exc:
        fail(PROG, str(exc), exc.code)
    if args.print_config:
        sys.stdout.write(cfg.dump_toml(config))
        raise SystemExit(EXIT_OK)
    if not config.endpoints and not config.control_plane and not args.demo:
        fail(
            PROG,
            "nothing to serve: declare [[endpoints]] (or --endpoint id=URL=model) for a "
            "router in front of running engines, or [[models]] with [[models.profiles]] for "
            "the control plane to deploy; try --demo",
            EXIT_USAGE,
        )
    if args.demo:
        fail(PROG, "--demo is not available yet: it needs the control plane", EXIT_RUNTIME)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        trio.run(server.serve, config)
    except OSError as exc:
        fail(PROG, f"cannot serve: {exc.strerror or exc}", EXIT_RUNTIME)
    except KeyboardInterrupt:
        pass
