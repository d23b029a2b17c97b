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
from typing import NoReturn

from llmgw import __version__, logs, units

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


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def float_in(low: float, high: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def duration_at_least(minimum: float) -> Callable[[str], float]:
    """A duration (``250ms``, ``5s``, ``10m``) of at least `minimum` seconds."""

    def parse(text: str) -> float:
        try:
            value = units.parse_duration(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}s, got {text}")
        return value

    return parse
