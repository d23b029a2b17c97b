"""`llmgw-ctl debug`: the admin API's debugging aids (``/api/v1/debug/...``,
docs/debugging.md) fetched and shown readably: the trio task tree, thread stacks, a
CPU profile, a heap summary, and whether any of them is on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmgw.admin.bounds import (
    DEFAULT_HEAP_LINES,
    DEFAULT_PROFILE_SECONDS,
    MAX_HEAP_LINES,
    MAX_PROFILE_SECONDS,
    PROFILE_FORMATS,
)
from llmgw_cli._common import EXIT_OK, EXIT_RUNTIME, CliError, int_in

__all__ = ["add_parser", "run"]

#: An admin API call: method, path under /api/v1/, and admin_call's keywords.
Call = Callable[..., Any]

HELP = "the task tree, thread stacks, a CPU profile or a heap summary of the server"


def add_parser(d: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    d.description = (
        "What the server is doing (/api/v1/debug/...): without an action, which "
        "debugging aids are on. Stacks and heap summaries show what the process holds: "
        "keep their output as you would its keys (docs/debugging.md)."
    )
    actions = d.add_subparsers(dest="action", metavar="ACTION", parser_class=type(d))
    actions.add_parser(
        "tasks",
        parents=[common],
        help="the trio task tree and where each task waits",
        description="The trio task tree (GET /api/v1/debug/tasks), each task with the "
        "line it is suspended at; --json adds every frame.",
    )
    actions.add_parser(
        "threads",
        parents=[common],
        help="every thread's Python stack",
        description="Every thread's Python stack (GET /api/v1/debug/threads).",
    )
    p = actions.add_parser(
        "profile",
        parents=[common],
        help="a CPU profile of the event loop over some seconds",
        description="Sample the server's event-loop thread for --seconds with pyinstrument "
        "(POST /api/v1/debug/profile) and print or save the profile. The server keeps "
        "serving meanwhile, a little slower; one profile at a time.",
    )
    p.add_argument(
        "--seconds",
        type=int_in(1, MAX_PROFILE_SECONDS),
        default=DEFAULT_PROFILE_SECONDS,
        metavar="N",
        help=f"how long to sample, 1 to {MAX_PROFILE_SECONDS} (default {DEFAULT_PROFILE_SECONDS})",
    )
    p.add_argument(
        "--format",
        choices=tuple(PROFILE_FORMATS),
        default="text",
        help="text (a call tree), speedscope (JSON for speedscope.app) or html (default text)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the profile to FILE")
    h = actions.add_parser(
        "heap",
        parents=[common],
        help="the lines holding the most live memory (--start starts tracemalloc)",
        description="The lines holding the most live memory (GET /api/v1/debug/heap), while "
        "tracemalloc traces in the server. --start starts it (POST /api/v1/debug/heap), so "
        "it shows only what was allocated since; --stop turns it off again (DELETE: "
        "tracing slows every allocation).",
    )
    h.add_argument(
        "--limit",
        type=int_in(1, MAX_HEAP_LINES),
        default=DEFAULT_HEAP_LINES,
        metavar="N",
        help=f"how many lines (default {DEFAULT_HEAP_LINES})",
    )
    which = h.add_mutually_exclusive_group()
    which.add_argument("--start", action="store_true", help="start tracing (when off) first")
    which.add_argument("--stop", action="store_true", help="stop tracing instead")


def _tree(task: dict[str, Any], depth: int, lines: list[str]) -> None:
    # Where it waits: its innermost frame outside trio (trio's trap is every task's).
    waits = task.get("waits_at") or (task.get("where") or [None])[-1]
    at = f"  @ {waits}" if waits else ""
    lines.append(f"{'  ' * depth}{task.get('name', '?')}{at}")
    for child in task.get("children", []):
        _tree(child, depth + 1, lines)


def _size(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _write(out: Path, body: bytes) -> None:
    try:
        out.write_bytes(body)
    except OSError as exc:
        raise CliError(f"cannot write --out {out}: {exc.strerror}", EXIT_RUNTIME) from None


def run(args: argparse.Namespace, call: Call) -> int:
    action = args.action
    as_json = bool(getattr(args, "json", False))
    if action == "profile":
        params = [("seconds", str(args.seconds)), ("format", args.format)]
        # The answer comes after the sampling: the timeout counts from then.
        resp = call(
            "POST", "debug/profile", params=params, raw=True, timeout=args.timeout + args.seconds
        )
        if args.out is not None:
            _write(args.out, resp.content)
            print(f"profile of {args.seconds}s written to {args.out} ({args.format})")
        else:
            sys.stdout.write(resp.text)
        return EXIT_OK
    if action == "heap" and args.stop:
        data = call("DELETE", "debug/heap")
        if as_json:
            print(json.dumps(data, indent=2))
        else:
            print("tracemalloc stopped" if data.get("was_tracing") else "tracemalloc was off")
        return EXIT_OK
    if action == "heap":
        method = "POST" if args.start else "GET"
        data = call(method, "debug/heap", params=[("limit", str(args.limit))])
    else:
        data = call("GET", "debug" if action is None else f"debug/{action}")
    if as_json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    lines: list[str] = []
    if action == "tasks":
        lines.append(f"{data['count']} tasks")
        _tree(data["root"], 0, lines)
    elif action == "threads":
        for thread in data["threads"]:
            daemon = " daemon" if thread.get("daemon") else ""
            lines.append(f"Thread {thread['name']} ({thread['ident']}{daemon}):")
            lines.extend(entry.rstrip("\n") for entry in thread["stack"])
            lines.append("")
    elif action == "heap":
        lines.append(
            f"traced {_size(data['traced_bytes'])} live, peak {_size(data['peak_bytes'])}, "
            f"tracing itself {_size(data['overhead_bytes'])}; {data['frames']} frame(s) "
            "per allocation"
        )
        lines.append(data["note"])
        for line in data["top"]:
            lines.append(f"{_size(line['size']):>12} {line['count']:>8}  {line['where']}")
    else:
        for key, value in data.items():
            lines.append(
                f"{key:16} {'yes' if value is True else 'no' if value is False else value}"
            )
    print("\n".join(lines))
    return EXIT_OK
