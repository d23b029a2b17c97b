"""The base install carries the data plane; the rest is an extra (llmgw.extras,
pyproject.toml's optional dependencies), and a missing one is a line naming it.

"Missing" is made real in a fresh interpreter: a finder first on sys.meta_path refuses
every module the extras bring, as an environment without them would."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import llmgw
from llmgw import extras

from .procs import sim
from .test_library_doc import DOC, example

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Every top-level module the extras bring (quart-trio brings quart and flask).
REFUSED = (
    *("quart", "quart_trio", "flask", "hypercorn", "jinja2"),
    *("rich", "pyinstrument", "psycopg", "opentelemetry"),
)

# Run first in the fresh interpreter: the refusing finder, and at exit a line listing
# what of REFUSED got into sys.modules all the same.
PRELUDE = f"""
import atexit, sys

REFUSED = {REFUSED!r}


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused)", name=name)
        return None


sys.meta_path.insert(0, Refuse())
atexit.register(
    lambda: print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in REFUSED))
)
"""


def _without_extras(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _loaded(out: str) -> str:
    (line,) = re.findall(r"^loaded: .*$", out, re.MULTILINE)
    return str(line)


def test_a_router_alone_serves_without_any_extra() -> None:
    """docs/library.md's router alone, over a real engine (llmgw-sim), imports nothing
    an extra brings."""
    code = example(DOC.read_text(), "## A router alone")
    with sim(model="m") as (_, base):
        done = _without_extras(code, base)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "200 3 tokens"
    assert _loaded(done.stdout) == "loaded: []"
    assert "It prints `200 3 tokens`" in DOC.read_text()


def _script(name: str) -> str:
    """What the console script `name` runs, as pyproject.toml declares it."""
    module, function = PYPROJECT["project"]["scripts"][name].split(":")
    return f"import sys\nfrom {module} import {function}\nsys.argv[0] = {name!r}\n" + (
        f"sys.exit({function}())\n"
    )


@pytest.mark.parametrize(
    ("program", "message"),
    [
        (
            "llmgw-server",
            "llmgw-server: error: llmgw-server needs quart-trio, hypercorn, jinja2, not "
            "installed: pip install 'llmgw[server]'",
        ),
        (
            "llmgw-ctl",
            "llmgw-ctl: error: llmgw-ctl needs rich, not installed: pip install 'llmgw[ctl]'",
        ),
    ],
)
def test_a_program_without_its_extra_says_which_to_install(program: str, message: str) -> None:
    done = _without_extras(_script(program), "--version")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == message


@pytest.mark.parametrize("program", ["llmgw-agent", "llmgw-sim"])
def test_the_agent_and_the_simulator_need_no_extra(program: str) -> None:
    done = _without_extras(_script(program), "--version")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"{program} {llmgw.__version__}\n")
    assert _loaded(done.stdout) == "loaded: []"


def test_assemble_and_a_postgres_store_name_their_extras() -> None:
    code = """
import trio
import llmgw
from llmgw.extras import MissingExtra

try:
    llmgw.load_config(data={"store": {"url": "postgresql://db/llmgw"}}, environ={})
except llmgw.ConfigError as exc:
    print(*exc.problems, sep="\\n")


async def main():
    config = llmgw.load_config(data={"store": {"url": ""}}, environ={})
    try:
        async with llmgw.assemble(config):
            pass
    except MissingExtra as exc:
        print(exc)

trio.run(main)
"""
    done = _without_extras(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[:2] == [
        "store.url: a PostgreSQL store needs psycopg, not installed: pip install 'llmgw[postgres]'",
        "llmgw.assemble (the admin API and dashboard) needs quart-trio, hypercorn, jinja2, "
        "not installed: pip install 'llmgw[server]'",
    ]
    assert _loaded(done.stdout) == "loaded: []"


def test_the_table_is_pyprojects_extras() -> None:
    """Each distribution llmgw.extras names is in that extra of pyproject.toml, `all`
    is every extra, and `dev` (what `make` installs) has `all`."""
    declared = PYPROJECT["project"]["optional-dependencies"]
    for extra, modules in extras.EXTRAS.items():
        names = {re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower() for r in declared[extra]}
        assert set(modules.values()) <= names, extra
    assert declared["all"] == [f"llmgw[{','.join(extras.EXTRAS)}]"]
    assert "llmgw[all]" in declared["dev"]
    base = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    for modules in extras.EXTRAS.values():
        for dist in modules.values():
            assert dist not in base, dist


def test_what_is_installed_is_not_missing() -> None:
    # This environment has the dev extras, so every extra.
    assert [extra for extra in extras.EXTRAS if extras.missing(extra)] == []
    assert extras.needs("x", "server") is None
