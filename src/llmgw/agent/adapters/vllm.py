"""vLLM: ``vllm serve WEIGHTS --host H --port P --served-model-name NAME
--tensor-parallel-size T --pipeline-parallel-size P [profile args]``.

Multi-node replicas use vLLM's Ray-free multiprocessing backend: every node runs
the same ``vllm serve`` with ``--nnodes N --node-rank R --master-addr A
--master-port P`` (``--distributed-executor-backend mp`` made explicit so a Ray
install on the node cannot change the choice), and ranks above 0 add
``--headless`` (they run workers only, no API server). Source: vLLM's
"Parallelism and Scaling" guide, section "Running vLLM with MultiProcessing"
(docs/serving/parallelism_scaling.md, https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html),
and ``ParallelConfig.master_addr/master_port/node_rank/nnodes`` in
vllm/config/parallel.py ("for multi-node distributed inference when
distributed_executor_backend is mp"). The tensor x pipeline size is the whole
replica's (placement gives each node tp*pp/N GPUs), as in the guide's example of
``--tensor-parallel-size 8 --pipeline-parallel-size 2`` on two 8-GPU nodes.

Health is ``GET /health`` (200 once the server is up); metrics are ``/metrics``
(``vllm:num_requests_running`` / ``vllm:num_requests_waiting``).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from llmgw.agent.adapters.base import (
    BaseAdapter,
    LaunchSpec,
    flag_int,
    multinode_spec,
    probe_version,
)
from llmgw.domain.fleet import EngineInfo, NodeInfo
from llmgw.transport.messages import StartShard

__all__ = ["VllmAdapter"]


class VllmAdapter(BaseAdapter):
    name = "vllm"
    reserved_flags = frozenset(
        {
            "--model",
            "--host",
            "--port",
            "--served-model-name",
            "--tensor-parallel-size",
            "-tp",
            "--pipeline-parallel-size",
            "-pp",
            # Data parallelism inside one engine would use GPUs the placement did not
            # give it; in llmgw, more throughput is more replicas.
            "--data-parallel-size",
            "-dp",
            "--nnodes",
            "--node-rank",
            "--master-addr",
            "--master-port",
            "--headless",
        }
    )
    reserved_multinode_flags = frozenset({"--distributed-executor-backend"})

    def __init__(
        self, command: Sequence[str] = ("vllm",), *, info: EngineInfo | None = None
    ) -> None:
        super().__init__(info=info)
        self.executable = tuple(command)

    async def available(self) -> EngineInfo | None:
        if shutil.which(self.executable[0]) is None:
            self._info = None
        else:
            ran, version = await probe_version([*self.executable, "--version"])
            self._info = EngineInfo(self.name, version) if ran else None
        return self._info

    def command(self, cmd: StartShard, node: NodeInfo) -> LaunchSpec:
        p = cmd.profile
        host = node.address
        argv = [
            *self.executable,
            "serve",
            p.weights,
            "--host",
            host,
            "--port",
            str(cmd.port),
            "--served-model-name",
            cmd.model,
            "--tensor-parallel-size",
            str(p.tensor_parallel),
            "--pipeline-parallel-size",
            str(p.pipeline_parallel),
        ]
        if cmd.node_count > 1:
            argv += [
                "--distributed-executor-backend",
                "mp",
                "--nnodes",
                str(cmd.node_count),
                "--node-rank",
                str(cmd.rank),
                "--master-addr",
                str(cmd.master_address),
                "--master-port",
                str(cmd.master_port),
            ]
            if cmd.rank > 0:
                argv.append("--headless")
        if p.sleep_after is not None:
            # The router puts it to sleep and wakes it (llmgw.domain.engines).
            argv.append("--enable-sleep-mode")
        argv += p.args
        env = self.environment(cmd, node)
        slots = flag_int(p.args, "--max-num-seqs")
        return multinode_spec(argv, env, host, cmd.port, cmd.rank, capacity=slots)

    def engine_environment(self, cmd: StartShard, node: NodeInfo) -> dict[str, str]:
        env = {}
        if cmd.node_count > 1:
            # The address vLLM advertises to the other nodes' workers; without it vLLM
            # guesses from the routing table, which picks the wrong NIC on multi-homed
            # hosts.
            env["VLLM_HOST_IP"] = node.address
        if cmd.profile.sleep_after is not None:
            # vLLM serves /sleep, /wake_up and /is_sleeping only in its dev mode.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env
