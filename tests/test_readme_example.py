"""The README's `llmgw.testing` example runs as written, and llmgw.testing's docstring
shows the same code, so the documented example cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import llmgw.testing

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## For code built on llmgw"


def readme_example() -> str:
    """The first python block of the README's section on llmgw.testing."""
    text = README.read_text()
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    match = re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert match is not None, f"no python block under {SECTION!r} in README.md"
    return match.group(1)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    code = readme_example()
    assert "llmgw.testing.fleet(" in code and "trio.run(" in code
    script = tmp_path / "example.py"
    script.write_text(code)
    # Its own interpreter (this venv's), as a reader would run it; bounded, so a hang
    # fails the test instead of the suite.
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example printed no completion text"


def test_the_testing_module_docstring_shows_the_same_example() -> None:
    assert llmgw.testing.__doc__ is not None
    assert textwrap.indent(readme_example(), "    ") in llmgw.testing.__doc__
