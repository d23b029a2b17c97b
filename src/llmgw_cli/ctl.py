"""`llmgw-ctl`: the admin client (thin JSON-API calls) and the `bench` workload driver.

Listings (`nodes`, `models`, `keys`, `usage`, ...) print readable tables, or the admin
API's JSON with `--json`. `nodes`, `keys`, `models` and `endpoints` also change
things: `nodes drain|cordon|uncordon|forget`, `keys create`, `keys revoke`, `models
add`, `models set-replicas`, `models remove`, `endpoints add`, `endpoints remove`;
`drain`, `cordon` and `uncordon` also stand alone.

This module is the command line and the listings; each command's flags and work are in
its own module beside it (ctl_keys, ctl_models, ctl_endpoints, ctl_nodes, ctl_usage, ctl_debug,
ctl_bench), the admin API client in ctl_admin, and the output in ctl_output and
ctl_views.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import NoReturn

from llmgw.version import __version__
from llmgw_cli import (
    ctl_bench,
    ctl_debug,
    ctl_endpoints,
    ctl_keys,
    ctl_models,
    ctl_nodes,
    ctl_usage,
    ctl_views,
)
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_log_flags,
    fail,
    key_value,
    positive_duration,
    setup_logging,
)
from llmgw_cli.ctl_admin import call
from llmgw_cli.ctl_output import print_json, render_table, stdout

PROG = "llmgw-ctl"
DEFAULT_ADMIN = "http://127.0.0.1:9090"

# Subcommand -> admin API collection under /api/v1/. Given no action, each lists.
LISTINGS = {
    "nodes": "nodes",
    "models": "models",
    "replicas": "replicas",
    "placement": "placement",
    "endpoints": "endpoints",
    "keys": "keys",
    "usage": "usage",
}
HELP = {
    "nodes": "list nodes (GET /api/v1/nodes), or drain, cordon, uncordon or forget one",
    "keys": "API keys: list them, or create or revoke one",
    "models": "the model catalog: list it, or add, scale or remove a runtime model",
    "endpoints": "engine endpoints: list them, or add or remove one at runtime",
    "usage": "requests, tokens and latency per API key or model (GET /api/v1/usage)",
}


class _OneLineErrors(argparse.ArgumentParser):
    """Subcommand parsers: a usage error is one line, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see '{self.prog} --help')", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrors(
        prog=PROG,
        description="Administer an llmgw server, or benchmark any OpenAI-compatible server.",
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument(
        "--admin",
        default=DEFAULT_ADMIN,
        metavar="URL",
        help=f"admin API base URL (default {DEFAULT_ADMIN})",
    )
    p.add_argument("--admin-key", metavar="KEY", help="bearer token for the admin API")
    p.add_argument(
        "--timeout",
        type=positive_duration,
        default=10.0,
        metavar="DUR",
        help="admin API request timeout (default 10s)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    # Before the command: llmgw-ctl's own output is its tables; logs are for warnings.
    add_log_flags(p, level="warning")
    # Accept the global flags after the subcommand too; SUPPRESS keeps the
    # subparser from overwriting a value given before it.
    common = _OneLineErrors(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="as before the command"
    )
    common.add_argument(
        "--admin", metavar="URL", default=argparse.SUPPRESS, help="as before the command"
    )
    common.add_argument(
        "--admin-key", metavar="KEY", default=argparse.SUPPRESS, help="as before the command"
    )

    sub = p.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_OneLineErrors
    )
    listings: dict[str, argparse.ArgumentParser] = {}
    for name, path in LISTINGS.items():
        help = HELP.get(name, f"list {name} (GET /api/v1/{path})")
        sp = sub.add_parser(name, parents=[common], help=help, description=help)
        sp.add_argument(
            "--filter",
            type=key_value,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="query parameter passed to the API (repeatable)",
        )
        listings[name] = sp
    ctl_keys.add_parser(listings["keys"], common)
    ctl_usage.add_parser(listings["usage"])
    ctl_models.add_parser(listings["models"], common)
    ctl_endpoints.add_parser(listings["endpoints"], common)
    ctl_nodes.add_parser(listings["nodes"], common)
    for verb in ("drain", "cordon", "uncordon"):
        sp = sub.add_parser(verb, parents=[common], help=f"the same as 'nodes {verb}'")
        sp.add_argument("node", metavar="NODE", help="node id")

    ctl_debug.add_parser(
        sub.add_parser("debug", parents=[common], help=ctl_debug.HELP, description=ctl_debug.HELP),
        common,
    )
    ctl_bench.add_parser(
        sub.add_parser("bench", parents=[common], help="drive load and report latency")
    )
    return p


def cmd_listing(args: argparse.Namespace) -> int:
    collection = LISTINGS[args.command]
    params = list(args.filter)
    if args.command == "usage":
        params += ctl_usage.query(args)
    data = call(args, "GET", collection, params=params)
    if args.json:
        print_json(data)
    else:
        console = stdout()
        bands = ctl_keys.bands(args) if args.command == "keys" else None
        view = ctl_views.render(collection, data, bands)
        console.print(view if view is not None else render_table(data, collection, console.width))
    return EXIT_OK


ACTIONS: dict[tuple[str, str | None], Callable[[argparse.Namespace], int]] = {
    ("keys", "create"): ctl_keys.cmd_create,
    ("keys", "revoke"): ctl_keys.cmd_revoke,
    ("models", "add"): ctl_models.cmd_add,
    ("models", "set-replicas"): ctl_models.cmd_set_replicas,
    ("models", "remove"): ctl_models.cmd_remove,
    ("endpoints", "add"): ctl_endpoints.cmd_add,
    ("endpoints", "remove"): ctl_endpoints.cmd_remove,
    **{("nodes", verb): partial(ctl_nodes.run, verb=verb) for verb in ctl_nodes.NODE_ACTIONS},
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a reader that left is seen below
    except BrokenPipeError:
        # The reader left (`llmgw-ctl --json usage | head`): the output was cut as it
        # asked, so no traceback; stdout goes nowhere, for the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args)
    try:
        if args.command == "bench":
            return ctl_bench.run(args)
        if args.command == "debug":
            return ctl_debug.run(args, partial(call, args))
        if args.command in ("drain", "cordon", "uncordon"):
            return ctl_nodes.run(args, args.command)
        action = ACTIONS.get((args.command, getattr(args, "action", None)))
        if action is not None:
            return action(args)
        return cmd_listing(args)
    except CliError as exc:
        fail(PROG, str(exc), exc.code)


if __name__ == "__main__":
    sys.exit(main())
