"""What GPUs a node has: from nvidia-smi, or pretended (`--fake-gpus 4x80GB`).

Discovery runs at start and again before every heartbeat, so memory used,
utilisation and ECC counts stay fresh in the server's inventory.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
import shutil
from collections.abc import Sequence

import trio

from llmgw import units
from llmgw.domain.fleet import Gpu

_FAKE = re.compile(r"(?:(\d+)\s*x\s*)?([0-9.]+\s*[A-Za-z]*B)(?::(.+))?")


def fake_gpus(spec: str, *, node_id: str = "node") -> tuple[Gpu, ...]:
    """GPUs from a spec such as ``4x80GB``, ``2x40GB:A100-40GB`` or
    ``4x80GB:H100,2x24GB:L4`` (groups separated by commas; names optional)."""
    gpus: list[Gpu] = []
    for group in (g.strip() for g in spec.split(",")):
        match = _FAKE.fullmatch(group)
        if not match:
            raise ValueError(
                f"fake GPU spec {group!r}: expected COUNTxMEMORY[:NAME], e.g. 4x80GB or 2x40GB:A100"
            )
        count = int(match.group(1) or 1)
        try:
            memory = units.parse_size(match.group(2).replace(" ", ""))
        except ValueError as exc:  # say which group of a long spec it is
            raise ValueError(f"fake GPU spec {group!r}: {exc}") from None
        name = match.group(3) or f"Fake-{units.format_size(memory)}"
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=f"GPU-fake-{node_id}-{index}",
                    name=name,
                    memory_total=memory,
                    memory_used=0,
                )
            )
    return tuple(gpus)


# -- nvidia-smi ------------------------------------------------------------------------

#: What the agent asks nvidia-smi for. `utilization.gpu` is last so that a driver that
#: does not report it (or a recorded output without it) leaves a shorter row that
#: still parses; every other field is positional.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "ecc.errors.uncorrected.volatile.total",
    "utilization.gpu",
)
_REQUIRED = 3  # index, uuid, name: without them a row is not a GPU
_MIB = 1024 * 1024
_ABSENT = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]"}

log = logging.getLogger(__name__)


def nvidia_smi_argv(fields: Sequence[str] = QUERY_FIELDS) -> list[str]:
    return [
        "nvidia-smi",
        f"--query-gpu={','.join(fields)}",
        "--format=csv,noheader,nounits",
    ]


def _number(text: str) -> float | None:
    """A reported number, or None for nvidia-smi's ways of saying it does not know."""
    if text.strip().lower() in _ABSENT:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_nvidia_smi(output: str) -> tuple[Gpu, ...]:
    """GPUs from the output of :func:`nvidia_smi_argv` (``csv,noheader,nounits``).

    Memory is MiB (made bytes); utilisation a percentage (made a 0..1 ratio); ECC a
    count. ``[N/A]``, ``[Not Supported]`` and empty fields are absent (None), never 0.
    A row may stop after any field from memory.total on (an older driver's shorter
    row); a row without index, uuid and name, or with a non-numeric index, is skipped
    with a warning rather than failing the whole inventory.
    """
    gpus: list[Gpu] = []
    for row in csv.reader(io.StringIO(output), skipinitialspace=True):
        fields = [f.strip() for f in row]
        if not fields or not any(fields):
            continue
        if len(fields) < _REQUIRED or not fields[0].isdigit():
            log.warning("nvidia-smi: skipping unparseable row %r", ",".join(row))
            continue
        fields += [""] * (len(QUERY_FIELDS) - len(fields))
        _index, uuid, name, total, used, ecc, util = fields[: len(QUERY_FIELDS)]
        memory_total = _number(total)
        memory_used = _number(used)
        ecc_errors = _number(ecc)
        utilization = _number(util)
        gpus.append(
            Gpu(
                index=int(fields[0]),
                uuid=uuid,
                name=name,
                memory_total=int(memory_total * _MIB) if memory_total is not None else 0,
                memory_used=int(memory_used * _MIB) if memory_used is not None else None,
                utilization=(
                    min(max(utilization / 100.0, 0.0), 1.0) if utilization is not None else None
                ),
                ecc_errors=int(ecc_errors) if ecc_errors is not None else None,
            )
        )
    return tuple(gpus)


class DiscoveryError(Exception):
    """nvidia-smi is there but did not say what GPUs the node has."""


async def query_nvidia_smi(executable: str, *, time_limit: float = 10.0) -> tuple[Gpu, ...]:
    """Run nvidia-smi (bounded by `time_limit`) and parse its answer.

    A driver that rejects a field of the query (an old one, say) is asked again
    without the optional utilisation column. Raises DiscoveryError when nvidia-smi
    fails or hangs (a GPU fallen off the bus can make it hang for minutes).
    """
    fields: Sequence[str] = QUERY_FIELDS
    for _attempt in range(2):
        argv = [executable, *nvidia_smi_argv(fields)[1:]]
        with trio.move_on_after(time_limit) as scope:
            result = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False
            )
        if scope.cancelled_caught:
            raise DiscoveryError(f"nvidia-smi did not answer within {time_limit:g}s")
        out = result.stdout.decode("utf-8", "replace")
        if result.returncode == 0:
            return parse_nvidia_smi(out)
        err = (result.stderr.decode("utf-8", "replace") + out).strip()
        if "not a valid field" in err.lower() and fields is QUERY_FIELDS:
            fields = QUERY_FIELDS[:-1]
            continue
        if "no devices were found" in err.lower():
            return ()
        first = err.splitlines()[0] if err else "no output"
        raise DiscoveryError(f"nvidia-smi exited with code {result.returncode}: {first}")
    raise DiscoveryError("nvidia-smi rejected the query")  # pragma: no cover


async def discover(
    fake_spec: str | None = None,
    *,
    node_id: str = "node",
    nvidia_smi: str | None = None,
    time_limit: float = 10.0,
) -> tuple[Gpu, ...]:
    """The node's GPUs: pretended ones when `fake_spec` is given, else what nvidia-smi
    reports if it is on PATH (or at `nvidia_smi`), else none (a CPU node, which can
    run only simulated engines). Raises DiscoveryError when nvidia-smi fails."""
    if fake_spec is not None:
        return fake_gpus(fake_spec, node_id=node_id)
    executable = nvidia_smi or shutil.which("nvidia-smi")
    if executable is None:
        return ()
    return await query_nvidia_smi(executable, time_limit=time_limit)
