"""llmgw's modules import each other without a cycle (issue #18): every import counts,
at the top, under `if TYPE_CHECKING:` or inside a function, since a cycle hidden in a
function is still two modules that cannot be understood (or moved) one without the
other. So do imports by a name in a string: `importlib.import_module("llmgw.x")` with
a literal name, a package's lazy public-name table `_HOMES` (PEP 562, as
llmgw/__init__.py's: name -> (module, attribute)), and a "module:attribute" reference
(an entry point's spelling, resolved later by whoever reads it). Shared values live
below their users, in llmgw.domain, which imports nothing above it and names no module
at run time."""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGES = ("llmgw", "llmgw_cli")
# "pkg.module:attribute", the whole of a string.
_REFERENCE = re.compile(r"([A-Za-z_][\w.]*):([A-Za-z_]\w*)")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).rglob("*.py")):
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_import_module(func: ast.expr) -> bool:
    """`importlib.import_module` or a bare `import_module` (from importlib)."""
    if isinstance(func, ast.Attribute):
        owner = func.value
        is_importlib = isinstance(owner, ast.Name) and owner.id == "importlib"
        return is_importlib and func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id == "import_module"


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _homes(table: ast.expr, modules: Collection[str]) -> set[str]:
    """The modules a lazy public-name table names: a pair (pkg, x) counts as
    `from pkg import x`, any other string as a module's name."""
    found: set[str] = set()
    paired: set[int] = set()
    for node in ast.walk(table):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            base, attribute = (_string(e) for e in node.elts)
            if base is not None and attribute is not None:
                sub = f"{base}.{attribute}"
                found.add(sub if sub in modules else base)
                paired.update(id(e) for e in node.elts)
        elif isinstance(node, ast.expr) and id(node) not in paired:
            text = _string(node)
            if text is not None:
                found.add(text)
    return found


def _imports(name: str, is_package: bool, source: str, modules: Collection[str]) -> set[str]:
    """The modules of ours that module `name` imports: `from pkg import x` counts as
    pkg.x when x is a submodule, else as pkg (whose __init__ must hold x). A string
    import counts: `importlib.import_module` with a literal name, the module names in a
    table assigned to `_HOMES` (a pair (pkg, x) as `from pkg import x`), and a string
    "pkg.module:x" naming a module of ours (as `from pkg.module import x`)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        text = _string(node) if isinstance(node, ast.expr) else None
        reference = _REFERENCE.fullmatch(text) if text is not None else None
        if reference is not None and reference[1] in modules:
            sub = f"{reference[1]}.{reference[2]}"
            targets.add(sub if sub in modules else reference[1])
        if isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            literal = _string(node.args[0])
            if literal is not None and not literal.startswith("."):
                targets.add(literal)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            assigned = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_HOMES" for t in assigned):
                targets.update(_homes(node.value, modules))
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


def test_the_resolver_follows_string_imports() -> None:
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "q"}
    source = (
        "import importlib\n"
        "from importlib import import_module\n"
        "_HOMES = {'A': ('p.a', 'A'), 'sub': ('p', 'sub'), 'Q': ('q', 'Q')}\n"
        "def __getattr__(name):\n"
        "    module, attribute = _HOMES[name]\n"
        "    return getattr(importlib.import_module(module), attribute)\n"
        "def f():\n"
        "    return importlib.import_module('p.b'), import_module('p.c'), import_module('os')\n"
        "def g(name):\n"
        "    return importlib.import_module(name), importlib.import_module('.d', 'p')\n"
    )
    # The table's pairs as `from p.a import A`, `from p import sub`, `from q import Q`;
    # literal names of ours; a name only known at run time, or relative, is not seen.
    assert _imports("p", True, source, modules) == {"p.a", "p.sub", "q", "p.b", "p.c"}
    # A "module:attribute" string naming one of ours is an import of it, wherever it
    # stands (how llmgw.domain.engines once named the agent's adapters); other strings
    # with a colon are not.
    source = "ADAPTER = 'p.sub.e:Adapter'\nHOOK = dict(at='p:sub')\nURL = 'http://q:80'\n"
    assert _imports("p.c", False, source, modules | {"p.sub.e"}) == {"p.sub.e", "p.sub"}
    # A cycle that only a string import closes is a cycle.
    graph = {
        "p": _imports("p", True, "_HOMES = {'A': ('p.a', 'A')}\n", modules),
        "p.a": _imports("p.a", False, "def f():\n    import_module('p.b')\n", modules),
        "p.b": _imports("p.b", False, "import p\n", modules),
    }
    assert _a_cycle(graph) == ["p", "p.a", "p.b", "p"]


def test_llmgw_has_no_import_cycle() -> None:
    cycle = _a_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_domain_layer_imports_nothing_above_it() -> None:
    # llmgw.domain is below every other part (docs/DESIGN.md): it imports only itself
    # and modules that import nothing of ours, and resolves no module by a name made at
    # run time, which this graph could not see.
    graph = _graph()
    leaves = {n for n, targets in graph.items() if not targets}
    domain = {n for n in graph if n == "llmgw.domain" or n.startswith("llmgw.domain.")}
    above = {n: sorted(graph[n] - domain - leaves) for n in sorted(domain)}
    assert {n: targets for n, targets in above.items() if targets} == {}
    dynamic = [n for n in sorted(domain) if "importlib" in _top_level_imports(_modules()[n])]
    assert dynamic == []


def _top_level_imports(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports (absolute imports only)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_of_llmgw_imports_the_package_root() -> None:
    # `llmgw/__init__.py` imports the whole public API: a module that imports it back
    # closes a cycle through every module the API names.
    graph = _graph()
    importers = sorted(n for n, targets in graph.items() if "llmgw" in targets)
    assert [n for n in importers if n.startswith("llmgw.")] == []
