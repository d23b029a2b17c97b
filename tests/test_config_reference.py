"""docs/operations.md's configuration reference: current, complete, and its defaults
are the configuration's own."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from llmgw import config as cfg
from llmgw import config_reference as ref

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"

_SECTION = re.compile(r"^#### (.+)$", re.M)
_ROW = re.compile(r"^\| `(\w+)` \| (.+?) \| (.+?) \| (.*) \|$", re.M)


def _sections(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """Heading -> its rows (key, type, default)."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    parts = _SECTION.split(text)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        found[heading] = [(m[1], m[2], m[3]) for m in _ROW.finditer(body)]
    return found


def test_the_committed_reference_is_current() -> None:
    document = DOC.read_text()
    assert ref.replace_section(document, ref.reference()) == document, (
        f"docs/operations.md's configuration reference is stale: run {ref.COMMAND}"
    )


def test_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "ops.md"
    doc.write_text(f"# Ops\n\n{ref.BEGIN}\nold\n{ref.END}\n\nafter\n")
    assert ref.main(["--check", str(doc)]) == 1
    assert ref.COMMAND in capsys.readouterr().err
    assert ref.main(["--write", str(doc)]) == 0
    assert ref.main(["--check", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"# Ops\n\n{ref.BEGIN}\n\n#### Top level") and text.endswith(
        f"{ref.END}\n\nafter\n"
    )
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="no section"):
        ref.main(["--write", str(doc)])


def _tables(value: Any, path: str = "") -> dict[str, dict[str, Any]]:
    """Every table of an unstructured configuration by dotted path (arrays of tables
    and dicts of tables by their first element)."""
    found = {path: value}
    for key, item in value.items():
        below = f"{path}.{key}" if path else key
        if isinstance(item, dict) and item and all(isinstance(v, dict) for v in item.values()):
            found.update(_tables(next(iter(item.values())), f"{below}.NAME"))
        elif isinstance(item, dict) and item:  # {}: a table of values (tracing.headers)
            found.update(_tables(item, below))
    return found


def test_every_table_and_key_of_the_defaults_is_there() -> None:
    sections = _sections(ref.reference())
    headers = {h for heading in sections for h in re.findall(r"`\[\[?([\w.]+)\]\]?`", heading)}
    for path, table in _tables(cfg.converter.unstructure(cfg.Config())).items():
        heading = next((h for h in sections if f"`[{path}]`" in h), None) if path else "Top level"
        assert heading is not None, path
        assert [k for k, _, _ in sections[heading]] == list(table), path
    # Arrays of tables (empty by default) have theirs too.
    assert {"endpoints", "models", "models.profiles", "router.admission.bands"} <= headers


def test_the_defaults_shown_are_the_configurations() -> None:
    """Each default written inline, read back as TOML into its table, gives the
    configuration's own defaults."""
    data: dict[str, Any] = {}
    for heading, rows in _sections(ref.reference()).items():
        paths = re.findall(r"`\[([\w.]+)\]`", heading) if heading != "Top level" else [""]
        for path in paths:
            if path.endswith(".NAME"):
                continue
            shown = {
                key: tomllib.loads(f"v = {default.strip('`')}")["v"]
                for key, _, default in rows
                if default.startswith("`") and default.endswith("`")
            }
            if not shown:
                continue
            table: Any = data
            for part in filter(None, path.split(".")):
                table = table.setdefault(part, {}) if isinstance(table, dict) else None
            if isinstance(table, dict):  # not a table inside an array (models.autoscale)
                table.update(shown)
    assert data["router"]["timeouts"]["total"] == "30m"  # written as durations
    assert data["router"]["max_body_bytes"] == "32MiB"  # and sizes
    assert cfg.load(data=data, environ={}) == cfg.Config()
