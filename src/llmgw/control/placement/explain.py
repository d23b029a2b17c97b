"""Why a request did not fit: for each profile it tried, a reason per node (and per
fabric for multi-node profiles), node counts by reason, a summary, and hints that
would make it fit, judged against the working state after the whole plan."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from llmgw.config import DeploymentProfile
from llmgw.control.placement.spec import Sig, Spec, Verdict, spec_key
from llmgw.control.placement.state import Fleet, Node
from llmgw.control.placement.values import (
    AttemptCode,
    FabricCode,
    FabricReason,
    Hint,
    HintCode,
    NodeCode,
    NodeReason,
    PlaceRequest,
    ProfileAttempt,
    Unplaceable,
)
from llmgw.control.placement.wording import absence, counted, label, node_reason, plural
from llmgw.domain.fleet import NodeState, Placement

# Existing placements tried, one at a time, for the "fits if X were drained" hint.
DRAIN_HINT_SCAN: Final = 256
# Default cap on the per-node reasons of one profile attempt.
MAX_NODE_REASONS: Final = 50

_RANK: Final = {code: rank for rank, code in enumerate(NodeCode)}  # the listing's order


class _Class:
    """Nodes that every profile judges alike: the facts the fit check reads (the same
    state, engines, GPUs, free GPUs...), judged once for all of its members."""

    __slots__ = (
        "cordoned",
        "engines",
        "free",
        "free_ports",
        "has_fabric",
        "members",
        "sig",
        "state",
    )

    def __init__(
        self,
        state: NodeState,
        cordoned: bool,
        engines: frozenset[str],
        has_fabric: bool,
        sig: Sig,
        free: frozenset[int],
        free_ports: int,  # at most 2: no check tells 2 free ports from more
    ) -> None:
        self.state = state
        self.cordoned = cordoned
        self.engines = engines
        self.has_fabric = has_fabric
        self.sig = sig
        self.free = free
        self.free_ports = free_ports
        self.members: list[Node] = []

    def freed(self, gpus: Iterable[int], free_ports: int) -> _Class:
        """A member as it would be with `gpus` free too and `free_ports` free ports."""
        return _Class(
            self.state,
            self.cordoned,
            self.engines,
            self.has_fabric,
            self.sig,
            self.free.union(gpus),
            min(free_ports, 2),
        )


class Explainer:
    def __init__(
        self, fleet: Fleet, existing: Sequence[Placement], now: float, max_node_reasons: int
    ) -> None:
        self.fleet = fleet
        self.now = now
        self.cap = max(1, max_node_reasons)
        classes: dict[tuple[object, ...], _Class] = {}
        self.class_of: dict[str, _Class] = {}  # node id -> its class
        for node_id in fleet.sorted_ids:
            node = fleet.nodes[node_id]
            facts = (
                node.state,
                node.cordoned,
                node.engines,
                node.has_fabric,
                node.sig,
                frozenset(node.free),
                min(node.free_ports, 2),
            )
            cls = classes.get(facts)
            if cls is None:
                cls = classes[facts] = _Class(*facts)
            cls.members.append(node)
            self.class_of[node_id] = cls
        self.classes = list(classes.values())
        self.all_fabrics = sorted({f for node in fleet.nodes.values() for f in node.fabrics})
        # Existing placements, the least disruptive to drain first.
        self.holders = sorted(
            existing,
            key=lambda p: (sum(len(s.gpu_indices) for s in p.shards), p.replica_id, p.model),
        )
        self._verdicts: dict[tuple[int, tuple[object, ...], bool], Verdict] = {}
        self._drains: dict[tuple[object, ...], Placement | None] = {}
        self._memo: dict[
            tuple[tuple[object, ...], ...], tuple[str, tuple[ProfileAttempt, ...], tuple[Hint, ...]]
        ] = {}

    def explain(self, request: PlaceRequest) -> Unplaceable:
        key = tuple(spec_key(p) for p in request.profiles)
        memo = self._memo.get(key)
        if memo is None:
            memo = self._memo[key] = self._explain(request.profiles)
        summary, attempts, hints = memo
        return Unplaceable(request, summary, attempts, hints)

    def _explain(
        self, profiles: Sequence[DeploymentProfile]
    ) -> tuple[str, tuple[ProfileAttempt, ...], tuple[Hint, ...]]:
        if not profiles:
            return "the model has no deployment profiles", (), ()
        attempts: list[ProfileAttempt] = []
        hints: list[Hint] = []
        for profile in profiles:
            attempt, profile_hints = self._attempt(self.fleet.spec(profile))
            attempts.append(attempt)
            hints.extend(profile_hints)
        if len(attempts) == 1:
            summary = attempts[0].summary
        else:
            summary = "no profile fits: " + " | ".join(a.summary for a in attempts)
        if hints:
            summary += f"; {hints[0].message}"
        return summary, tuple(attempts), tuple(hints)

    # -- verdicts --

    def verdict(self, cls: _Class, spec: Spec, ignore_cordon: bool = False) -> Verdict:
        """The fit check's verdict on the members of `cls`, kept per profile identity."""
        key = (id(cls), spec.identity, ignore_cordon)
        found = self._verdicts.get(key)
        if found is None:
            found = self._verdicts[key] = spec.fit(cls, ignore_cordon=ignore_cordon)
        return found

    def _message(
        self, node: Node, cls: _Class, spec: Spec, verdict: Verdict, reasons: dict[int, str]
    ) -> str:
        """`node`'s reason; `reasons` keeps each class's, the same for all its members."""
        code = verdict[0]
        if code is NodeCode.LOST or code is NodeCode.UNREACHABLE:
            return f"{node.id}: {absence(code, node.cap.since, self.now)}"
        reason = reasons.get(id(cls))
        if reason is None:
            reason = reasons[id(cls)] = node_reason(spec, cls, verdict, self.fleet.port_range)
        return f"{node.id}: {reason}"

    # -- one profile --

    def _attempt(self, spec: Spec) -> tuple[ProfileAttempt, list[Hint]]:
        if spec.error is not None:
            return (
                ProfileAttempt(
                    spec.name, AttemptCode.INVALID_PROFILE, f"{spec.name}: {spec.error}"
                ),
                [],
            )
        if not self.fleet.nodes:
            return (
                ProfileAttempt(
                    spec.name, AttemptCode.NO_NODES, f"{label(spec)}: no nodes registered"
                ),
                [],
            )
        by_code: dict[NodeCode, list[tuple[_Class, Verdict]]] = {}
        for cls in self.classes:
            verdict = self.verdict(cls, spec)
            by_code.setdefault(verdict[0], []).append((cls, verdict))
        codes = [c for c in NodeCode if c in by_code]
        counts = {c.value: sum(len(cls.members) for cls, _ in by_code[c]) for c in codes}
        listed = self._listing(spec, by_code, codes)
        omitted = len(self.fleet.nodes) - len(listed)
        node_part = _count_phrases(spec, by_code, codes, counts)
        title = label(spec)
        hints: list[Hint] = []
        fabrics: tuple[FabricReason, ...] = ()
        ready: dict[str, int] = {}
        heads: dict[str, int] = {}
        if not spec.multi:
            code = AttemptCode.NO_NODE_FITS
            summary = f"{title}: no node fits: {node_part}"
            hints += self._uncordon_hint(spec)
        else:
            ready, heads = self._fabric_counts(by_code)
            if not self.all_fabrics:
                code = AttemptCode.NO_FABRICS
                summary = f"{title}: no fabric labels on any node: multi-node placement impossible"
                hints.append(
                    Hint(
                        HintCode.LABEL_FABRICS,
                        "give nodes that share NVLink/InfiniBand a fabric label "
                        "(llmgw-agent --fabric NAME)",
                        spec.name,
                    )
                )
            else:
                code = AttemptCode.NO_FABRIC_FITS
                fabrics = tuple(
                    self._fabric_reason(spec, f, ready, heads) for f in self.all_fabrics
                )
                best = min(self.all_fabrics, key=lambda f: (-ready.get(f, 0), f))
                summary = (
                    f"{title}: no fabric has {spec.nodes} ready nodes with "
                    f"{plural(spec.per_node, 'free GPU')} "
                    f"(best: {best} with {ready.get(best, 0)}); {node_part}"
                )
                hints += self._more_nodes_hint(spec, ready)
        drain = self._drain_hint(spec, ready, heads)
        if drain is not None:
            hints.insert(0, drain)
        attempt = ProfileAttempt(
            profile=spec.name,
            code=code,
            summary=summary,
            nodes=listed,
            fabrics=fabrics,
            node_counts=counts,
            nodes_omitted=omitted,
        )
        return attempt, hints

    def _listing(
        self,
        spec: Spec,
        by_code: dict[NodeCode, list[tuple[_Class, Verdict]]],
        codes: list[NodeCode],
    ) -> tuple[NodeReason, ...]:
        """At most `cap` node reasons, round-robin over the codes so each shows up;
        within a code the closest to fitting first, then by node id."""
        streams = [
            _merge_members(sorted(by_code[code], key=lambda e: (-e[1][1], e[0].members[0].id)))
            for code in codes
        ]
        # One node of each code in turn (a code that runs out is padded with None and
        # skipped), until `cap` are picked; then listed code by code (a stable sort).
        rounds = itertools.chain.from_iterable(itertools.zip_longest(*streams))
        picked = list(itertools.islice(filter(None, rounds), self.cap))
        picked.sort(key=lambda item: _RANK[item[2][0]])
        reasons: dict[int, str] = {}
        return tuple(
            NodeReason(node.id, verdict[0], self._message(node, cls, spec, verdict, reasons))
            for node, cls, verdict in picked
        )

    def _fabric_counts(
        self, by_code: dict[NodeCode, list[tuple[_Class, Verdict]]]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Per fabric: nodes that could host a shard, and those of them with 2 free ports."""
        ready: Counter[str] = Counter()
        heads: Counter[str] = Counter()
        for cls, _ in by_code.get(NodeCode.FITS, ()):
            for node in cls.members:
                ready.update(node.fabrics)
                if cls.free_ports >= 2:
                    heads.update(node.fabrics)
        return ready, heads

    def _fabric_reason(
        self, spec: Spec, fabric: str, ready: dict[str, int], heads: dict[str, int]
    ) -> FabricReason:
        count = ready.get(fabric, 0)
        with_gpus = f"{plural(count, 'ready node')} with {plural(spec.per_node, 'free GPU')}"
        if count < spec.nodes:
            return FabricReason(
                fabric,
                FabricCode.TOO_FEW_NODES,
                f"fabric {fabric}: {with_gpus}, needs {spec.nodes}",
                count,
                spec.nodes,
            )
        if not heads.get(fabric):
            lo, hi = self.fleet.port_range
            return FabricReason(
                fabric,
                FabricCode.NO_HEAD_PORT,
                f"fabric {fabric}: {with_gpus}, but none has 2 free ports (HTTP and "
                f"distributed init) in {lo}-{hi} for the head",
                count,
                spec.nodes,
            )
        return FabricReason(
            fabric, FabricCode.FITS, f"fabric {fabric}: {with_gpus}: fits", count, spec.nodes
        )

    # -- hints --

    def _uncordon_hint(self, spec: Spec) -> list[Hint]:
        best: Node | None = None
        for cls in self.classes:
            if (
                cls.cordoned
                and self.verdict(cls, spec, ignore_cordon=True)[0] is NodeCode.FITS
                and (best is None or cls.members[0].id < best.id)
            ):
                best = cls.members[0]
        if best is None:
            return []
        return [
            Hint(
                HintCode.UNCORDON,
                f"fits on {best.id} if it were uncordoned",
                spec.name,
                nodes=(best.id,),
            )
        ]

    def _more_nodes_hint(self, spec: Spec, ready: dict[str, int]) -> list[Hint]:
        short = {f: spec.nodes - ready.get(f, 0) for f in self.all_fabrics}
        wanting = [f for f in self.all_fabrics if short[f] > 0]
        if not wanting:
            return []
        fabric = min(wanting, key=lambda f: (short[f], f))
        more = short[fabric]
        return [
            Hint(
                HintCode.MORE_NODES,
                f"needs {plural(more, 'more ready node')} in fabric {fabric} "
                f"(with {plural(spec.per_node, 'free GPU')} each)",
                spec.name,
                fabric=fabric,
            )
        ]

    def _drain_hint(self, spec: Spec, ready: dict[str, int], heads: dict[str, int]) -> Hint | None:
        """Drain the smallest existing placement whose removal alone would make `spec` fit."""
        key = spec.identity
        if key in self._drains:
            placement = self._drains[key]
        else:
            placement = self._drains[key] = self._drainable(spec, ready, heads)
        if placement is None:
            return None
        frees = " and ".join(
            f"{plural(len(s.gpu_indices), 'GPU')} on {s.node_id}"
            if s.gpu_indices
            else f"a port on {s.node_id}"
            for s in placement.shards
        )
        return Hint(
            HintCode.DRAIN,
            f"fits if replica {placement.replica_id} of model {placement.model} "
            f"were drained (frees {frees})",
            spec.name,
            model=placement.model,
            replica_id=placement.replica_id,
            nodes=placement.nodes,
        )

    def _drainable(
        self, spec: Spec, ready: dict[str, int], heads: dict[str, int]
    ) -> Placement | None:
        """Existing placements are tried one at a time, least GPUs first, at most
        DRAIN_HINT_SCAN of them."""
        fleet = self.fleet
        lo, hi = fleet.port_range
        for placement in itertools.islice(self.holders, DRAIN_HINT_SCAN):
            gained: dict[str, list[int]] = {}  # fabric -> [more ready nodes, more heads]
            fits_alone = False
            for shard in placement.shards:
                node = fleet.nodes.get(shard.node_id)
                if node is None:
                    continue
                cls = self.class_of[node.id]
                freed_ports = sum(
                    1
                    for p in {shard.port, shard.dist_port}
                    if p is not None and p in node.ports and lo <= p <= hi
                )
                ports = node.free_ports + freed_ports
                if self.verdict(cls, spec)[0] is NodeCode.FITS:
                    # It could host a shard already; with 2 free ports it could be the head.
                    if spec.multi and node.free_ports < 2 <= ports:
                        for fabric in node.fabrics:
                            gained.setdefault(fabric, [0, 0])[1] += 1
                    continue
                if spec.fit(cls.freed(shard.gpu_indices, ports))[0] is not NodeCode.FITS:
                    continue
                if not spec.multi:
                    fits_alone = True
                    break
                for fabric in node.fabrics:
                    gain = gained.setdefault(fabric, [0, 0])
                    gain[0] += 1
                    gain[1] += 1 if ports >= 2 else 0
            if not fits_alone:
                fits_alone = any(
                    ready.get(f, 0) + g[0] >= spec.nodes and heads.get(f, 0) + g[1] >= 1
                    for f, g in gained.items()
                )
            if fits_alone:
                return placement
        return None


def _tagged(cls: _Class, verdict: Verdict) -> Iterator[tuple[Node, _Class, Verdict]]:
    for node in cls.members:
        yield node, cls, verdict


def _merge_members(
    entries: list[tuple[_Class, Verdict]],
) -> Iterator[tuple[Node, _Class, Verdict]]:
    """Members of classes already sorted by closeness; equal closeness merged by node id."""
    for _, same in itertools.groupby(entries, key=lambda e: e[1][1]):
        group = list(same)
        yield from heapq.merge(
            *(_tagged(cls, verdict) for cls, verdict in group),
            key=lambda item: item[0].id,
        )


def _count_phrases(
    spec: Spec,
    by_code: dict[NodeCode, list[tuple[_Class, Verdict]]],
    codes: list[NodeCode],
    counts: dict[str, int],
) -> str:
    parts = []
    for code in codes:
        busiest = None
        if code is NodeCode.BUSY:
            # The node with the most free usable GPUs (closeness), the lowest id of them.
            most = max(v[1] for _, v in by_code[code])
            best = min(c.members[0].id for c, v in by_code[code] if v[1] == most)
            busiest = (best, most)
        parts.append(counted(spec, code, counts[code.value], busiest))
    return ", ".join(parts)
