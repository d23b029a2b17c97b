"""`llmgw-ctl keys create|revoke`: API keys made and revoked through the admin API,
and what a key's change means for the client port."""

from __future__ import annotations

import argparse
import urllib.parse
from functools import partial
from typing import Any

from llmgw_cli import ctl_views
from llmgw_cli._common import (
    EXIT_OK,
    EXIT_RUNTIME,
    CliError,
    int_in,
    name_list,
    positive_duration,
)
from llmgw_cli.ctl_admin import call
from llmgw_cli.ctl_output import print_json, stdout


def add_parser(k: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    k.description = (
        "List API keys (never their secrets), or create or revoke one. Once any usable key "
        "exists, the client port requires one on every request."
    )
    actions = k.add_subparsers(dest="action", metavar="ACTION", parser_class=type(k))
    c = actions.add_parser(
        "create",
        parents=[common],
        help="create a key and print its secret (shown only this once)",
        description="Create an API key (POST /api/v1/keys) and print its secret, which is "
        "shown only this once: the store keeps only a hash. --role admin makes an admin "
        "key.",
    )
    c.add_argument("--name", required=True, help="who or what the key is for")
    c.add_argument("--band", metavar="BAND", help="admission band of its requests (gold, ...)")
    c.add_argument(
        "--models",
        type=name_list,
        metavar="A,B",
        help="the only models (names or aliases) it may use (default: all)",
    )
    c.add_argument("--rpm", type=int_in(1), metavar="N", help="requests per minute")
    c.add_argument("--tpm", type=int_in(1), metavar="N", help="tokens per minute")
    # Not `--admin`: that is the admin API's URL, accepted after the command too.
    c.add_argument(
        "--role",
        choices=("client", "admin"),
        default="client",
        help="admin: may use the admin API and the dashboard (needed when they are not "
        "on loopback); default client",
    )
    c.add_argument(
        "--expires-in",
        type=positive_duration,
        metavar="DUR",
        help="lifetime, e.g. 30d (default: none)",
    )
    r = actions.add_parser(
        "revoke",
        parents=[common],
        help="revoke a key by id or name",
        description="Revoke an API key (DELETE /api/v1/keys/ID); a name must match one "
        "key that is not revoked yet.",
    )
    r.add_argument("key", metavar="ID_OR_NAME", help="the key's id (key_...) or its name")


def bands(args: argparse.Namespace) -> ctl_views.Bands | None:
    """The server's bands and default band, to show the band a key without one gets;
    None when the admission view cannot be had (the listing goes on without it)."""
    try:
        return ctl_views.Bands.of(call(args, "GET", "admission"))
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


def cmd_create(args: argparse.Namespace) -> int:
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
    if args.role == "admin":
        body["admin"] = True
    key = call(args, "POST", "keys", body=body)
    if not isinstance(key, dict) or not isinstance(key.get("secret"), str):
        raise CliError("the admin API's answer to POST /api/v1/keys has no secret", EXIT_RUNTIME)
    if args.json:
        print_json(key)
        return EXIT_OK
    say = partial(stdout().print, markup=False, highlight=False)
    summary = _key_summary(key, bands(args))
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
        listed = call(args, "GET", "keys")
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
    records = _key_records(call(args, "GET", "keys"))
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


def cmd_revoke(args: argparse.Namespace) -> int:
    key = _resolve_key(args, args.key)
    key_id = str(key["id"])
    was_revoked = key.get("status") == "revoked"
    revoked = call(args, "DELETE", f"keys/{urllib.parse.quote(key_id, safe='')}")
    if args.json:
        print_json(revoked)
        return EXIT_OK
    name = str(key.get("name"))
    if was_revoked:
        print(f"key {name!r} ({key_id}) was already revoked")
        return EXIT_OK
    print(f"revoked key {name!r} ({key_id}); servers stop accepting it within seconds")
    try:
        listed = call(args, "GET", "keys")
    except CliError:
        return EXIT_OK
    if not any(k.get("status") == "active" for k in _key_records(listed)):
        print(
            "no usable key is left: the client port accepts requests without a key again "
            "(unless auth.required is set)"
        )
    return EXIT_OK
