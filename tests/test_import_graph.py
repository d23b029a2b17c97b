"""llmgw's modules import each other without a cycle (issue #18): every import counts,
at the top, under `if TYPE_CHECKING:` or inside a function, since a cycle hidden in a
function is still two modules that cannot be understood (or moved) one without the
other. Shared values live below their users, in llmgw.domain."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGES = ("llmgw", "llmgw_cli")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).rglob("*.py")):
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, is_package: bool, source: str, modules: Collection[str]) -> set[str]:
    """The modules of ours that module `name` imports: `from pkg import x` counts as
    pkg.x when x is a submodule, else as pkg (whose __init__ must hold x)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # Relative: `.` is this module's package (a package's own for __init__).
                anchor = name.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imports(name, path.name == "__init__.py", path.read_text(), modules)
        for name, path in modules.items()
    }


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (iterative DFS: no recursion limit)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        state[start] = 1
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                state[path.pop()] = 2
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_resolver_sees_every_kind_of_import() -> None:
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "p.sub.e", "q"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "import q\n"
        "from p import a, thing\n"
        "from . import e\n"
        "if TYPE_CHECKING:\n"
        "    from p.b import B\n"
        "def f():\n"
        "    from ..c import C\n"
        "    import p.d\n"
    )
    # In p.sub.x, `.` is p.sub and `..` is p; `from p import thing` is the package p.
    found = _imports("p.sub.x", False, source, modules)
    assert found == {"q", "p", "p.a", "p.sub.e", "p.b", "p.c", "p.d"}
    # In a package's __init__, `.` is the package itself.
    assert _imports("p.sub", True, "from .e import E\n", modules) == {"p.sub.e"}
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_llmgw_has_no_import_cycle() -> None:
    cycle = _a_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_of_llmgw_imports_the_package_root() -> None:
    # `llmgw/__init__.py` imports the whole public API: a module that imports it back
    # closes a cycle through every module the API names.
    graph = _graph()
    importers = sorted(n for n, targets in graph.items() if "llmgw" in targets)
    assert [n for n in importers if n.startswith("llmgw.")] == []
