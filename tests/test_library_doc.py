"""docs/library.md's custom gateway runs as written and does what the doc says: a
scorer registered from Python and named in the configuration decides, in front of a
fleet whose agents reach the server over the in-memory transport."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "library.md"


def example(doc: str, heading: str = "## A complete custom gateway") -> str:
    """The Python block of the section under `heading`."""
    section = doc.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    return str(code)


def run(code: str, tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(code)
    # Bounded, so a hang fails the test instead of the suite.
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_custom_gateway_runs_and_its_scorer_decides(tmp_path: Path) -> None:
    doc = DOC.read_text()
    assert run(example(doc), tmp_path) == "1 replica served 20 requests"
    assert "It prints `1 replica served 20 requests`" in doc


def test_without_the_scorer_the_replicas_share_the_requests(tmp_path: Path) -> None:
    """What the doc says of the configuration without the scorer's line: the number
    above is the scorer's doing (20 prompts of their own, each replica equally idle:
    all on one by chance is 2 in 2**20)."""
    code = example(DOC.read_text())
    line = '"router": {"profiles": {"chat": {"scorers": {"first-replica": 5.0}}}},'
    assert line in code
    assert run(code.replace(line, ""), tmp_path) == "2 replica served 20 requests"
