"""`llmgw-ctl usage`: its flags, with the times and buckets as the usage API takes
them, and the query they make."""

from __future__ import annotations

import argparse
import datetime

from llmgw.admin.bounds import MIN_BUCKET, MOMENT_RE
from llmgw_cli._common import positive_duration


def moment(text: str) -> str:
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


def bucket(text: str) -> str:
    seconds = positive_duration(text)
    if seconds < MIN_BUCKET:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_BUCKET:g}s, got {text!r}")
    return text.strip().lower().replace(" ", "")


def add_parser(u: argparse.ArgumentParser) -> None:
    u.description = (
        "Requests, prompt/completion/cached tokens, errors and mean latency and TTFT per "
        "API key or model (GET /api/v1/usage). Times: a duration meaning that long ago "
        "(24h, 7d), Unix seconds, or an ISO 8601 date or time (UTC unless it has an offset)."
    )
    u.add_argument("--by", choices=("key", "model"), help="one row per key (default) or model")
    u.add_argument(
        "--since", type=moment, metavar="WHEN", help="window start (default: all recorded)"
    )
    u.add_argument("--until", type=moment, metavar="WHEN", help="window end (default: now)")
    u.add_argument(
        "--bucket", type=bucket, metavar="DUR", help="one row per bucket of DUR (e.g. 1h)"
    )


def query(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The usage API's query parameters for the flags given."""
    pairs = (
        ("group_by", args.by),
        ("since", args.since),
        ("until", args.until),
        ("bucket", args.bucket),
    )
    return [(name, value) for name, value in pairs if value is not None]
