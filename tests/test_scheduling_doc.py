"""docs/scheduling.md's custom scorer runs as written and does what the doc says."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "scheduling.md"


def doc_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.DOTALL | re.MULTILINE)
    (code,) = [b for b in blocks if "trio.run(main)" in b]  # the whole program
    return code


def test_the_custom_scorer_example_runs_and_prefers_its_pool(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(doc_example())
    # Bounded, so a hang fails the test instead of the suite.
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # What the doc says it prints: every request on the preferred pool's replica.
    assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == {"gpu-a": 20}
    assert "It prints `{'gpu-a': 20}`" in DOC.read_text()
