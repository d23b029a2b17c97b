"""What an engine adapter is: how the agent learns whether an engine is installed,
checks a shard against it before launching, and builds its command line.

An adapter is pure apart from :meth:`EngineAdapter.available` (which may run the
engine's ``--version``): ``validate`` and ``command`` only look at their arguments,
so their output is checked by golden tests.

Rules every adapter shares (:class:`BaseAdapter`):

* The engine binds the node's **management address** (``NodeInfo.address``), not
  0.0.0.0: that is the address the controller publishes to the router and the one
  distributed init uses, and an engine's HTTP port has no authentication, so it
  should not appear on every interface of a machine that may have public ones.
* ``CUDA_VISIBLE_DEVICES`` lists the shard's GPU indices with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA numbers GPUs as nvidia-smi (and so the
  placement) does; CUDA's default order is fastest-first, which differs on mixed
  machines.
* Multi-node shards get ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` from the
  command's management interface. Single-node shards do not: NCCL bootstraps over
  loopback then, and naming an interface the node lacks would break it.
* ``PYTHONUNBUFFERED=1`` so the engine's output reaches the agent's tail as it is
  written, not in 4 KiB blocks after the crash.
* The profile's environment is applied last (it may override the interface names,
  never the GPU selection), and the profile's arguments are appended last.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

import attrs
import trio

from llmgw.domain.engines import ENGINES
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo
from llmgw.transport.messages import StartShard

__all__ = [
    "RESERVED_ENV",
    "BaseAdapter",
    "EngineAdapter",
    "LaunchSpec",
    "base_url",
    "flag_int",
    "flag_name",
    "flag_value",
    "probe_version",
]

#: Environment the agent decides; a profile may not set it.
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@attrs.frozen
class LaunchSpec:
    """How to run one shard's engine process."""

    argv: tuple[str, ...]
    env: dict[str, str]  # added to the agent's own environment
    # Polled until it answers 200 (then the shard is ready); None: ready once launched
    # (ranks > 0 of a multi-node replica serve no HTTP).
    health_url: str | None
    # Where the engine serves the OpenAI API (rank 0 only); reported when ready.
    endpoint_url: str | None
    # Prometheus page read while draining (running + waiting requests).
    metrics_url: str | None = None
    # Sequences the engine was launched to run at once (vLLM --max-num-seqs, ...);
    # None when its flags leave that to the engine. The router's saturation uses it.
    capacity: int | None = None


class EngineAdapter(Protocol):
    """One engine (vllm, sglang, sim) as the agent sees it."""

    @property
    def name(self) -> str: ...

    @property
    def info(self) -> EngineInfo | None:
        """What the last :meth:`available` found (None: not installed, or not probed)."""
        ...

    async def available(self) -> EngineInfo | None:
        """Probe whether the engine is installed here, and its version."""
        ...

    def validate(self, cmd: StartShard, gpus: Sequence[Gpu]) -> list[str]:
        """Everything wrong with running `cmd` on a node with `gpus`; empty when fine."""
        ...

    def command(self, cmd: StartShard, node: NodeInfo) -> LaunchSpec:
        """The process to run for `cmd` (call only when :meth:`validate` found nothing)."""
        ...


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def multinode_spec(
    argv: Sequence[str],
    env: dict[str, str],
    host: str,
    port: int,
    rank: int,
    *,
    capacity: int | None = None,
) -> LaunchSpec:
    """A shard of an engine whose rank 0 serves HTTP (health, the API, metrics) and
    whose other ranks only compute: they are ready once launched."""
    url = base_url(host, port)
    serves = rank == 0
    return LaunchSpec(
        argv=tuple(argv),
        env=env,
        health_url=f"{url}/health" if serves else None,
        endpoint_url=url if serves else None,
        metrics_url=f"{url}/metrics" if serves else None,
        capacity=capacity,
    )


def flag_name(arg: str) -> str | None:
    """The flag an argument names (``--max-num-seqs=8`` -> ``--max-num-seqs``;
    underscores read as dashes, as argparse-based engines accept both), or None for
    a value."""
    if not arg.startswith("-") or arg == "-" or _is_number(arg):
        return None
    name = arg.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value the last of `names` is given in `args` (``--flag V`` or ``--flag=V``),
    or None when absent."""
    value: str | None = None
    for i, arg in enumerate(args):
        name = flag_name(arg)
        if name not in names:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def flag_int(args: Sequence[str], *names: str) -> int | None:
    """The positive integer the last of `names` is given in `args` (``--flag N`` or
    ``--flag=N``), or None when absent or not a positive integer (the engine itself
    refuses a bad value)."""
    value = flag_value(args, *names)
    try:
        n = int(value) if value is not None else None
    except ValueError:
        return None
    return n if n is not None and n >= 1 else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class BaseAdapter:
    """The checks and environment all adapters share; subclasses name their engine,
    its reserved flags, and build the argv."""

    name = "base"
    #: Flags the adapter sets itself, so a profile must not (checked as spelled by
    #: :func:`flag_name`).
    reserved_flags: frozenset[str] = frozenset()
    #: Flags reserved only for multi-node shards.
    reserved_multinode_flags: frozenset[str] = frozenset()

    def __init__(self, *, info: EngineInfo | None = None) -> None:
        self._info = info

    @property
    def info(self) -> EngineInfo | None:
        return self._info

    @property
    def needs_gpus(self) -> bool:
        """Whether the engine needs GPUs: the registry's word (an engine it does not
        know does)."""
        engine = ENGINES.get(self.name)
        return engine is None or not engine.cpu

    # -- validation ---------------------------------------------------------------------

    def validate(self, cmd: StartShard, gpus: Sequence[Gpu]) -> list[str]:
        problems: list[str] = []
        if cmd.profile.engine != self.name:
            problems.append(
                f"profile {cmd.profile.name!r} is for engine {cmd.profile.engine!r}, "
                f"not {self.name!r}"
            )
        if self.info is None:
            problems.append(f"{self.name} is not installed on this node")
        problems += self._check_args(cmd)
        problems += self._check_env(cmd.profile.env)
        problems += self._check_layout(cmd, gpus)
        return problems

    def _reserved(self, cmd: StartShard) -> Collection[str]:
        if cmd.node_count > 1:
            return self.reserved_flags | self.reserved_multinode_flags
        return self.reserved_flags

    def _check_args(self, cmd: StartShard) -> list[str]:
        problems: list[str] = []
        reserved = self._reserved(cmd)
        for arg in cmd.profile.args:
            if "\x00" in arg:
                problems.append(f"argument {arg!r} contains a NUL character")
                continue
            flag = flag_name(arg)
            if flag is None:
                continue
            if any(c.isspace() for c in arg.split("=", 1)[0]):
                problems.append(
                    f"argument {arg!r} looks like a flag and its value in one item: give "
                    "each flag and each value as its own list item"
                )
            elif flag in reserved:
                problems.append(
                    f"argument {flag} is set by the agent for {self.name} (from the placement "
                    "and the model); remove it from the profile's args"
                )
        return problems

    @staticmethod
    def _check_env(env: Mapping[str, str]) -> list[str]:
        problems: list[str] = []
        for key, value in env.items():
            if not _ENV_NAME.fullmatch(key):
                problems.append(f"environment variable name {key!r} is not valid")
            elif key in RESERVED_ENV:
                problems.append(
                    f"environment variable {key} is set by the agent from the shard's GPUs; "
                    "remove it from the profile's env"
                )
            if "\x00" in value:
                problems.append(f"environment variable {key} contains a NUL character")
        return problems

    def _check_layout(self, cmd: StartShard, gpus: Sequence[Gpu]) -> list[str]:
        problems: list[str] = []
        p = cmd.profile
        if not 1 <= cmd.port <= 65535:
            problems.append(f"port {cmd.port} is outside 1..65535")
        if cmd.node_count < 1:
            problems.append(f"node count {cmd.node_count} is below 1")
        elif not 0 <= cmd.rank < cmd.node_count:
            problems.append(f"rank {cmd.rank} is outside 0..{cmd.node_count - 1}")
        if cmd.node_count > 1:
            if not cmd.master_address:
                problems.append("a multi-node shard needs the master address (rank 0's node)")
            if cmd.master_port is None or not 1 <= cmd.master_port <= 65535:
                problems.append("a multi-node shard needs a master port in 1..65535")
            if not cmd.mgmt_interface:
                problems.append("a multi-node shard needs the management interface name")
        present = {g.index for g in gpus}
        duplicates = sorted({i for i in cmd.gpu_indices if cmd.gpu_indices.count(i) > 1})
        if duplicates:
            problems.append(f"GPU indices listed twice: {_ints(duplicates)}")
        missing = [i for i in dict.fromkeys(cmd.gpu_indices) if i not in present]
        if missing:
            have = _ints(sorted(present)) if present else "none"
            problems.append(f"GPU {_ints(missing)} not on this node (it has GPU indices: {have})")
        if p.tensor_parallel < 1 or p.pipeline_parallel < 1:
            problems.append(
                f"tensor_parallel {p.tensor_parallel} and pipeline_parallel "
                f"{p.pipeline_parallel} must be at least 1"
            )
        elif self.needs_gpus:
            world = p.gpus
            if not cmd.gpu_indices:
                problems.append(f"{self.name} needs GPUs and the shard was given none")
            elif len(cmd.gpu_indices) * max(cmd.node_count, 1) != world:
                problems.append(
                    f"tensor_parallel {p.tensor_parallel} x pipeline_parallel "
                    f"{p.pipeline_parallel} = {world} GPUs, but the shard has "
                    f"{len(cmd.gpu_indices)} GPU(s) on each of {cmd.node_count} node(s)"
                )
        return problems

    # -- the command ---------------------------------------------------------------------

    def environment(self, cmd: StartShard, node: NodeInfo) -> dict[str, str]:
        """The shared environment (module docstring), then the profile's."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in cmd.gpu_indices),
            "PYTHONUNBUFFERED": "1",
        }
        if cmd.node_count > 1:
            env["NCCL_SOCKET_IFNAME"] = cmd.mgmt_interface
            env["GLOO_SOCKET_IFNAME"] = cmd.mgmt_interface
        env.update(self.engine_environment(cmd, node))
        env.update({k: v for k, v in cmd.profile.env.items() if k not in RESERVED_ENV})
        return env

    def engine_environment(self, cmd: StartShard, node: NodeInfo) -> dict[str, str]:
        """Engine-specific additions to the environment."""
        return {}


def _ints(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)


_VERSION = re.compile(r"\d+\.\d+[\w.+-]*")


async def probe_version(
    argv: Sequence[str], *, time_limit: float = 60.0
) -> tuple[bool, str | None]:
    """Run a version command: (whether it ran and exited 0, the version it printed).

    A command that runs past `time_limit` (vLLM's imports can take a while on a cold
    disk) counts as present with an unknown version: it exists, it is just slow."""
    try:
        with trio.move_on_after(time_limit) as scope:
            result = await trio.run_process(
                list(argv), capture_stdout=True, capture_stderr=True, check=False
            )
    except OSError:
        return False, None
    if scope.cancelled_caught:
        return True, None
    if result.returncode != 0:
        return False, None
    text = result.stdout.decode("utf-8", "replace").strip()
    for line in reversed(text.splitlines()):
        match = _VERSION.search(line)
        if match:
            return True, match.group(0)
    return True, None
