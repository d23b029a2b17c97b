"""deploy/systemd: the units operators install, checked by systemd's own tools, and the
server's side of their contract (SIGHUP, the unit's ExecReload, must not end it).

`systemd-analyze verify` needs the programs a unit runs to exist: the shipped units
name /opt/llmgw/bin (docs/operations.md installs llmgw there), so each is checked as a
copy with that directory replaced by this venv's bin, everything else as shipped.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .procs import server, sim, wait_for

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
UNITS = ("llmgw-server.service", "llmgw-agent.service")
INSTALLED_BIN = "/opt/llmgw/bin/"
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"

# `systemd-analyze security` exposure levels (0 best, 10 worst) the units must stay
# under: the server is sandboxed tightly; the agent less, for its engines (its unit
# says what is left open and why).
EXPOSURE_AT_MOST = {"llmgw-server.service": 2.0, "llmgw-agent.service": 2.5}


def _analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not Path(ANALYZE).exists():
        pytest.fail("systemd-analyze is missing: apt-get install systemd (scripts/test_deps.sh)")
    return subprocess.run(
        [ANALYZE, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The shipped units in `tmp_path`, running this venv's programs."""
    here = str(Path(sys.executable).parent) + "/"
    for name in UNITS:
        text = (DEPLOY / name).read_text()
        assert text.count(f"ExecStart={INSTALLED_BIN}") == 1, name
        (tmp_path / name).write_text(text.replace(INSTALLED_BIN, here))
    return tmp_path


def test_units_verify_without_a_warning(units: Path) -> None:
    # verify exits 0 on unknown keys and bad values (it warns and ignores them), so
    # any output at all fails.
    done = _analyze("verify", "--man=no", *(f"./{u}" for u in UNITS), cwd=units)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_verify_names_what_it_ignores(units: Path) -> None:
    """The check above can fail: a key this systemd does not know is reported."""
    unit = units / UNITS[0]
    unit.write_text(unit.read_text().replace("[Service]\n", "[Service]\nRestartStepz=5\n"))
    done = _analyze("verify", "--man=no", f"./{UNITS[0]}", cwd=units)
    assert "Unknown key 'RestartStepz'" in done.stdout + done.stderr


@pytest.mark.parametrize("name", UNITS)
def test_units_stay_sandboxed(units: Path, name: str) -> None:
    done = _analyze("security", "--offline=yes", f"./{name}", cwd=units)
    found = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    assert float(found[1]) <= EXPOSURE_AT_MOST[name], done.stdout


def test_sysusers_creates_the_units_user(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers") or "/usr/bin/systemd-sysusers"
    done = subprocess.run(
        [sysusers, "--dry-run", f"--root={tmp_path}", str(DEPLOY / "llmgw.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    users = {
        m[1]
        for unit in UNITS
        for m in re.finditer(r"^User=(\S+)$", (DEPLOY / unit).read_text(), re.M)
    }
    assert users == {"llmgw"}
    assert "Creating user 'llmgw'" in out, out


def test_sighup_without_tls_keeps_the_server_serving() -> None:
    """ExecReload sends SIGHUP whatever the configuration: a server with no TLS
    listener logs that there is nothing to reload and goes on (SIGHUP's default action
    would end it, and Restart=on-failure does not restart a process SIGHUP ended)."""
    with sim() as (_, engine), server("--endpoint", f"e={engine}=sim-model") as srv:
        srv.proc.kill(signal.SIGHUP)
        wait_for(
            lambda: "SIGHUP: no TLS listener to reload" in srv.proc.output(),
            "the SIGHUP logged",
            10,
            context=srv.proc.output,
        )
        assert srv.proc.popen.poll() is None, srv.proc.output()
        reply = httpx.post(
            f"{srv.base}/v1/completions",
            json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        assert srv.proc.stop() == 0, srv.proc.output()
