"""The simulator: ``python -m llmgw_cli.sim --host H --port P --model NAME [args]``.

Run through the agent's own interpreter (``sys.executable -m llmgw_cli.sim``) so it
works whatever PATH the agent was started with. The simulator needs no GPUs; it
still gets ``CUDA_VISIBLE_DEVICES`` like any engine, so a test fleet on pretended
GPUs exercises the same environment. Every rank runs a simulator on its own port
(a multi-node simulated replica has no distributed init), but only rank 0's is the
replica's endpoint; the others stand in for headless workers and are health-checked
like one. Health is ``/health``; metrics are vLLM-format by default.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from llmgw.agent.adapters.base import BaseAdapter, LaunchSpec, base_url, flag_int, flag_value
from llmgw.domain.fleet import EngineInfo, NodeInfo
from llmgw.sim.personalities import PERSONALITIES, engine_config
from llmgw.transport.messages import StartShard
from llmgw.version import __version__

__all__ = ["SimAdapter", "sim_capacity"]


def sim_capacity(args: Sequence[str]) -> int:
    """The running-batch size an ``llmgw-sim`` started with `args` will have: its
    ``--max-num-seqs``, else its ``--personality``'s, else the default. (An invalid
    value falls back the same way: the simulator would refuse to start with it.)"""
    explicit = flag_int(args, "--max-num-seqs")
    if explicit is not None:
        return explicit
    name = flag_value(args, "--personality")
    return engine_config(PERSONALITIES.get(name) if name is not None else None).max_num_seqs


class SimAdapter(BaseAdapter):
    name = "sim"
    reserved_flags = frozenset({"--host", "--port", "--model"})

    def __init__(self, python: str | None = None) -> None:
        super().__init__(info=EngineInfo(self.name, __version__))
        self.python = python or sys.executable

    async def available(self) -> EngineInfo | None:
        return self._info  # ships with the agent

    def command(self, cmd: StartShard, node: NodeInfo) -> LaunchSpec:
        host = node.address
        argv = [
            self.python,
            "-m",
            "llmgw_cli.sim",
            "--host",
            host,
            "--port",
            str(cmd.port),
            "--model",
            cmd.model,
            # The router puts it to sleep and wakes it, as vLLM's (llmgw.domain.engines).
            *(["--sleep-mode"] if cmd.profile.sleep_after is not None else []),
            *cmd.profile.args,
        ]
        url = base_url(host, cmd.port)
        serves = cmd.rank == 0
        return LaunchSpec(
            argv=tuple(argv),
            env=self.environment(cmd, node),
            health_url=f"{url}/health",
            endpoint_url=url if serves else None,
            metrics_url=f"{url}/metrics",
            capacity=sim_capacity(cmd.profile.args),
        )
