"""llama.cpp: ``llama-server -m WEIGHTS --host H --port P -a NAME -np SLOTS -c CTX
--metrics --no-webui -t THREADS [profile args]``.

The binary is, in order: ``$LLAMA_SERVER_BIN``; the one ``scripts/llama_server.sh``
builds and caches (``${XDG_CACHE_HOME:-~/.cache}/llmgw/llama.cpp/b<BUILD>/llama-server``);
``llama-server`` on PATH. Its version is the llama.cpp build number (``b11434``),
from ``llama-server --version``.

The weights are a local GGUF file (``profile.weights``); the served name (``-a``)
is the model's name, as ``/v1/models`` and responses report it. The slots
(``-np``/``--parallel``, default 4), total context (``-c``/``--ctx-size``, shared
by the slots; default 4096, 0 = the model's own) and CPU threads
(``-t``/``--threads``; default half the node's CPUs) may be set in the profile's
args: the adapter takes them out, checks them, and puts them in their place, so a
shard's command always names them once. A CPU build ignores the GPU selection;
one replica is one process on one node (``tp x pp == 1``), which is what lets the
placement put it on a node without GPUs.

Health is ``GET /health`` (503 while the model loads, 200 once it serves);
``--metrics`` exposes ``llamacpp:requests_processing`` and
``llamacpp:requests_deferred`` on ``/metrics`` (no KV-cache gauge).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from llmgw.agent.adapters.base import BaseAdapter, LaunchSpec, base_url, flag_name
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo
from llmgw.transport.messages import StartShard

__all__ = [
    "DEFAULT_CONTEXT",
    "DEFAULT_SLOTS",
    "LLAMA_CPP_BUILD",
    "MIN_SLOT_CONTEXT",
    "LlamaCppAdapter",
    "cached_server_path",
    "find_llama_server",
]

#: The llama.cpp build scripts/llama_server.sh builds (keep the two in step).
LLAMA_CPP_BUILD = "11434"
DEFAULT_SLOTS = 4
DEFAULT_CONTEXT = 4096
#: The least context one slot may get (``-c`` / ``-np``) unless ``-c`` is 0.
MIN_SLOT_CONTEXT = 128

# Not LLMGW_-prefixed: every LLMGW_ variable is a server configuration key, and
# llmgw-server refuses unknown ones (a shared environment would stop it starting).
ENV_BINARY = "LLAMA_SERVER_BIN"
BUILD_HINT = (
    f"put llama.cpp's llama-server on PATH or name it in ${ENV_BINARY}"
    " (in a checkout of llmgw, scripts/llama_server.sh builds one: about 10 minutes)"
)
#: llama-server's own idle sleep (a profile's sleep_after); builds before it lack the flag.
SLEEP_FLAG = "--sleep-idle-seconds"

# Flag spellings -> the setting the adapter owns.
_SIZED = {
    "-np": "slots",
    "--parallel": "slots",
    "-c": "context",
    "--ctx-size": "context",
    "-t": "threads",
    "--threads": "threads",
}
_VERSION = re.compile(r"version:\s*(\S+)(?:\s*\(build\s+(\d+))?")


def cached_server_path(env: Mapping[str, str] | None = None) -> Path:
    """Where scripts/llama_server.sh puts the binary it builds."""
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "llmgw" / "llama.cpp" / f"b{LLAMA_CPP_BUILD}" / "llama-server"


def find_llama_server(env: Mapping[str, str] | None = None) -> str | None:
    """``$LLAMA_SERVER_BIN``, else the cached build, else ``llama-server`` on PATH."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_BINARY)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    cached = cached_server_path(env)
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("llama-server")


class LlamaCppAdapter(BaseAdapter):
    name = "llamacpp"
    reserved_flags = frozenset(
        {
            "-m",
            "--model",
            "-mu",
            "--model-url",
            "-hf",
            "-hfr",
            "--hf-repo",
            "-dr",
            "--docker-repo",
            "--host",
            "--port",
            "-a",
            "--alias",
            "--metrics",
            "--webui",
            "--no-webui",
        }
    )

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        threads: int | None = None,
        info: EngineInfo | None = None,
    ) -> None:
        """`command`: the binary (and any leading arguments); None: found at
        :meth:`available` (:func:`find_llama_server`). `threads`: the default ``-t``."""
        super().__init__(info=info)
        self.executable: tuple[str, ...] | None = tuple(command) if command else None
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        # Whether the build has --sleep-idle-seconds (newer builds do), from its --help
        # at available(); None: not looked up, taken as there.
        self.sleeps: bool | None = None

    async def available(self) -> EngineInfo | None:
        if self.executable is None:
            found = find_llama_server()
            if found is None:
                self._info = None
                return None
            self.executable = (found,)
        self._info = await _probe(self.executable)
        if self._info is not None:
            self.sleeps = await _has_flag(self.executable, SLEEP_FLAG)
        return self._info

    # -- validation -------------------------------------------------------------------

    def validate(self, cmd: StartShard, gpus: Sequence[Gpu]) -> list[str]:
        problems = super().validate(cmd, gpus)
        if self.info is None:
            problems.append(f"no llama-server binary on this node: {BUILD_HINT}")
        p = cmd.profile
        if p.sleep_after is not None and self.sleeps is False:
            version = self.info.version if self.info else None
            problems.append(
                f"this llama-server ({version or 'version unknown'}) has no {SLEEP_FLAG}: "
                "build a newer one, or remove the profile's sleep_after"
            )
        if p.gpus > 1 or cmd.node_count > 1:
            problems.append(
                "llamacpp runs one process per replica: tensor_parallel x pipeline_parallel "
                "must be 1 and the replica on one node"
            )
        if not p.weights:
            problems.append("llamacpp needs weights: the path of a GGUF file on the node")
        elif not os.path.isfile(p.weights):
            problems.append(f"weights {p.weights!r}: no such file on this node")
        settings, _rest, errors = self._settings(p.args)
        problems += errors
        slots, context = settings["slots"], settings["context"]
        if not errors and context and context // slots < MIN_SLOT_CONTEXT:
            problems.append(
                f"context {context} shared by {slots} slots leaves {context // slots} tokens "
                f"per slot (at least {MIN_SLOT_CONTEXT}); raise -c or lower -np"
            )
        return problems

    def _settings(self, args: Sequence[str]) -> tuple[dict[str, int], list[str], list[str]]:
        """The slots, context and threads the args set (else the defaults), the other
        args, and what is wrong with the ones taken."""
        values = {"slots": DEFAULT_SLOTS, "context": DEFAULT_CONTEXT, "threads": self.threads}
        least = {"slots": 1, "context": 0, "threads": 1}
        rest: list[str] = []
        errors: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            flag = flag_name(arg)
            setting = _SIZED.get(flag or "")
            if setting is None:
                rest.append(arg)
                i += 1
                continue
            if "=" in arg:
                text: str | None = arg.split("=", 1)[1]
                i += 1
            else:
                text = args[i + 1] if i + 1 < len(args) else None
                i += 2
            try:
                value = int(text) if text is not None else None
            except ValueError:
                value = None
            if value is None or value < least[setting]:
                errors.append(f"argument {flag} needs an integer of at least {least[setting]}")
            else:
                values[setting] = value
        return values, rest, errors

    # -- the command ------------------------------------------------------------------

    def command(self, cmd: StartShard, node: NodeInfo) -> LaunchSpec:
        if self.executable is None:
            raise RuntimeError(f"llama-server not found: {BUILD_HINT}")
        p = cmd.profile
        host = node.address
        settings, rest, _errors = self._settings(p.args)
        argv = [
            *self.executable,
            "-m",
            p.weights,
            "--host",
            host,
            "--port",
            str(cmd.port),
            "-a",
            cmd.model,
            "-np",
            str(settings["slots"]),
            "-c",
            str(settings["context"]),
            "--metrics",
            "--no-webui",
            "-t",
            str(settings["threads"]),
            *rest,
        ]
        if p.sleep_after is not None:
            # llama-server sleeps on its own (unloads the model) and reloads at the next
            # request: nothing for the router to do (llmgw.domain.engines). Whole seconds.
            argv += [SLEEP_FLAG, str(max(1, math.ceil(p.sleep_after)))]
        url = base_url(host, cmd.port)
        return LaunchSpec(
            argv=tuple(argv),
            env=self.environment(cmd, node),
            health_url=f"{url}/health",
            endpoint_url=url,
            metrics_url=f"{url}/metrics",
            capacity=settings["slots"],
        )


async def _has_flag(executable: Sequence[str], flag: str, time_limit: float = 30.0) -> bool | None:
    """Whether ``llama-server --help`` lists `flag` (None: it did not answer)."""
    try:
        with trio.move_on_after(time_limit):
            result = await trio.run_process(
                [*executable, "--help"], capture_stdout=True, capture_stderr=True, check=False
            )
            return flag.encode() in result.stdout + result.stderr
    except OSError:
        return None
    return None


async def _probe(executable: Sequence[str], time_limit: float = 30.0) -> EngineInfo | None:
    """``llama-server --version``: present when it exits 0. Its version is the build
    number it prints (``version: 0.6.0-dev (build 11434, commit ...)``) as ``b11434``;
    a build from a source tree without git history says ``build 0``, and then the
    version string (``0.6.0-dev``) is all there is."""
    try:
        with trio.move_on_after(time_limit) as scope:
            result = await trio.run_process(
                [*executable, "--version"], capture_stdout=True, capture_stderr=True, check=False
            )
    except OSError:
        return None
    if scope.cancelled_caught:
        return EngineInfo(LlamaCppAdapter.name, None)
    if result.returncode != 0:
        return None
    text = (result.stdout + result.stderr).decode("utf-8", "replace")
    match = _VERSION.search(text)
    if match is None:
        return EngineInfo(LlamaCppAdapter.name, None)
    version, build = match.groups()
    return EngineInfo(LlamaCppAdapter.name, f"b{build}" if build and int(build) else version)
