"""What every llmgw command shares: exit codes, one-line errors, --version, logging."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import httpx

from llmgw import logs, units
from llmgw.version import __version__

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


class CliError(Exception):
    """An error to print as one line, with the exit code it deserves."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def fail(prog: str, message: str, code: int) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def find_error(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first `kind` in `exc`, looking inside exception groups (trio's nurseries)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_error(inner, kind)
            if found is not None:
                return found
    return None


def os_reason(exc: OSError) -> str:
    """An OSError's reason as the clause that ends a line ("address already in use"):
    its strerror (not ``[Errno 98] ...``), the first letter lowered unless it starts an
    acronym."""
    text = exc.strerror or str(exc)
    if text[:1].isupper() and not text[1:2].isupper():
        text = text[0].lower() + text[1:]
    return text


def os_error_line(exc: OSError, doing: str) -> str:
    """One line for an OSError met while `doing` something ("cannot listen on ...").
    The system's own errors get `doing` in front; those llmgw composed, which say what
    failed already ("cannot write the ready file ...", the agent listener's "cannot
    listen on ..."), are kept as they are."""
    raw = isinstance(exc, socket.gaierror) or (
        exc.errno is not None and exc.strerror == os.strerror(exc.errno)
    )
    return f"{doing}: {os_reason(exc)}" if raw else os_reason(exc)


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"{prog} {__version__}")
    return p


def parse_or_fail(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`argv` parsed by `p`; an error is one line (`fail`, exit 2) instead of argparse's
    usage dump."""
    p.exit_on_error = False
    try:
        # parse_known_args: parse_args reports unknown arguments through p.error, which
        # ignores exit_on_error.
        args, extra = p.parse_known_args(argv)
    except argparse.ArgumentError as e:
        fail(p.prog, str(e), EXIT_USAGE)
    if extra:
        fail(p.prog, f"unrecognized arguments: {' '.join(extra)}", EXIT_USAGE)
    return args


# -- --log-level, --log-format ----------------------------------------------------------


def add_log_flags(
    p: argparse.ArgumentParser, level: str | None = "info", fmt: str | None = "text"
) -> None:
    """--log-level and --log-format, defaulting to `level` and `fmt`; None leaves a flag
    not given unset (the agent's --config file may set it; its defaults are info and
    text too)."""
    p.add_argument(
        "--log-level", choices=logs.LEVELS, default=level, help=f"(default {level or 'info'})"
    )
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=fmt,
        help="log lines on standard error as text or one JSON object per line "
        f"(default {fmt or 'text'})",
    )


def setup_logging(args: argparse.Namespace) -> None:
    """Logging as the flags of :func:`add_log_flags` say."""
    logs.setup(args.log_level, args.log_format)


# -- --ready-file ---------------------------------------------------------------------

READY_FILE_HELP = (
    "once every listener is bound, write their addresses to PATH as a JSON object "
    '(e.g. {"listen": ["127.0.0.1:41234"]}), atomically; removed on exit. With port 0 '
    "(the kernel picks one) this is how a supervisor or test learns the port"
)


def write_ready_file(path: str | os.PathLike[str], listening: Mapping[str, Sequence[str]]) -> None:
    """Write `listening` (listener name -> bound ``HOST:PORT`` addresses) to `path` as a
    JSON object, atomically: a temporary file in the same directory, then a rename, so
    a reader sees the whole file or none."""
    target = Path(path)
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the ready file {target}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({name: list(addresses) for name, addresses in listening.items()}, f)
            f.write("\n")
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def check_ready_file(path: str | None) -> None:
    """CliError (exit 1, as when writing it fails) unless `path` could be written: its
    directory exists. Checked before serving, so a typo fails at once as one line
    rather than after the listeners are up and have logged."""
    if path is None:
        return
    folder = Path(path).parent
    if not folder.is_dir():
        raise CliError(f"cannot write the ready file {path}: no directory {folder}", EXIT_RUNTIME)


@contextlib.contextmanager
def ready_file(path: str | None) -> Iterator[None]:
    """Around a run with ``--ready-file PATH``: a file left by an earlier run is removed
    first (it would name ports no longer served), and the file is removed on the way
    out, so it exists while the program serves."""
    if path is None:
        yield
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# -- argument types: each names the rule a bad value breaks --------------------------
#
# One wording for all of llmgw's commands: "expected <what>, got <text>" when the text
# is not of the kind, and "must not be negative", "must be at least LO" or "must be
# from LO to HI" when it is out of range.


def _bound(value: float, text: str, low: float, high: float | None) -> None:
    if high is not None and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}, got {text}")
    if not value >= low:
        rule = "must not be negative" if low == 0 else f"must be at least {low:g}"
        raise argparse.ArgumentTypeError(f"{rule}, got {text}")


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number from `low` (to `high`)."""

    def parse(text: str) -> int:
        value = _whole(text)
        _bound(value, str(value), low, high)
        return value

    return parse


def float_in(low: float, high: float | None = None) -> Callable[[str], float]:
    """A number from `low` (to `high`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        _bound(value, text, low, high)
        return value

    return parse


def _duration(text: str) -> float:
    try:
        return units.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def duration_at_least(minimum: float) -> Callable[[str], float]:
    """A duration (``250ms``, ``5s``, ``10m``) of at least `minimum` seconds."""

    def parse(text: str) -> float:
        value = _duration(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}s, got {text}")
        return value

    return parse


def positive_duration(text: str) -> float:
    """A duration longer than none (a timeout, a lifetime, a bucket)."""
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def int_list(low: int) -> Callable[[str], list[int]]:
    """Comma-separated whole numbers (``1,2,4,8``), each at least `low`."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated whole numbers like 1,2,4,8, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected whole numbers, got {text!r}")
        for value in values:
            _bound(value, text, low, None)
        return values

    return parse


def name_list(text: str) -> list[str]:
    """Comma-separated names (``a,b``), none empty."""
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names like a,b, got {text!r}")
    return names


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE``, as written (a query parameter)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def header(text: str) -> tuple[str, str]:
    """An HTTP header as ``Name: value``."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def http_url(text: str) -> str:
    """An http:// or https:// URL with a host: a bad one is refused before any request,
    as one line, not reported per failed request after the run."""
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise argparse.ArgumentTypeError(f"invalid URL {text!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"invalid URL {text!r}: use http://HOST[:PORT] or https://HOST[:PORT]"
        )
    return text
