"""Engine adapters: golden argv and environment per engine, single and multi-node, and
the validation that refuses a shard before anything is launched."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import attrs
import pytest

from llmgw.agent.adapters import SglangAdapter, SimAdapter, VllmAdapter
from llmgw.agent.adapters.base import flag_int, flag_name
from llmgw.agent.adapters.sim import sim_capacity
from llmgw.agent.discovery import fake_gpus
from llmgw.config import DeploymentProfile
from llmgw.domain.fleet import EngineInfo, NodeInfo
from llmgw.transport.messages import StartShard

GPUS = fake_gpus("8x80GB:H100", node_id="gpu-1")
NODE = NodeInfo(node_id="gpu-1", hostname="gpu-1", address="10.0.0.5", gpus=GPUS)
HEAD = NodeInfo(node_id="gpu-0", hostname="gpu-0", address="10.0.0.4", gpus=GPUS)

VLLM = VllmAdapter(info=EngineInfo("vllm", "0.11.0"))
SGLANG = SglangAdapter(python="/opt/sglang/bin/python", info=EngineInfo("sglang", "0.5.3"))
SIM = SimAdapter()


def start(engine: str, **kw: Any) -> StartShard:
    profile = DeploymentProfile(
        name=kw.pop("profile_name", "p"),
        engine=engine,
        weights=kw.pop("weights", "meta-llama/Llama-3.1-8B-Instruct"),
        tensor_parallel=kw.pop("tp", 1),
        pipeline_parallel=kw.pop("pp", 1),
        args=tuple(kw.pop("args", ())),
        env=dict(kw.pop("env", {})),
    )
    fields: dict[str, Any] = {
        "command_id": "c1",
        "replica_id": "llama-r3",
        "rank": 0,
        "epoch": 3,
        "model": "llama-3.1-8b",
        "profile": profile,
        "gpu_indices": (0,),
        "port": 8100,
    }
    fields.update(kw)
    return StartShard(**fields)


# -- vLLM ------------------------------------------------------------------------------------


def test_vllm_single_node() -> None:
    cmd = start(
        "vllm",
        tp=2,
        gpu_indices=(2, 3),
        args=["--max-model-len", "32768"],
        env={"VLLM_LOGGING_LEVEL": "INFO"},
    )
    assert VLLM.validate(cmd, GPUS) == []
    spec = VLLM.command(cmd, NODE)
    assert spec.argv == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "10.0.0.5",
        "--port",
        "8100",
        "--served-model-name",
        "llama-3.1-8b",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--max-model-len",
        "32768",
    )
    assert spec.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "PYTHONUNBUFFERED": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    assert spec.health_url == "http://10.0.0.5:8100/health"
    assert spec.endpoint_url == "http://10.0.0.5:8100"
    assert spec.metrics_url == "http://10.0.0.5:8100/metrics"


def _multinode(engine: str, rank: int, **kw: Any) -> StartShard:
    return start(
        engine,
        tp=8,
        pp=2,
        rank=rank,
        node_count=2,
        gpu_indices=tuple(range(8)),
        master_address="10.0.0.4",
        master_port=29511,
        mgmt_interface="ib0",
        **kw,
    )


def test_vllm_multi_node_head_and_headless_worker() -> None:
    head = _multinode("vllm", 0)
    worker = _multinode("vllm", 1)
    assert VLLM.validate(head, GPUS) == []
    assert VLLM.validate(worker, GPUS) == []
    shared = (
        "--served-model-name",
        "llama-3.1-8b",
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "2",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
    )
    h = VLLM.command(head, HEAD)
    assert h.argv == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "10.0.0.4",
        "--port",
        "8100",
        *shared,
        "--node-rank",
        "0",
        "--master-addr",
        "10.0.0.4",
        "--master-port",
        "29511",
    )
    w = VLLM.command(worker, NODE)
    assert w.argv == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "10.0.0.5",
        "--port",
        "8100",
        *shared,
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.4",
        "--master-port",
        "29511",
        "--headless",
    )
    assert w.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "PYTHONUNBUFFERED": "1",
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
        "VLLM_HOST_IP": "10.0.0.5",
    }
    assert h.env["VLLM_HOST_IP"] == "10.0.0.4"
    assert (h.health_url, h.endpoint_url) == ("http://10.0.0.4:8100/health", "http://10.0.0.4:8100")
    assert (w.health_url, w.endpoint_url, w.metrics_url) == (None, None, None)


def test_profile_env_overrides_interfaces_but_never_gpus() -> None:
    cmd = _multinode("vllm", 1, env={"NCCL_SOCKET_IFNAME": "=ib1", "NCCL_IB_HCA": "mlx5"})
    env = VLLM.command(cmd, NODE).env
    assert env["NCCL_SOCKET_IFNAME"] == "=ib1"
    assert env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["NCCL_IB_HCA"] == "mlx5"


def test_ipv6_management_address_is_bracketed_in_urls() -> None:
    node = NodeInfo(node_id="v6", hostname="v6", address="fd00::5", gpus=GPUS)
    spec = VLLM.command(start("vllm"), node)
    assert spec.argv[3:5] == ("--host", "fd00::5")
    assert spec.endpoint_url == "http://[fd00::5]:8100"


# -- SGLang ----------------------------------------------------------------------------------


def test_sglang_single_node() -> None:
    cmd = start("sglang", tp=4, gpu_indices=(4, 5, 6, 7), args=["--mem-fraction-static", "0.8"])
    assert SGLANG.validate(cmd, GPUS) == []
    spec = SGLANG.command(cmd, NODE)
    assert spec.argv == (
        "/opt/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "10.0.0.5",
        "--port",
        "8100",
        "--served-model-name",
        "llama-3.1-8b",
        "--tp",
        "4",
        "--enable-metrics",
        "--mem-fraction-static",
        "0.8",
    )
    assert spec.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "PYTHONUNBUFFERED": "1",
    }
    assert spec.health_url == "http://10.0.0.5:8100/health"
    assert spec.endpoint_url == "http://10.0.0.5:8100"


def test_sglang_multi_node() -> None:
    for rank, node in ((0, HEAD), (1, NODE)):
        cmd = _multinode("sglang", rank)
        assert SGLANG.validate(cmd, GPUS) == []
        spec = SGLANG.command(cmd, node)
        assert spec.argv == (
            "/opt/sglang/bin/python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--host",
            node.address,
            "--port",
            "8100",
            "--served-model-name",
            "llama-3.1-8b",
            "--tp",
            "8",
            "--pp-size",
            "2",
            "--enable-metrics",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            "10.0.0.4:29511",
        )
        assert spec.env == {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "PYTHONUNBUFFERED": "1",
            "NCCL_SOCKET_IFNAME": "ib0",
            "GLOO_SOCKET_IFNAME": "ib0",
        }
        assert (spec.endpoint_url is not None) == (rank == 0)


def test_sglang_ipv6_dist_init_addr() -> None:
    cmd = _multinode("sglang", 1)
    cmd = attrs.evolve(cmd, master_address="fd00::4")
    spec = SGLANG.command(cmd, NODE)
    assert spec.argv[-1] == "[fd00::4]:29511"


# -- the simulator ---------------------------------------------------------------------------


def test_sim_single_and_multi_node() -> None:
    cmd = start("sim", weights="sim", args=["--max-num-seqs", "8"])
    assert SIM.validate(cmd, GPUS) == []
    spec = SIM.command(cmd, NODE)
    assert spec.argv == (
        sys.executable,
        "-m",
        "llmgw_cli.sim",
        "--host",
        "10.0.0.5",
        "--port",
        "8100",
        "--model",
        "llama-3.1-8b",
        "--max-num-seqs",
        "8",
    )
    assert spec.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONUNBUFFERED": "1",
    }
    assert spec.health_url == "http://10.0.0.5:8100/health"
    assert spec.endpoint_url == "http://10.0.0.5:8100"

    worker = start(
        "sim",
        weights="sim",
        rank=1,
        node_count=2,
        gpu_indices=(0,),
        master_address="10.0.0.4",
        master_port=29511,
        mgmt_interface="eth1",
    )
    assert SIM.validate(worker, GPUS) == []
    w = SIM.command(worker, NODE)
    assert w.argv[3:9] == ("--host", "10.0.0.5", "--port", "8100", "--model", "llama-3.1-8b")
    assert w.env["NCCL_SOCKET_IFNAME"] == w.env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert w.health_url == "http://10.0.0.5:8100/health"  # a real process, health-checked
    assert w.endpoint_url is None  # but not the replica's endpoint


def test_sim_runs_without_gpus() -> None:
    assert SIM.validate(start("sim", gpu_indices=()), ()) == []
    assert SIM.command(start("sim", gpu_indices=()), NODE).env["CUDA_VISIBLE_DEVICES"] == ""


async def test_availability() -> None:
    assert await SIM.available() == EngineInfo("sim", SIM.info.version if SIM.info else None)
    missing = VllmAdapter(command=("/nonexistent/vllm",))
    assert await missing.available() is None
    assert "vllm is not installed on this node" in missing.validate(start("vllm"), GPUS)
    assert await SglangAdapter(python="/nonexistent/python").available() is None
    if importlib.util.find_spec("sglang") is None:  # not in the test environment
        assert await SglangAdapter().available() is None


async def test_vllm_version_probe(tmp_path: Any) -> None:
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho 'INFO 11-30 some log line'\necho 0.11.2\n")
    fake.chmod(0o755)
    adapter = VllmAdapter(command=(str(fake),))
    assert await adapter.available() == EngineInfo("vllm", "0.11.2")
    assert adapter.validate(start("vllm"), GPUS) == []


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "cmd", "expected"),
    [
        (VLLM, start("vllm", args=["--port", "9000"]), "argument --port is set by the agent"),
        (VLLM, start("vllm", args=["--tensor_parallel_size=2"]), "--tensor-parallel-size is set"),
        (VLLM, start("vllm", args=["-tp", "2"]), "argument -tp is set by the agent"),
        (VLLM, start("vllm", args=["--data-parallel-size", "2"]), "--data-parallel-size is set"),
        (SGLANG, start("sglang", args=["--tp-size", "2"]), "argument --tp-size is set"),
        (SGLANG, start("sglang", args=["--model-path=/w"]), "argument --model-path is set"),
        (SIM, start("sim", args=["--model", "x"]), "argument --model is set"),
        (
            VLLM,
            start("vllm", args=["--max-model-len 4096"]),
            "looks like a flag and its value in one item",
        ),
        (VLLM, start("vllm", env={"CUDA_VISIBLE_DEVICES": "0"}), "CUDA_VISIBLE_DEVICES is set"),
        (VLLM, start("vllm", env={"BAD NAME": "x"}), "name 'BAD NAME' is not valid"),
        (VLLM, start("vllm", gpu_indices=(9,)), "GPU 9 not on this node"),
        (VLLM, start("vllm", gpu_indices=(1, 1), tp=2), "GPU indices listed twice: 1"),
        (VLLM, start("vllm", gpu_indices=()), "vllm needs GPUs and the shard was given none"),
        (
            VLLM,
            start("vllm", tp=4, gpu_indices=(0, 1)),
            "tensor_parallel 4 x pipeline_parallel 1 = 4 GPUs, but the shard has 2 GPU(s) "
            "on each of 1 node(s)",
        ),
        (
            SGLANG,
            start("sglang", tp=8, pp=2, node_count=2, gpu_indices=(0, 1, 2, 3)),
            "= 16 GPUs, but the shard has 4 GPU(s) on each of 2 node(s)",
        ),
        (
            VLLM,
            start("vllm", node_count=2, rank=0, tp=2),
            "a multi-node shard needs the master address",
        ),
        (VLLM, start("vllm", rank=1), "rank 1 is outside 0..0"),
        (VLLM, start("vllm", port=0), "port 0 is outside 1..65535"),
        (VLLM, start("sglang"), "is for engine 'sglang', not 'vllm'"),
        (
            VLLM,
            _multinode("vllm", 0, args=["--distributed-executor-backend", "ray"]),
            "--distributed-executor-backend is set by the agent",
        ),
    ],
)
def test_validation_problems(adapter: Any, cmd: StartShard, expected: str) -> None:
    problems = adapter.validate(cmd, GPUS)
    assert any(expected in p for p in problems), problems


def test_values_that_look_like_numbers_or_json_are_not_flags() -> None:
    cmd = start(
        "vllm",
        args=[
            "--override-generation-config",
            '{"temperature": -1, "top_p": 0.9}',
            "--seed",
            "-1",
            "--chat-template",
            "a template with spaces",
        ],
    )
    assert VLLM.validate(cmd, GPUS) == []
    # The executor backend is the profile's to choose on one node.
    assert VLLM.validate(start("vllm", args=["--distributed-executor-backend", "ray"]), GPUS) == []


def test_flag_name() -> None:
    assert flag_name("--max_num_seqs=8") == "--max-num-seqs"
    assert flag_name("-tp") == "-tp"
    assert flag_name("-1") is None
    assert flag_name("-1.5e3") is None
    assert flag_name("value") is None
    assert flag_name("-") is None


def test_flag_int() -> None:
    assert flag_int(["--max-num-seqs", "8"], "--max-num-seqs") == 8
    assert flag_int(["--max_num_seqs=16"], "--max-num-seqs") == 16
    # The last one counts, as argparse reads it.
    assert flag_int(["--max-num-seqs", "8", "--max-num-seqs=32"], "--max-num-seqs") == 32
    assert flag_int(["--max-model-len", "8"], "--max-num-seqs") is None
    for bad in (["--max-num-seqs"], ["--max-num-seqs", "x"], ["--max-num-seqs=0"]):
        assert flag_int(bad, "--max-num-seqs") is None


def test_capacity_is_what_the_engine_was_launched_with() -> None:
    """The router counts a replica full at its slots, when the launch flags say."""
    assert VLLM.command(start("vllm", args=["--max-num-seqs", "128"]), NODE).capacity == 128
    # vLLM chooses its own default (by version and GPU): unknown, its queue tells.
    assert VLLM.command(start("vllm"), NODE).capacity is None
    sglang = start("sglang", args=["--max-running-requests=48"])
    assert SGLANG.command(sglang, NODE).capacity == 48
    assert SGLANG.command(start("sglang"), NODE).capacity is None
    assert (
        SIM.command(start("sim", weights="sim", args=["--max-num-seqs", "8"]), NODE).capacity == 8
    )
    # The simulator ships with llmgw, so its default is known.
    assert SIM.command(start("sim", weights="sim"), NODE).capacity == 64
    vllm_like = start("sim", weights="sim", args=["--personality", "vllm"])
    assert SIM.command(vllm_like, NODE).capacity == 256


@pytest.mark.parametrize(
    ("argv", "capacity"),
    [
        ([], 64),
        (["--personality", "vllm"], 256),
        (["--personality=llamacpp"], 4),
        (["--personality", "sglang", "--max-num-seqs", "8"], 8),
        (["--max-num-seqs=12", "--personality", "vllm"], 12),
        (["--personality", "nope"], 64),
    ],
)
def test_a_simulators_capacity_from_its_launch_flags(argv: list[str], capacity: int) -> None:
    assert sim_capacity(argv) == capacity


# -- sleep (a profile's sleep_after) ------------------------------------------------------


def with_sleep(cmd: StartShard, seconds: float | None) -> StartShard:
    return attrs.evolve(cmd, profile=attrs.evolve(cmd.profile, sleep_after=seconds))


def test_sleep_after_enables_the_sleep_api_the_router_calls() -> None:
    # vLLM serves /sleep and /wake_up only with its sleep mode and in dev mode.
    spec = VLLM.command(with_sleep(start("vllm"), 300.0), NODE)
    assert "--enable-sleep-mode" in spec.argv
    assert spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    plain = VLLM.command(start("vllm"), NODE)
    assert "--enable-sleep-mode" not in plain.argv and "VLLM_SERVER_DEV_MODE" not in plain.env
    # The simulator imitates it.
    assert "--sleep-mode" in SIM.command(with_sleep(start("sim"), 300.0), NODE).argv
    assert "--sleep-mode" not in SIM.command(start("sim"), NODE).argv
