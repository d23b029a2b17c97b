"""What GPUs a node has: from nvidia-smi, or pretended (`--fake-gpus 4x80GB`)."""

from __future__ import annotations

import re

from llmgw import units
from llmgw.control.fleet import Gpu

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
        memory = units.parse_size(match.group(2).replace(" ", ""))
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
