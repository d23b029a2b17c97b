"""The words of placement's explanations: counted nouns, sizes, durations, and the
phrase for each node reason when nodes are counted by reason."""

from __future__ import annotations

from typing import Final

from llmgw.control.placement.values import NodeCode

PHRASES: Final = {
    NodeCode.FITS: "could host a shard",
    NodeCode.NO_PORTS: "out of ports",
    NodeCode.BUSY: "with too few free GPUs",
    NodeCode.TOO_FEW_GPUS: "with fewer than {need} usable GPUs",
    NodeCode.GPU_MEMORY: "with GPUs under {memory}",
    NodeCode.GPU_NAME: "without a GPU matching {pattern!r}",
    NodeCode.NO_GPUS: "without GPUs",
    NodeCode.NO_FABRIC: "without a fabric label",
    NodeCode.NO_ENGINE: "without engine {engine}",
    NodeCode.CORDONED: "cordoned",
    NodeCode.UNREACHABLE: "unreachable",
    NodeCode.LOST: "lost",
}


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def gb(size: int) -> str:
    value = size / 1e9
    return f"{round(value)} GB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GB"


def memory_range(sizes: list[int]) -> str:
    lo, hi = min(sizes), max(sizes)
    if gb(lo) == gb(hi):
        return gb(lo)
    return f"{gb(lo).removesuffix(' GB')}-{gb(hi)}"


def ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"
