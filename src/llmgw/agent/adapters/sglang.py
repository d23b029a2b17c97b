"""SGLang: ``python -m sglang.launch_server --model-path WEIGHTS --host H --port P
--served-model-name NAME --tp T [--pp-size P] --enable-metrics [profile args]``.

Multi-node replicas add ``--nnodes N --node-rank R --dist-init-addr HOST:PORT`` on
every node, as in SGLang's server-arguments guide ("To run tensor parallelism on
multiple nodes, add --nnodes 2 ... --dist-init-addr sgl-dev-0:50000 --nnodes 2
--node-rank 0", https://docs.sglang.io/advanced_features/server_arguments.html).
``--tp`` is the replica's whole tensor-parallel size across its nodes (the guide's
TP=4 over two 2-GPU nodes); ``--pp-size`` is passed only when above 1.
``--enable-metrics`` is always on: draining reads ``sglang:num_running_reqs`` and
``sglang:num_queue_reqs`` from ``/metrics``. Ranks above 0 serve no HTTP.
"""

from __future__ import annotations

import sys

from llmgw.agent.adapters.base import (
    BaseAdapter,
    LaunchSpec,
    flag_int,
    multinode_spec,
    probe_version,
)
from llmgw.domain.fleet import EngineInfo, NodeInfo
from llmgw.transport.messages import StartShard

__all__ = ["SglangAdapter"]

_VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('sglang'))"


class SglangAdapter(BaseAdapter):
    name = "sglang"
    reserved_flags = frozenset(
        {
            "--model-path",
            "--model",
            "--host",
            "--port",
            "--served-model-name",
            "--tp",
            "--tp-size",
            "--tensor-parallel-size",
            "--pp-size",
            "--pipeline-parallel-size",
            # See vllm.py: data parallelism is more replicas, not a bigger one.
            "--dp",
            "--dp-size",
            "--data-parallel-size",
            "--nnodes",
            "--node-rank",
            "--dist-init-addr",
        }
    )

    def __init__(self, python: str | None = None, *, info: EngineInfo | None = None) -> None:
        """`python`: the interpreter SGLang is installed in (default: the agent's)."""
        super().__init__(info=info)
        self.python = python or sys.executable

    async def available(self) -> EngineInfo | None:
        ran, version = await probe_version([self.python, "-c", _VERSION_SCRIPT])
        self._info = EngineInfo(self.name, version) if ran else None
        return self._info

    def command(self, cmd: StartShard, node: NodeInfo) -> LaunchSpec:
        p = cmd.profile
        host = node.address
        argv = [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            p.weights,
            "--host",
            host,
            "--port",
            str(cmd.port),
            "--served-model-name",
            cmd.model,
            "--tp",
            str(p.tensor_parallel),
        ]
        if p.pipeline_parallel > 1:
            argv += ["--pp-size", str(p.pipeline_parallel)]
        argv.append("--enable-metrics")
        if cmd.node_count > 1:
            master = str(cmd.master_address)
            if ":" in master:
                master = f"[{master}]"
            argv += [
                "--nnodes",
                str(cmd.node_count),
                "--node-rank",
                str(cmd.rank),
                "--dist-init-addr",
                f"{master}:{cmd.master_port}",
            ]
        argv += p.args
        env = self.environment(cmd, node)
        slots = flag_int(p.args, "--max-running-requests")
        return multinode_spec(argv, env, host, cmd.port, cmd.rank, capacity=slots)
