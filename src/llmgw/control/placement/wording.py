"""The words of placement's explanations: a profile's label, a node's reason for its
fit check's verdict, nodes counted by reason, and the nouns, sizes and durations in
them. Words only: every judgement comes from :meth:`Spec.fit
<llmgw.control.placement.spec.Spec.fit>`."""

from __future__ import annotations

from typing import Final

from llmgw.control.placement.spec import NodeFacts, Spec, Verdict
from llmgw.control.placement.values import NodeCode


def label(spec: Spec) -> str:
    """``big (2 nodes x 8 GPUs)``, ``small (1 GPU)``."""
    if spec.multi:
        return f"{spec.name} ({spec.nodes} nodes x {plural(spec.per_node, 'GPU')})"
    return f"{spec.name} ({plural(spec.per_node, 'GPU')})"


def node_reason(spec: Spec, node: NodeFacts, verdict: Verdict, port_range: tuple[int, int]) -> str:
    """Why `node` got `verdict` from the fit check: ``2 free GPUs, needs 4``. Not for a
    lost or unreachable node, whose words depend on its own time (:func:`absence`)."""
    code, count = verdict
    need = spec.per_node
    sig = node.sig
    if code is NodeCode.LOST or code is NodeCode.UNREACHABLE:
        raise ValueError(f"{code.value}: see absence()")
    if code is NodeCode.CORDONED:
        return "cordoned"
    if code is NodeCode.NO_ENGINE:
        has = ", ".join(sorted(node.engines)) or "none"
        return f"engine {spec.engine} not installed (has {has})"
    if code is NodeCode.NO_FABRIC:
        return "no fabric label: cannot join a multi-node replica"
    if code is NodeCode.NO_PORTS:
        return f"no free port in {port_range[0]}-{port_range[1]}"
    if code is NodeCode.NO_GPUS:
        return f"no GPUs, needs {need}"
    if not sig:
        return f"could run it without a GPU ({spec.engine})"
    if code is NodeCode.GPU_NAME:
        has = ", ".join(sorted({g[1] for g in sig}))
        return f"no GPU matches {spec.pattern!r} (has {has})"
    gpus = spec.gpus(sig)
    if code is NodeCode.GPU_MEMORY:
        assert spec.min_memory is not None  # the only way to too little memory
        which = f"GPUs matching {spec.pattern!r}" if len(gpus.named) < len(sig) else "GPUs"
        have = memory_range([g[2] for g in gpus.named])
        return f"{which} have {have}, needs {gb(spec.min_memory)}"
    if code is NodeCode.TOO_FEW_GPUS:
        if gpus.every:
            return f"has {plural(count, 'GPU')}, needs {need}"
        return f"has {plural(count, 'matching GPU')} (of {len(sig)}), needs {need}"
    what = plural(count, "free GPU" if gpus.every else "free matching GPU")
    if code is NodeCode.BUSY:
        return f"{what}, needs {need}"
    return f"{what}: could host a shard" if spec.multi else f"{what}: could host it"


def absence(code: NodeCode, since: float | None, now: float) -> str:
    """A lost or unreachable node's reason: ``lost 3m ago``."""
    if code is NodeCode.LOST:
        return "lost" if since is None else f"lost {ago(now - since)} ago"
    if since is None:
        return "unreachable (no heartbeat)"
    return f"unreachable for {ago(now - since)} (no heartbeat)"


_PHRASES: Final = {
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


def counted(spec: Spec, code: NodeCode, count: int, busiest: tuple[str, int] | None) -> str:
    """``3 nodes with too few free GPUs (best: gpu-2 with 3 free)``: `count` nodes with
    reason `code`; `busiest`, for BUSY, the node with the most free usable GPUs."""
    if code is NodeCode.FITS and not spec.multi:
        phrase = "could host it"
    else:
        phrase = _PHRASES[code].format(
            need=spec.per_node,
            memory=gb(spec.min_memory) if spec.min_memory is not None else "",
            pattern=spec.pattern,
            engine=spec.engine,
        )
    text = f"{plural(count, 'node')} {phrase}"
    if busiest is not None:
        node_id, free = busiest
        text += f" (best: {node_id} with {free} free)" if free else " (none free)"
    return text


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
