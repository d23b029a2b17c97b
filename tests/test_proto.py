"""The generated protobuf code: current with proto/, and importable where it lives.

`buf lint proto` runs in CI (`make lint`), not here: it needs node and the buf binary.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_proto.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_check_mode_catches_stale_missing_and_extra_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = load_generator()
    out = tmp_path / "pb"
    shutil.copytree(generator.OUT, out, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(generator, "OUT", out)
    files = generator.generate()
    assert generator.check(files) == []

    (out / "agent_pb2.pyi").write_text("stale\n")
    (out / "agent_pb2_grpc.py").unlink()
    (out / "old_pb2.py").write_text("")
    problems = generator.check(files)
    assert [p.split(":")[0] for p in problems] == [
        "old_pb2.py",
        "agent_pb2.pyi",
        "agent_pb2_grpc.py",
    ]


def test_generated_modules_live_in_the_package() -> None:
    from llmgw.transport.pb import agent_pb2, agent_pb2_grpc

    assert agent_pb2.Register.__module__ == "llmgw.transport.pb.agent_pb2"
    assert agent_pb2.DESCRIPTOR.package == "llmgw.agent.v1"  # the wire names stay
    assert agent_pb2_grpc.AgentServiceStub.__module__ == "llmgw.transport.pb.agent_pb2_grpc"
    service = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
    connect = service.methods_by_name["Connect"]
    assert (connect.client_streaming, connect.server_streaming) == (True, True)
