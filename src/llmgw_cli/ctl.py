"""`llmgw-ctl`: the admin client (thin JSON-API calls) and the `bench` workload driver.

Listings (`nodes`, `models`, `keys`, `usage`, ...) print readable tables, or the admin
API's JSON with `--json`. `nodes`, `keys` and `models` also change things: `nodes
drain|cordon|uncordon|forget`, `keys create`, `keys revoke`, `models add`, `models
set-replicas`, `models remove`; `drain`, `cordon` and `uncordon` also stand alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import tomllib
import urllib.parse
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import httpx
import trio
from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from llmgw import __version__, bench
from llmgw.admin.usage import MIN_BUCKET, MOMENT_RE
from llmgw.bench.runner import BAND_HEADER, SESSION_HEADER
from llmgw.bench.sweeping import PERCENTILES
from llmgw.units import parse_duration
from llmgw_cli import ctl_debug, ctl_views
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    CliError,
    add_log_flags,
    fail,
    os_reason,
    setup_logging,
)

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
    "usage": "requests, tokens and latency per API key or model (GET /api/v1/usage)",
}


# --------------------------------------------------------------------------- parsing


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers like 1,2,4,8, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, got {text!r}")
    return values


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names like a,b, got {text!r}")
    return names


def _moment(text: str) -> str:
    """A point in time as the usage API takes it: a duration meaning that long ago
    (``24h``, ``7d``) or Unix seconds, passed on as written; or an ISO 8601 date or
    time (UTC unless it carries an offset), sent as Unix seconds."""
    compact = text.strip().lower().replace(" ", "")
    if MOMENT_RE.fullmatch(compact):
        return compact
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected a duration meaning that long ago (24h, 7d), Unix seconds, or an "
            f"ISO 8601 date or time (2025-01-31, 2025-01-31T12:00), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return f"{moment.timestamp():.3f}".rstrip("0").rstrip(".")


def _bucket(text: str) -> str:
    seconds = _duration(text)
    if seconds < MIN_BUCKET:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_BUCKET:g}s, got {text!r}")
    return text.strip().lower().replace(" ", "")


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


class _OneLineErrors(argparse.ArgumentParser):
    """Subcommand parsers: a usage error is one line, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see '{self.prog} --help')", EXIT_USAGE)


def http_url(text: str) -> str:
    """An http:// or https:// URL with a host (argparse type): a bad one is refused
    before any request, as one line, not reported per failed request after the run."""
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise argparse.ArgumentTypeError(f"invalid URL {text!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"invalid URL {text!r}: use http://HOST[:PORT] or https://HOST[:PORT]"
        )
    return text


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
        type=_duration,
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
            type=_key_value,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="query parameter passed to the API (repeatable)",
        )
        listings[name] = sp
    _add_keys(listings["keys"], common)
    _add_usage(listings["usage"])
    _add_models(listings["models"], common)
    _add_nodes(listings["nodes"], common)
    for verb in ("drain", "cordon", "uncordon"):
        sp = sub.add_parser(verb, parents=[common], help=f"the same as 'nodes {verb}'")
        sp.add_argument("node", metavar="NODE", help="node id")

    ctl_debug.add_parser(
        sub.add_parser("debug", parents=[common], help=ctl_debug.HELP, description=ctl_debug.HELP),
        common,
    )
    _add_bench(sub.add_parser("bench", parents=[common], help="drive load and report latency"))
    return p


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


def _add_nodes(n: argparse.ArgumentParser, common: _OneLineErrors) -> None:
    n.description = (
        "List the nodes, or change one: drain, cordon, uncordon, forget. With a store "
        "configured, cordons and drains survive a server restart."
    )
    actions = n.add_subparsers(dest="action", metavar="ACTION", parser_class=_OneLineErrors)
    for verb, help in NODE_ACTIONS.items():
        method, tail = _node_route(verb)
        a = actions.add_parser(
            verb,
            parents=[common],
            help=help,
            description=f"{help[0].upper()}{help[1:]} ({method} /api/v1/nodes/ID{tail}).",
        )
        a.add_argument("node", metavar="NODE", help="node id")


def _add_keys(k: argparse.ArgumentParser, common: _OneLineErrors) -> None:
    k.description = (
        "List API keys (never their secrets), or create or revoke one. Once any usable key "
        "exists, the client port requires one on every request."
    )
    actions = k.add_subparsers(dest="action", metavar="ACTION", parser_class=_OneLineErrors)
    # `keys create --admin` is the admin-key flag, so this parser cannot take the global
    # `--admin URL` after it: give that before the subcommand.
    json_only = _OneLineErrors(add_help=False)
    json_only.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="as before the command"
    )
    json_only.add_argument(
        "--admin-key", metavar="KEY", default=argparse.SUPPRESS, help="as before the command"
    )
    c = actions.add_parser(
        "create",
        parents=[json_only],
        help="create a key and print its secret (shown only this once)",
        description="Create an API key (POST /api/v1/keys) and print its secret, which is "
        "shown only this once: the store keeps only a hash. Give the global --admin URL "
        "before 'keys' (here --admin makes an admin key).",
    )
    c.add_argument("--name", required=True, help="who or what the key is for")
    c.add_argument("--band", metavar="BAND", help="admission band of its requests (gold, ...)")
    c.add_argument(
        "--models",
        type=_names,
        metavar="A,B",
        help="the only models (names or aliases) it may use (default: all)",
    )
    c.add_argument("--rpm", type=_positive_int, metavar="N", help="requests per minute")
    c.add_argument("--tpm", type=_positive_int, metavar="N", help="tokens per minute")
    c.add_argument(
        "--admin",
        dest="admin_role",
        action="store_true",
        help="an admin key: may use the admin API (needed when it is not on loopback)",
    )
    c.add_argument(
        "--expires-in", type=_duration, metavar="DUR", help="lifetime, e.g. 30d (default: none)"
    )
    r = actions.add_parser(
        "revoke",
        parents=[common],
        help="revoke a key by id or name",
        description="Revoke an API key (DELETE /api/v1/keys/ID); a name must match one "
        "key that is not revoked yet.",
    )
    r.add_argument("key", metavar="ID_OR_NAME", help="the key's id (key_...) or its name")


def _add_usage(u: argparse.ArgumentParser) -> None:
    u.description = (
        "Requests, prompt/completion/cached tokens, errors and mean latency and TTFT per "
        "API key or model (GET /api/v1/usage). Times: a duration meaning that long ago "
        "(24h, 7d), Unix seconds, or an ISO 8601 date or time (UTC unless it has an offset)."
    )
    u.add_argument("--by", choices=("key", "model"), help="one row per key (default) or model")
    u.add_argument(
        "--since", type=_moment, metavar="WHEN", help="window start (default: all recorded)"
    )
    u.add_argument("--until", type=_moment, metavar="WHEN", help="window end (default: now)")
    u.add_argument(
        "--bucket", type=_bucket, metavar="DUR", help="one row per bucket of DUR (e.g. 1h)"
    )


def _add_models(m: argparse.ArgumentParser, common: _OneLineErrors) -> None:
    m.description = (
        "List the model catalog (where each model comes from, its replicas and endpoints), "
        "or add, scale or remove a model at runtime (kept in the server's store)."
    )
    actions = m.add_subparsers(dest="action", metavar="ACTION", parser_class=_OneLineErrors)
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
    s.add_argument("replicas", type=_count, metavar="N")
    r = actions.add_parser(
        "remove",
        parents=[common],
        help="remove a runtime model",
        description="Remove a model added at runtime (DELETE /api/v1/models/NAME).",
    )
    r.add_argument("name", metavar="NAME")


def _add_bench(b: argparse.ArgumentParser) -> None:
    b.description = (
        "Drive a closed-loop workload against an OpenAI-compatible server (/v1 is appended "
        "to --url) and report TTFT, inter-token and end-to-end latency percentiles and "
        "throughput. A prompt of N tokens is N three-letter pseudo-words (~1 token each)."
    )
    b.add_argument(
        "--url",
        required=True,
        type=http_url,
        help="server base URL, e.g. http://127.0.0.1:8080",
    )
    b.add_argument("--model", required=True, help="model name to request")
    b.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    b.add_argument("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY")
    b.add_argument("--concurrency", type=_positive_int, default=8, metavar="N")
    b.add_argument(
        "--requests", type=_positive_int, metavar="N", help="stop after N requests (default 200)"
    )
    b.add_argument(
        "--duration", type=_duration, metavar="DUR", help="stop starting requests after DUR"
    )
    b.add_argument("--prompt-tokens", type=_positive_int, default=256, metavar="N")
    b.add_argument("--output-tokens", type=_positive_int, default=64, metavar="N")
    b.add_argument(
        "--shared-prefix-ratio",
        type=_ratio,
        default=0.0,
        metavar="R",
        help="fraction of each prompt shared within its prefix group (0..1)",
    )
    b.add_argument("--prefix-groups", type=_positive_int, default=1, metavar="N")
    b.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    b.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send ignore_eos so every response has exactly --output-tokens (vLLM/SGLang)",
    )
    b.add_argument("--band", metavar="NAME", help="priority band to request")
    b.add_argument("--band-header", default=BAND_HEADER, metavar="NAME")
    b.add_argument(
        "--session-header",
        metavar="NAME",
        help=f"session header name (default {SESSION_HEADER} with --sessions)",
    )
    b.add_argument(
        "--sessions", type=int, default=0, metavar="N", help="spread requests over N sessions"
    )
    b.add_argument("--header", type=_header, action="append", default=[], metavar="'NAME: VALUE'")
    b.add_argument("--extra-body", type=_json_object, metavar="JSON", help="merged into bodies")
    b.add_argument(
        "--seed",
        type=int,
        help="workload seed (default: random, and reported). A fixed seed repeats the "
        "prompts exactly, which a warm server answers from its prefix cache",
    )
    b.add_argument(
        "--request-timeout",
        type=_duration,
        default=120.0,
        metavar="DUR",
        help="bound on each request (default 120s)",
    )
    b.add_argument("--samples", type=Path, metavar="FILE", help="write per-request JSON lines")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = b.add_argument_group("sweep")
    g.add_argument(
        "--sweep",
        type=_int_list,
        metavar="C1,C2,...",
        help="run once per concurrency (each bounded like a single run)",
    )
    g.add_argument(
        "--target-ttft",
        type=_duration,
        metavar="DUR",
        help="suggest router.scoring targets that keep TTFT under DUR",
    )
    g.add_argument("--ttft-percentile", choices=PERCENTILES, default="p90")
    g.add_argument(
        "--replicas",
        type=_positive_int,
        default=1,
        help="engine replicas behind --url (for per-replica targets)",
    )
    g.add_argument(
        "--metrics-url",
        action="append",
        metavar="URL",
        help="an engine's Prometheus page for its waiting queue (repeatable; default: URL/metrics)",
    )
    g.add_argument("--sweep-all", action="store_true", help="keep going after a missed step")


# --------------------------------------------------------------------------- admin


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "connection refused"
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return text[:1].lower() + text[1:]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _api_error(resp: httpx.Response) -> str | None:
    """The message of an error answer (with the parameter at fault when the message
    does not start with it), or None when the body has none."""
    try:
        obj = resp.json()
    except ValueError:
        return None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message")))
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = _one_line(err["message"])
            param = err.get("param")
            if isinstance(param, str) and param and not message.startswith(param):
                message += f" (param {param})"
            return message
        if isinstance(err, str):
            return _one_line(err)
    return None


def admin_call(
    admin: str,
    method: str,
    path: str,
    *,
    params: Sequence[tuple[str, str]] = (),
    body: Any = None,
    key: str | None = None,
    timeout: float = 10.0,
    raw: bool = False,
) -> Any:
    """One admin API call (`body`, when given, sent as JSON); its JSON (with `raw`, the
    httpx response itself), or CliError(EXIT_RUNTIME) with a one-line reason."""
    url = f"{admin.rstrip('/')}/api/v1/{path}"
    headers = {"accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    try:
        resp = httpx.request(
            method,
            url,
            params=list(params),
            json=body,
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )
    except httpx.InvalidURL as exc:
        raise CliError(f"invalid --admin URL {admin!r}: {exc}", EXIT_USAGE) from None
    except httpx.UnsupportedProtocol:
        raise CliError(
            f"invalid --admin URL {admin!r}: use http:// or https://", EXIT_USAGE
        ) from None
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach admin API at {admin}: {_reason(exc)}", EXIT_RUNTIME) from None
    detail = _api_error(resp)
    if resp.status_code == 404:
        what = detail or f"no /api/v1/{path}"
        raise CliError(f"admin API at {admin}: {what} (404 Not Found)", EXIT_RUNTIME)
    if resp.status_code in (401, 403):
        hint = "" if key else "; pass --admin-key"
        why = f" {detail}" if detail else ""
        raise CliError(
            f"admin API refused {method} /api/v1/{path}: {resp.status_code}{why}{hint}",
            EXIT_RUNTIME,
        )
    if resp.status_code >= 400:
        reason = detail or resp.reason_phrase
        raise CliError(
            f"admin API answered {resp.status_code} to {method} /api/v1/{path}: {reason}",
            EXIT_RUNTIME,
        )
    if raw:
        return resp
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        raise CliError(
            f"admin API at {admin} answered {method} /api/v1/{path} with non-JSON content",
            EXIT_RUNTIME,
        ) from None


def _rows(data: Any, collection: str) -> list[Any] | None:
    """The list of records in an API answer, whatever envelope it comes in."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in (collection, "items", "data", "results"):
            if isinstance(data.get(key), list):
                return list(data[key])
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(data) == 1 and lists:
            return list(lists[0])
        # {"id": {...}, "id2": {...}}: a mapping of records keyed by id.
        if data and all(isinstance(v, dict) for v in data.values()):
            return [{"id": k, **v} for k, v in data.items()]
    return None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list) and not any(isinstance(v, dict | list) for v in value):
        # Long strings (placement reasons) read better one per line.
        sep = "\n" if any(isinstance(v, str) and len(v) > 20 for v in value) else ", "
        return sep.join(_cell(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _kv_table(record: dict[str, Any], title: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in record.items():
        table.add_row(escape(str(key)), escape(_cell(value)))
    return table


def render_table(data: Any, collection: str, width: int = 120) -> RenderableType:
    """A table whose columns are the records' keys (in first-seen order).

    Records too wide for `width` as one row each are shown one field per line
    instead, because a table of truncated cells would hide exactly the values
    (ids, URLs, placement reasons) an operator came for.
    """
    rows = _rows(data, collection)
    if rows is None:
        if isinstance(data, dict):
            return _kv_table(data, collection)
        return _cell(data)
    if not rows:
        return f"no {collection}"
    records = [row if isinstance(row, dict) else {"value": row} for row in rows]
    columns: list[str] = []
    for record in records:
        columns.extend(key for key in record if key not in columns)
    cells = [[_cell(record.get(c)) for c in columns] for record in records]
    natural = sum(
        max(len(c), *(max(map(len, row[i].splitlines() or [""])) for row in cells)) + 3
        for i, c in enumerate(columns)
    )
    title = f"{collection} ({len(rows)})"
    if natural > width:
        first = columns[0]
        return Group(
            *(
                _kv_table(record, f"{title} {first}={_cell(record.get(first))}")
                for record in records
            )
        )
    table = Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for row in cells:
        table.add_row(*(escape(cell) for cell in row))
    return table


def _stdout() -> Console:
    # Piped output gets 120 columns (or $COLUMNS) rather than rich's 80, so tables stay
    # unwrapped in logs; plain lines never wrap (soft_wrap).
    console = Console(soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(soft_wrap=True, width=120)
    return console


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    kw.setdefault("timeout", args.timeout)
    return admin_call(args.admin, method, path, key=args.admin_key, **kw)


def cmd_listing(args: argparse.Namespace) -> int:
    collection = LISTINGS[args.command]
    params = list(args.filter)
    if args.command == "usage":
        for name, value in (
            ("group_by", args.by),
            ("since", args.since),
            ("until", args.until),
            ("bucket", args.bucket),
        ):
            if value is not None:
                params.append((name, value))
    data = _call(args, "GET", collection, params=params)
    if args.json:
        _print_json(data)
    else:
        console = _stdout()
        bands = _bands(args) if args.command == "keys" else None
        view = ctl_views.render(collection, data, bands)
        console.print(view if view is not None else render_table(data, collection, console.width))
    return EXIT_OK


def cmd_node(args: argparse.Namespace, verb: str) -> int:
    """drain, cordon, uncordon or forget a node; prints what it did to the node."""
    node = urllib.parse.quote(args.node, safe="")
    method, tail = _node_route(verb)
    data = _call(args, method, f"nodes/{node}{tail}")
    if args.json:
        _print_json(data if data is not None else {"node": args.node, verb: "requested"})
    elif isinstance(data, dict) and data:
        print(ctl_views.node_change(verb, data))
    else:
        print(f"{verb} requested for node {args.node}")
    return EXIT_OK


# --------------------------------------------------------------------------- keys


def _bands(args: argparse.Namespace) -> ctl_views.Bands | None:
    """The server's bands and default band, to show the band a key without one gets;
    None when the admission view cannot be had (the listing goes on without it)."""
    try:
        return ctl_views.Bands.of(_call(args, "GET", "admission"))
    except CliError:
        return None


def _key_summary(key: dict[str, Any], bands: ctl_views.Bands | None) -> str:
    models = key.get("models")
    parts = [
        f"band {ctl_views.key_band(key, bands)}",
        "all models" if models is None else "models " + (", ".join(models) or "none"),
    ]
    parts += [f"{key[k]:,} {k}" for k in ("rpm", "tpm") if key.get(k) is not None]
    if key.get("admin"):
        parts.append("admin")
    return "; ".join(parts)


def _key_records(data: Any) -> list[dict[str, Any]]:
    keys = data.get("keys") if isinstance(data, dict) else None
    return [k for k in keys if isinstance(k, dict)] if isinstance(keys, list) else []


def cmd_keys_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name}
    for field, value in (
        ("band", args.band),
        ("models", args.models),
        ("rpm", args.rpm),
        ("tpm", args.tpm),
        ("expires_in_seconds", args.expires_in),
    ):
        if value is not None:
            body[field] = value
    if args.admin_role:
        body["admin"] = True
    key = _call(args, "POST", "keys", body=body)
    if not isinstance(key, dict) or not isinstance(key.get("secret"), str):
        raise CliError("the admin API's answer to POST /api/v1/keys has no secret", EXIT_RUNTIME)
    if args.json:
        _print_json(key)
        return EXIT_OK
    say = partial(_stdout().print, markup=False, highlight=False)
    summary = _key_summary(key, _bands(args))
    say(f"Created API key {key.get('name', args.name)!r} ({key.get('id')}): {summary}")
    say()
    say(f"    {key['secret']}", style="bold yellow")
    say()
    say(
        "This secret is shown only now and cannot be shown again: store it somewhere safe. "
        "Clients send it as 'Authorization: Bearer <secret>' (the openai client's api_key).",
        style="bold",
    )
    try:
        listed = _call(args, "GET", "keys")
    except CliError:
        return EXIT_OK  # the key exists; the note below is only a courtesy
    active = [k for k in _key_records(listed) if k.get("status") == "active"]
    if [k.get("id") for k in active] == [key.get("id")]:
        say(
            "It is the first usable key: from now on (within a second) the client port "
            "refuses requests without a key (401)."
        )
    return EXIT_OK


def _resolve_key(args: argparse.Namespace, wanted: str) -> dict[str, Any]:
    """The key with id `wanted`, or the one not-yet-revoked key named `wanted` (or, all
    of that name revoked, the newest: a revoked key's name may be reused, and revoking
    again changes nothing); CliError otherwise. Several live keys share a name only
    when they were made before names were unique (schema version 2)."""
    records = _key_records(_call(args, "GET", "keys"))
    for key in records:
        if key.get("id") == wanted:
            return key
    named = [k for k in records if k.get("name") == wanted]
    live = [k for k in named if k.get("status") != "revoked"]
    if len(live) == 1 or (named and not live):
        return (live or named)[-1]  # listings are oldest first
    if not named:
        raise CliError(
            f"no key with the id or name {wanted!r} (llmgw-ctl keys lists them)", EXIT_RUNTIME
        )
    ids = ", ".join(str(k.get("id")) for k in live)
    raise CliError(
        f"{len(live)} keys are named {wanted!r} ({ids}): revoke one by its id", EXIT_RUNTIME
    )


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    key = _resolve_key(args, args.key)
    key_id = str(key["id"])
    was_revoked = key.get("status") == "revoked"
    revoked = _call(args, "DELETE", f"keys/{urllib.parse.quote(key_id, safe='')}")
    if args.json:
        _print_json(revoked)
        return EXIT_OK
    name = str(key.get("name"))
    if was_revoked:
        print(f"key {name!r} ({key_id}) was already revoked")
        return EXIT_OK
    print(f"revoked key {name!r} ({key_id}); servers stop accepting it within seconds")
    try:
        listed = _call(args, "GET", "keys")
    except CliError:
        return EXIT_OK
    if not any(k.get("status") == "active" for k in _key_records(listed)):
        print(
            "no usable key is left: the client port accepts requests without a key again "
            "(unless auth.required is set)"
        )
    return EXIT_OK


# --------------------------------------------------------------------------- models


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


def cmd_models_add(args: argparse.Namespace) -> int:
    entry = read_model_entry(args.file)
    model = _call(args, "POST", "models", body=entry)
    if args.json:
        _print_json(model)
    else:
        answer = model if isinstance(model, dict) else {}
        name = answer.get("name", entry.get("name"))
        summary = _model_summary(answer) if answer else "runtime"
        print(f"added model {name!r} ({summary})")
    return EXIT_OK


def cmd_models_set_replicas(args: argparse.Namespace) -> int:
    model = _call(args, "PATCH", _model_path(args.name), body={"replicas": args.replicas})
    if args.json:
        _print_json(model)
    else:
        print(f"model {args.name!r}: {args.replicas} replica(s) desired")
        if isinstance(model, dict) and not model.get("profiles"):
            print(
                "note: it has no deployment profiles, so the control plane starts no "
                "replicas of it (endpoints serve it)"
            )
    return EXIT_OK


def cmd_models_remove(args: argparse.Namespace) -> int:
    _call(args, "DELETE", _model_path(args.name))
    if args.json:
        _print_json({"model": args.name, "removed": True})
    else:
        print(f"removed model {args.name!r}")
    return EXIT_OK


ACTIONS: dict[tuple[str, str | None], Callable[[argparse.Namespace], int]] = {
    ("keys", "create"): cmd_keys_create,
    ("keys", "revoke"): cmd_keys_revoke,
    ("models", "add"): cmd_models_add,
    ("models", "set-replicas"): cmd_models_set_replicas,
    ("models", "remove"): cmd_models_remove,
    **{("nodes", verb): partial(cmd_node, verb=verb) for verb in NODE_ACTIONS},
}


# --------------------------------------------------------------------------- bench


class ProgressBar:
    """A rich progress bar on stderr: one task per run (one per sweep step)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.failed = 0

    def run_started(self, target: bench.Target, config: bench.LoadConfig) -> None:
        self.failed = 0
        self.task = self.progress.add_task(
            f"c={config.concurrency}", total=config.requests, status=""
        )

    def request_done(self, sample: bench.Sample) -> None:
        if self.task is None:
            return
        if not sample.ok:
            self.failed += 1
        status = f"[red]{self.failed} failed" if self.failed else ""
        self.progress.update(self.task, advance=1, status=status)

    def run_finished(self, result: bench.BenchResult) -> None:
        if self.task is not None:
            self.progress.update(self.task, total=len(result.samples))


def _load_config(args: argparse.Namespace) -> bench.LoadConfig:
    if args.sessions < 0:
        raise CliError("--sessions must not be negative")
    if args.session_header and not args.sessions:
        raise CliError("--session-header needs --sessions N (how many sessions to spread over)")
    if args.target_ttft is not None and not args.sweep:
        raise CliError("--target-ttft needs --sweep C1,C2,... (the concurrencies to measure)")
    requests = args.requests
    if requests is None and args.duration is None:
        requests = 200
    try:
        return bench.LoadConfig(
            concurrency=args.concurrency,
            requests=requests,
            duration=args.duration,
            stream=args.stream,
            workload=bench.WorkloadSpec(
                prompt_tokens=args.prompt_tokens,
                output_tokens=args.output_tokens,
                shared_prefix_ratio=args.shared_prefix_ratio,
                prefix_groups=args.prefix_groups,
                sessions=args.sessions,
                seed=args.seed if args.seed is not None else random.randrange(2**31),
            ),
            band=args.band,
            band_header=args.band_header,
            session_header=args.session_header or SESSION_HEADER,
            ignore_eos=args.ignore_eos,
            request_timeout=args.request_timeout,
            extra_body=args.extra_body or {},
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _latency_table(summary: bench.Summary) -> Table:
    table = Table("ms", "mean", "p50", "p90", "p99", "max", "n", box=box.SIMPLE_HEAD)
    for name, d in (
        ("TTFT", summary.ttft),
        ("ITL", summary.itl),
        ("TPOT", summary.tpot),
        ("E2E", summary.e2e),
    ):
        if d is None:
            table.add_row(name, "-", "-", "-", "-", "-", "0")
        else:
            table.add_row(
                name, _ms(d.mean), _ms(d.p50), _ms(d.p90), _ms(d.p99), _ms(d.max), str(d.count)
            )
    return table


def _print_summary(console: Console, result: bench.BenchResult) -> None:
    s = result.summary
    c = result.config
    bound = " and ".join(
        part
        for part in (
            f"{c.requests} requests" if c.requests else "",
            f"{c.duration:g}s" if c.duration else "",
        )
        if part
    )
    console.print(
        f"{escape(result.target)}  model {escape(result.model)}  concurrency {c.concurrency}  "
        f"{bound}  {'streaming' if c.stream else 'not streaming'}  "
        f"prompt {c.workload.prompt_tokens} / output {c.workload.output_tokens} tokens  "
        f"seed {c.workload.seed}"
    )
    console.print(_latency_table(s))
    cached = "" if s.cached_tokens is None else f" ({s.cached_tokens} cached)"
    console.print(
        f"requests    {s.requests} in {s.duration:.2f}s: {s.ok} ok, {s.failed} failed\n"
        f"throughput  {s.request_throughput:.2f} req/s, {s.output_token_throughput:.1f} "
        f"output tok/s, {s.total_token_throughput:.1f} total tok/s\n"
        f"tokens      prompt {s.prompt_tokens}{cached}, completion {s.completion_tokens}"
    )
    if s.errors:
        console.print(
            "errors      " + ", ".join(f"{escape(k)} x{v}" for k, v in s.errors.items()),
            style="red",
        )


def _sweep_table(result: bench.SweepResult) -> Table:
    pct = result.percentile
    second = pct if pct != "p50" else "p99"
    table = Table(
        "conc",
        "/replica",
        "req/s",
        "out tok/s",
        "TTFT p50",
        f"TTFT {second}",
        "E2E p50",
        "waiting",
        "failed",
        "meets",
        box=box.SIMPLE_HEAD,
        title="latencies in ms; waiting = mean engine queue per replica",
        title_justify="left",
    )
    for step in result.steps:
        s = step.summary
        ttft2 = s.ttft.percentile(second) if s.ttft else None
        table.add_row(
            str(step.concurrency),
            f"{step.per_replica:g}",
            f"{s.request_throughput:.2f}",
            f"{s.output_token_throughput:.1f}",
            _ms(s.ttft.p50 if s.ttft else None),
            _ms(ttft2),
            _ms(s.e2e.p50 if s.e2e else None),
            "-" if step.engine is None else f"{step.engine.waiting_mean:.1f}",
            str(s.failed),
            "-" if step.passed is None else ("yes" if step.passed else "no"),
        )
    return table


def _sweep_json(result: bench.SweepResult) -> dict[str, Any]:
    """The sweep without per-request samples (those go to --samples)."""
    return {
        "target": result.target,
        "model": result.model,
        "target_ttft": result.target_ttft,
        "percentile": result.percentile,
        "replicas": result.replicas,
        "config": bench.to_jsonable(result.steps[0].result.config) if result.steps else None,
        "steps": [
            {
                "concurrency": step.concurrency,
                "per_replica": step.per_replica,
                "ttft": step.ttft,
                "passed": step.passed,
                "engine": bench.to_jsonable(step.engine),
                "summary": bench.to_jsonable(step.summary),
            }
            for step in result.steps
        ],
        "suggestion": bench.to_jsonable(result.suggestion),
    }


def _write_samples(path: Path, results: Sequence[bench.BenchResult]) -> None:
    try:
        with path.open("w") as f:
            for result in results:
                for sample in result.samples:
                    record = {
                        "target": result.target,
                        "concurrency": result.config.concurrency,
                        **bench.to_jsonable(sample),
                    }
                    f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise CliError(f"cannot write --samples {path}: {exc.strerror}", EXIT_RUNTIME) from None


def _no_success(results: Sequence[bench.BenchResult]) -> str | None:
    """Why nothing succeeded, or None when something did."""
    if any(r.summary.ok for r in results):
        return None
    failed = [s for r in results for s in r.samples]
    if not failed:
        return "no request was sent"
    first = failed[0]
    detail = f": {first.message}" if first.message else ""
    return f"no request succeeded ({len(failed)} x {first.error}{detail})"


def cmd_bench(args: argparse.Namespace) -> int:
    config = _load_config(args)
    target = bench.Target(
        url=args.url,
        model=args.model,
        api_key=args.api_key,
        endpoint=args.endpoint,
        headers=tuple(args.header),
    )
    out = _stdout()
    show_progress = not args.json and not args.no_progress and sys.stderr.isatty()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=Console(stderr=True),
        disable=not show_progress,
    )
    observer = ProgressBar(progress)
    swept: bench.SweepResult | None = None
    try:
        with progress:
            if args.sweep:
                swept = trio.run(
                    partial(
                        bench.sweep,
                        target,
                        config,
                        args.sweep,
                        target_ttft=args.target_ttft,
                        percentile=args.ttft_percentile,
                        replicas=args.replicas,
                        metrics_urls=args.metrics_url,
                        stop_on_miss=not args.sweep_all,
                        observer=observer,
                    )
                )
                results = [step.result for step in swept.steps]
            else:
                results = [trio.run(partial(bench.run, target, config, observer=observer))]
    except KeyboardInterrupt:
        raise CliError("interrupted", EXIT_RUNTIME) from None
    if args.samples:
        _write_samples(args.samples, results)
    if swept is not None:
        if args.json:
            _print_json(_sweep_json(swept))
        else:
            _print_sweep(out, swept)
    elif args.json:
        result = results[0]
        _print_json(
            {
                "target": result.target,
                "model": result.model,
                "endpoint": target.endpoint,
                "config": bench.to_jsonable(result.config),
                "summary": bench.to_jsonable(result.summary),
            }
        )
    else:
        _print_summary(out, results[0])
    problem = _no_success(results)
    if problem is not None:
        raise CliError(problem, EXIT_RUNTIME)
    return EXIT_OK


def _print_sweep(console: Console, result: bench.SweepResult) -> None:
    console.print(
        f"sweep {escape(result.target)} model {escape(result.model)}, {result.replicas} replica(s)"
    )
    console.print(_sweep_table(result))
    s = result.suggestion
    if s is None:
        return
    target = "-" if result.target_ttft is None else f"{result.target_ttft * 1000:g}ms"
    if s.capacity is None:
        console.print(f"no suggestion for TTFT {result.percentile} <= {target}: {s.note}")
    else:
        waiting = "unknown" if s.target_waiting is None else str(s.target_waiting)
        console.print(
            f"suggested for TTFT {result.percentile} <= {target}: "
            f"capacity = {s.capacity} on each endpoint, router.scoring.target_waiting = "
            f"{waiting}  (measured at concurrency {s.concurrency})"
        )
        if s.note:
            console.print(f"note: {escape(s.note)}")
    console.print(f"rule: {escape(s.rule)}", style="dim")


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args)
    try:
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "debug":
            return ctl_debug.run(args, partial(_call, args))
        if args.command in ("drain", "cordon", "uncordon"):
            return cmd_node(args, args.command)
        action = ACTIONS.get((args.command, getattr(args, "action", None)))
        if action is not None:
            return action(args)
        return cmd_listing(args)
    except CliError as exc:
        fail(PROG, str(exc), exc.code)


if __name__ == "__main__":
    sys.exit(main())
