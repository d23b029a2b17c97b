"""`llmgw-ctl nodes drain|cordon|uncordon|forget` (and `drain`, `cordon`, `uncordon`
standing alone): one node action against the admin API."""

from __future__ import annotations

import argparse
import urllib.parse

from llmgw_cli import ctl_views
from llmgw_cli._common import EXIT_OK
from llmgw_cli.ctl_admin import call
from llmgw_cli.ctl_output import print_json

#: What each node action does, as its help says (the API route it calls follows).
NODE_ACTIONS = {
    "drain": "cordon a node and move its replicas elsewhere, make before break",
    "cordon": "cordon a node: no new shards, its replicas stay (ends a drain)",
    "uncordon": "undo a cordon or drain: the node takes new shards again",
    "forget": "remove a node that is gone from the inventory, with its cordon (refused "
    "while its agent is connected or replicas are placed on it)",
}


def _node_route(verb: str) -> tuple[str, str]:
    """The method and the path (after nodes/ID) of a node action."""
    return ("DELETE", "") if verb == "forget" else ("POST", f"/{verb}")


def add_parser(n: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    n.description = (
        "List the nodes, or change one: drain, cordon, uncordon, forget. With a store "
        "configured, cordons and drains survive a server restart."
    )
    actions = n.add_subparsers(dest="action", metavar="ACTION", parser_class=type(n))
    for verb, help in NODE_ACTIONS.items():
        method, tail = _node_route(verb)
        a = actions.add_parser(
            verb,
            parents=[common],
            help=help,
            description=f"{help[0].upper()}{help[1:]} ({method} /api/v1/nodes/ID{tail}).",
        )
        a.add_argument("node", metavar="NODE", help="node id")


def run(args: argparse.Namespace, verb: str) -> int:
    """drain, cordon, uncordon or forget a node; prints what it did to the node."""
    node = urllib.parse.quote(args.node, safe="")
    method, tail = _node_route(verb)
    data = call(args, method, f"nodes/{node}{tail}")
    if args.json:
        print_json(data if data is not None else {"node": args.node, verb: "requested"})
    elif isinstance(data, dict) and data:
        print(ctl_views.node_change(verb, data))
    else:
        print(f"{verb} requested for node {args.node}")
    return EXIT_OK
