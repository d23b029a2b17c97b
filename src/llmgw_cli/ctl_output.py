"""How `llmgw-ctl` prints: the console its tables go to, JSON for `--json`, and the
generic table for an answer no view in :mod:`llmgw_cli.ctl_views` is written for."""

from __future__ import annotations

import json
import os
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table


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


def stdout() -> Console:
    # Piped output gets 120 columns (or $COLUMNS) rather than rich's 80, so tables stay
    # unwrapped in logs; plain lines never wrap (soft_wrap).
    console = Console(soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(soft_wrap=True, width=120)
    return console


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))
