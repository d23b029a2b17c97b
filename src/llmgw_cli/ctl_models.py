"""`llmgw-ctl models add|set-replicas|remove`: runtime models, a catalog entry read
from a JSON or TOML file."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

from llmgw_cli._common import EXIT_OK, CliError, int_in, os_reason
from llmgw_cli.ctl_admin import call
from llmgw_cli.ctl_output import print_json


def add_parser(m: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    m.description = (
        "List the model catalog (where each model comes from, its replicas and endpoints), "
        "or add, scale or remove a model at runtime (kept in the server's store)."
    )
    actions = m.add_subparsers(dest="action", metavar="ACTION", parser_class=type(m))
    a = actions.add_parser(
        "add",
        parents=[common],
        help="add a model from a catalog entry in a JSON or TOML file",
        description="Add a model (POST /api/v1/models) from a catalog entry written as "
        "the configuration writes it: JSON, or TOML with one [[models]] table or the "
        "entry's keys at the top. '-' reads standard input.",
    )
    a.add_argument("file", metavar="FILE", help="FILE.json, FILE.toml or - (standard input)")
    s = actions.add_parser(
        "set-replicas",
        parents=[common],
        help="set a runtime model's desired replicas",
        description="Set how many replicas of a runtime model the control plane keeps "
        "(PATCH /api/v1/models/NAME).",
    )
    s.add_argument("name", metavar="NAME")
    s.add_argument("replicas", type=int_in(0), metavar="N")
    r = actions.add_parser(
        "remove",
        parents=[common],
        help="remove a runtime model",
        description="Remove a model added at runtime (DELETE /api/v1/models/NAME).",
    )
    r.add_argument("name", metavar="NAME")


def _parse_model_text(text: str, source: str, suffix: str) -> Any:
    as_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(
                f"{source}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        kind = "TOML" if suffix == ".toml" else "JSON or TOML"
        raise CliError(f"{source}: not valid {kind}: {exc}") from None


def read_model_entry(path: str) -> dict[str, Any]:
    """One catalog entry from a JSON or TOML file (or '-', standard input): the object
    itself, or the one entry of a `models` list (`[[models]]` in TOML)."""
    if path == "-":
        source, suffix = "standard input", ""
        text = sys.stdin.read()
    else:
        source, suffix = path, Path(path).suffix.lower()
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
            raise CliError(f"cannot read {path}: {reason}") from None
    data = _parse_model_text(text, source, suffix)
    if isinstance(data, dict) and isinstance(data.get("models"), list):
        entries = data["models"]
        if len(entries) != 1 or len(data) != 1:
            raise CliError(
                f"{source}: expected one model, found {len(entries)} in 'models'"
                + ("" if len(data) == 1 else " and other keys beside it")
                + ": add one model at a time"
            )
        data = entries[0]
    if not isinstance(data, dict):
        raise CliError(f"{source}: expected a catalog entry (an object), got {type(data).__name__}")
    if not data:
        raise CliError(f"{source}: the catalog entry is empty (it needs at least a name)")
    return data


def _model_path(name: str) -> str:
    return f"models/{urllib.parse.quote(name, safe='')}"


def _model_summary(model: dict[str, Any]) -> str:
    parts = [str(model.get("source", "?"))]
    for field in ("aliases", "fallbacks"):
        if model.get(field):
            parts.append(f"{field} {', '.join(model[field])}")
    status = model.get("status")
    if status:
        parts.append(f"replicas {status.get('ready', 0)}/{status.get('desired', 0)} ready")
    elif model.get("profiles"):
        parts.append(f"replicas {model.get('replicas')}")
    return "; ".join(parts)


def cmd_add(args: argparse.Namespace) -> int:
    entry = read_model_entry(args.file)
    model = call(args, "POST", "models", body=entry)
    if args.json:
        print_json(model)
    else:
        answer = model if isinstance(model, dict) else {}
        name = answer.get("name", entry.get("name"))
        summary = _model_summary(answer) if answer else "runtime"
        print(f"added model {name!r} ({summary})")
    return EXIT_OK


def cmd_set_replicas(args: argparse.Namespace) -> int:
    model = call(args, "PATCH", _model_path(args.name), body={"replicas": args.replicas})
    if args.json:
        print_json(model)
    else:
        print(f"model {args.name!r}: {args.replicas} replica(s) desired")
        if isinstance(model, dict) and not model.get("profiles"):
            print(
                "note: it has no deployment profiles, so the control plane starts no "
                "replicas of it (endpoints serve it)"
            )
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    call(args, "DELETE", _model_path(args.name))
    if args.json:
        print_json({"model": args.name, "removed": True})
    else:
        print(f"removed model {args.name!r}")
    return EXIT_OK
