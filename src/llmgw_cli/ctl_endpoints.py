"""`llmgw-ctl endpoints add|remove`: endpoints added at runtime (kept in the server's
store), beside those of the configuration file and the discovery file."""

from __future__ import annotations

import argparse
import os
import urllib.parse
from typing import Any

from llmgw_cli._common import EXIT_OK, CliError, key_value
from llmgw_cli.ctl_admin import call
from llmgw_cli.ctl_output import print_json


def add_parser(e: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    e.description = (
        "List the endpoints the router sends requests to (where each comes from, its live "
        "numbers), or add or remove one at runtime (kept in the server's store)."
    )
    actions = e.add_subparsers(dest="action", metavar="ACTION", parser_class=type(e))
    a = actions.add_parser(
        "add",
        parents=[common],
        help="add an engine endpoint at runtime",
        description="Add an endpoint (POST /api/v1/endpoints), as an [[endpoints]] table "
        "of the configuration file would; the server checks it by the same rules.",
    )
    a.add_argument("id", metavar="ID", help="the endpoint's id (logs, metrics, the admin API)")
    a.add_argument("url", metavar="URL", help="the engine's base URL (http:// or https://)")
    a.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="MODEL",
        help="a model it serves, as clients name it (repeatable)",
    )
    a.add_argument("--pool", help="a label grouping endpoints (default: default)")
    a.add_argument("--weight", type=float, help="its share among equally loaded peers")
    a.add_argument("--priority", type=int, help="its tier: 0 (default) is used first")
    a.add_argument("--capacity", type=int, help="sequences its engine runs at once")
    a.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="send the engine the API key in environment variable VAR (never on a command "
        "line, where other users of the host see it)",
    )
    a.add_argument(
        "--header",
        type=key_value,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another header sent to the engine with every request (repeatable)",
    )
    r = actions.add_parser(
        "remove",
        parents=[common],
        help="remove a runtime endpoint (it drains first)",
        description="Remove an endpoint added at runtime (DELETE /api/v1/endpoints/ID): "
        "no new requests go to it, those in flight finish, then it is gone.",
    )
    r.add_argument("id", metavar="ID")


def endpoint_body(args: argparse.Namespace) -> dict[str, Any]:
    """The [[endpoints]] table the flags describe (only the keys given)."""
    body: dict[str, Any] = {"id": args.id, "url": args.url, "models": list(args.model)}
    for name in ("pool", "weight", "priority", "capacity"):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    if args.api_key_env is not None:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise CliError(f"--api-key-env {args.api_key_env}: that variable is not set")
        body["api_key"] = key
    if args.header:
        body["headers"] = dict(args.header)
    return body


def cmd_add(args: argparse.Namespace) -> int:
    endpoint = call(args, "POST", "endpoints", body=endpoint_body(args))
    if args.json:
        print_json(endpoint)
    else:
        print(f"added endpoint {args.id!r} at {args.url} for {', '.join(args.model)}")
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    call(args, "DELETE", f"endpoints/{urllib.parse.quote(args.id, safe='')}")
    if args.json:
        print_json({"endpoint": args.id, "removed": True})
    else:
        print(f"removed endpoint {args.id!r} (draining: requests in flight finish)")
    return EXIT_OK
