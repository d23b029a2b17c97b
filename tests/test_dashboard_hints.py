"""The llmgw-ctl commands the dashboard's pages and the docs tell people to run are ones
llmgw-ctl accepts (the login page said ``keys create ops --admin``, refused: the name is
``--name``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llmgw_cli.ctl import build_parser

ROOT = Path(__file__).resolve().parent.parent
PLACES = [
    *sorted((ROOT / "src/llmgw/dashboard/templates").glob("*.html")),
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
]
# A `keys create` command as the docs quote it (in backticks, maybe across a line break)
# or a template shows it (in <code>).
COMMAND = re.compile(r"(?:`|<code[^>]*>)(llmgw-ctl keys create[^`<]*)")


def commands() -> list[tuple[str, str]]:
    found = []
    for path in PLACES:
        for m in COMMAND.finditer(path.read_text()):
            found.append((path.relative_to(ROOT).as_posix(), " ".join(m.group(1).split())))
    return found


def test_the_places_that_tell_people_to_create_a_key_are_found() -> None:
    where = {path for path, _ in commands()}
    assert "src/llmgw/dashboard/templates/login.html" in where
    assert "docs/dashboard.md" in where


@pytest.mark.parametrize(("path", "command"), commands())
def test_keys_create_commands_parse(path: str, command: str) -> None:
    words = shlex.split(command)
    try:
        args = build_parser().parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"{path}: llmgw-ctl refuses {command!r}")
    assert (args.command, args.action) == ("keys", "create")
