"""The llama.cpp adapter (golden argv, validation, finding the binary) and the tiny GGUF
generator. Nothing here needs the llama-server binary; test_llamacpp_fleet.py runs it."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from llmgw.agent.adapters import LlamaCppAdapter, default_adapters
from llmgw.agent.adapters.llamacpp import (
    LLAMA_CPP_BUILD,
    cached_server_path,
    find_llama_server,
)
from llmgw.agent.discovery import fake_gpus
from llmgw.config import DeploymentProfile
from llmgw.domain.fleet import EngineInfo, NodeInfo
from llmgw.testing.gguf import write_tiny_gguf
from llmgw.transport.messages import StartShard

ROOT = Path(__file__).resolve().parent.parent
GPUS = fake_gpus("2x80GB", node_id="n1")
NODE = NodeInfo(node_id="n1", hostname="n1", address="10.0.0.7", gpus=GPUS)
CPU_NODE = NodeInfo(node_id="c1", hostname="c1", address="10.0.0.8")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


def adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(
        ("/opt/llama/llama-server",), threads=2, info=EngineInfo("llamacpp", "b11434")
    )


def start(weights: str, **kw: Any) -> StartShard:
    profile = DeploymentProfile(
        name="cpu",
        engine=kw.pop("engine", "llamacpp"),
        weights=weights,
        tensor_parallel=kw.pop("tp", 1),
        args=tuple(kw.pop("args", ())),
        env=dict(kw.pop("env", {})),
    )
    fields: dict[str, Any] = {
        "command_id": "c1",
        "replica_id": "tiny-r1",
        "rank": 0,
        "epoch": 2,
        "model": "tiny",
        "profile": profile,
        "gpu_indices": (),
        "port": 8200,
    }
    fields.update(kw)
    return StartShard(**fields)


# -- the command -----------------------------------------------------------------------------


def test_golden_argv_on_a_cpu_node(weights: str) -> None:
    cmd = start(weights, args=["--temp", "0.5"], env={"LLAMA_LOG_COLORS": "0"})
    a = adapter()
    assert a.validate(cmd, ()) == []
    spec = a.command(cmd, CPU_NODE)
    assert spec.argv == (
        "/opt/llama/llama-server",
        "-m",
        weights,
        "--host",
        "10.0.0.8",
        "--port",
        "8200",
        "-a",
        "tiny",
        "-np",
        "4",
        "-c",
        "4096",
        "--metrics",
        "--no-webui",
        "-t",
        "2",
        "--temp",
        "0.5",
    )
    assert spec.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
        "LLAMA_LOG_COLORS": "0",
    }
    assert spec.health_url == "http://10.0.0.8:8200/health"
    assert spec.endpoint_url == "http://10.0.0.8:8200"
    assert spec.metrics_url == "http://10.0.0.8:8200/metrics"
    assert spec.capacity == 4  # the adapter's default slots


def test_slots_context_and_threads_from_the_profile_take_their_place(weights: str) -> None:
    args = ["--parallel", "2", "-ngl", "0", "--ctx-size=8192", "-t", "3", "--embeddings"]
    cmd = start(weights, args=args, gpu_indices=(1,))
    a = adapter()
    assert a.validate(cmd, GPUS) == []
    spec = a.command(cmd, NODE)
    argv = spec.argv
    assert argv[argv.index("-np") + 1] == "2"
    assert spec.capacity == 2  # what the router counts it full at
    assert argv[argv.index("-c") + 1] == "8192"
    assert argv[argv.index("-t") + 1] == "3"
    assert argv[-3:] == ("-ngl", "0", "--embeddings")
    for flag in ("--parallel", "--ctx-size=8192", "-np", "-c", "-t"):
        assert argv.count(flag) <= 1
    # A GPU node's shard still gets its GPU selection (a CPU build ignores it).
    assert a.command(cmd, NODE).env["CUDA_VISIBLE_DEVICES"] == "1"


def test_ipv6_address_is_bracketed_in_urls(weights: str) -> None:
    node = NodeInfo(node_id="v6", hostname="v6", address="fd00::5")
    spec = adapter().command(start(weights), node)
    assert spec.argv[spec.argv.index("--host") + 1] == "fd00::5"
    assert spec.health_url == "http://[fd00::5]:8200/health"


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"args": ["--port", "1"]}, "argument --port is set by the agent for llamacpp"),
        ({"args": ["-m", "x.gguf"]}, "argument -m is set by the agent for llamacpp"),
        ({"args": ["-a", "x"]}, "argument -a is set by the agent for llamacpp"),
        ({"args": ["-hf", "org/repo"]}, "argument -hf is set by the agent for llamacpp"),
        ({"args": ["-np", "0"]}, "argument -np needs an integer of at least 1"),
        ({"args": ["-c", "lots"]}, "argument -c needs an integer of at least 0"),
        ({"args": ["-t"]}, "argument -t needs an integer of at least 1"),
        (
            {"args": ["-np", "64", "-c", "4096"]},
            "context 4096 shared by 64 slots leaves 64 tokens per slot (at least 128)",
        ),
        ({"tp": 2}, "tensor_parallel x pipeline_parallel must be 1"),
        ({"engine": "vllm"}, "profile 'cpu' is for engine 'vllm', not 'llamacpp'"),
        ({"gpu_indices": (5,)}, "GPU 5 not on this node"),
    ],
)
def test_validation_refuses(weights: str, kw: dict[str, Any], expected: str) -> None:
    problems = adapter().validate(start(weights, **kw), GPUS)
    assert any(expected in p for p in problems), problems


def test_context_zero_means_the_models_own_and_is_accepted(weights: str) -> None:
    assert adapter().validate(start(weights, args=["-c", "0", "-np", "16"]), ()) == []


def test_missing_weights_and_missing_binary_are_named(tmp_path: Path) -> None:
    absent = LlamaCppAdapter(("/nonexistent/llama-server",))
    problems = absent.validate(start(str(tmp_path / "nope.gguf")), ())
    assert any("no such file on this node" in p for p in problems), problems
    assert any("scripts/llama_server.sh" in p for p in problems), problems


# -- finding the binary ----------------------------------------------------------------------


def _fake_server(path: Path, build: int = 11434) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!/bin/sh\necho 'version: 0.6.0-dev (build {build}, commit abc1234)'\n"
        "echo 'built with GNU 12.2.0 for Linux x86_64'\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_binary_is_found_by_env_then_cache_then_path(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache), "PATH": str(tmp_path / "bin")}
    expected_cache = cache / "llmgw" / "llama.cpp" / f"b{LLAMA_CPP_BUILD}" / "llama-server"
    assert cached_server_path(env) == expected_cache
    assert find_llama_server({**env, "PATH": "/nonexistent"}) is None
    cached = _fake_server(expected_cache)
    assert find_llama_server(env) == str(cached)
    explicit = _fake_server(tmp_path / "elsewhere" / "llama-server")
    assert find_llama_server({**env, "LLAMA_SERVER_BIN": str(explicit)}) == str(explicit)
    assert find_llama_server({**env, "LLAMA_SERVER_BIN": str(tmp_path / "no")}) is None


def test_available_reads_the_build_number(tmp_path: Path) -> None:
    fake = _fake_server(tmp_path / "llama-server")
    a = LlamaCppAdapter((str(fake),))
    assert trio.run(a.available) == EngineInfo("llamacpp", "b11434")
    # Built from a tree without git history: build 0, so the version string.
    no_git = _fake_server(tmp_path / "no-git" / "llama-server", build=0)
    assert trio.run(LlamaCppAdapter((str(no_git),)).available) == EngineInfo(
        "llamacpp", "0.6.0-dev"
    )
    assert trio.run(LlamaCppAdapter(("/nonexistent/llama-server",)).available) is None


def test_registered_by_default_and_the_build_script_builds_the_same_version() -> None:
    assert isinstance(default_adapters()["llamacpp"], LlamaCppAdapter)
    script = (ROOT / "scripts" / "llama_server.sh").read_text()
    match = re.search(r'VERSION="\$\{LLAMA_CPP_VERSION:-(\d+)\}"', script)
    assert match and match.group(1) == LLAMA_CPP_BUILD
    assert os.access(ROOT / "scripts" / "llama_server.sh", os.X_OK)


# -- the tiny model --------------------------------------------------------------------------


def test_tiny_gguf_is_deterministic_per_seed(tmp_path: Path) -> None:
    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    a = write_tiny_gguf(tmp_path / "a.gguf")
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=0)
    c = write_tiny_gguf(tmp_path / "c.gguf", seed=1)
    assert digest(a) == digest(b) != digest(c)
    assert 400_000 < a.stat().st_size < 550_000


def test_tiny_gguf_reads_back_as_a_llama_with_a_chat_template(tmp_path: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "t.gguf"))

    def value(key: str) -> Any:
        return reader.fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("llama.block_count") == 2
    assert value("llama.embedding_length") == 64
    assert value("llama.attention.head_count") == 4
    assert value("llama.feed_forward_length") == 128
    assert value("llama.context_length") == 4096
    assert value("tokenizer.ggml.model") == "gpt2"
    tokens = value("tokenizer.ggml.tokens")
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert value("tokenizer.ggml.merges")
    assert "<|im_start|>" in value("tokenizer.chat_template")
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)


def test_sleep_after_is_llama_servers_own_idle_sleep_in_whole_seconds(weights: str) -> None:
    cmd = start(weights)
    slept = attrs.evolve(cmd, profile=attrs.evolve(cmd.profile, sleep_after=90.5))
    argv = list(adapter().command(slept, CPU_NODE).argv)
    assert argv[argv.index("--sleep-idle-seconds") + 1] == "91"
    assert "--sleep-idle-seconds" not in adapter().command(cmd, CPU_NODE).argv


def test_sleep_after_is_refused_for_a_build_without_idle_sleep(
    tmp_path: Path, weights: str
) -> None:
    cmd = start(weights)
    slept = attrs.evolve(cmd, profile=attrs.evolve(cmd.profile, sleep_after=60.0))
    old = LlamaCppAdapter((str(_fake_server(tmp_path / "old" / "llama-server")),))
    assert trio.run(old.available) is not None and old.sleeps is False
    (problem,) = old.validate(slept, ())
    assert problem == (
        "this llama-server (b11434) has no --sleep-idle-seconds: build a newer one, or remove "
        "the profile's sleep_after"
    )
    assert old.validate(cmd, ()) == []  # without sleep_after it starts as ever
    new = _fake_server(tmp_path / "new" / "llama-server")
    new.write_text(new.read_text() + "echo '--sleep-idle-seconds SECONDS   idle sleep'\n")
    a = LlamaCppAdapter((str(new),))
    assert trio.run(a.available) is not None and a.sleeps is True
    assert a.validate(slept, ()) == []
