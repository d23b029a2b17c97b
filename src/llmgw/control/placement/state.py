"""Placement's working state: the fleet as one plan() call changes it. Each node
with its busy GPUs and ports, and the schedulable nodes grouped by engines and GPUs
and bucketed by free GPUs, per fabric too, so a search looks at a bucket of alike
nodes instead of every node."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

import attrs

from llmgw.config import DeploymentProfile
from llmgw.control.placement.spec import Sig, Spec, spec_key
from llmgw.control.placement.values import NodeCapacity
from llmgw.domain.fleet import NodeState, Placement


class Node:
    """One node with what placements hold on it; the fit check reads it (`NodeFacts`)."""

    __slots__ = (
        "cap",
        "cordoned",
        "dirty",
        "engines",
        "fabrics",
        "free",
        "free_ports",
        "gpus",
        "groups",
        "has_fabric",
        "id",
        "ports",
        "sig",
        "state",
        "usable",
    )

    def __init__(
        self,
        cap: NodeCapacity,
        sig: Sig,
        fabrics: tuple[str, ...],
        gpus: set[int],
        ports: set[int],
        free_ports: int,
        dirty: bool,
    ) -> None:
        self.cap = cap
        self.id = cap.node_id
        self.state = cap.state
        self.cordoned = cap.cordoned
        self.engines = cap.engines
        # Pre-filter for the groups: only these can pass the fit check.
        self.usable = cap.state is NodeState.READY and not cap.cordoned
        self.sig = sig
        self.fabrics = fabrics  # sorted, no empty names
        self.has_fabric = bool(fabrics)
        self.gpus = gpus  # busy GPU indices (may name GPUs the node no longer reports)
        self.ports = ports  # busy ports
        self.free: set[int] = {g[0] for g in sig}
        self.free.difference_update(gpus)
        self.free_ports = free_ports
        self.dirty = dirty
        self.groups: list[Group] = []


class Group:
    """Schedulable nodes of one scope (the fleet, or one fabric) with the same engines
    and GPUs, bucketed by their number of free GPUs (node ids sorted in a bucket)."""

    __slots__ = ("buckets", "engines", "sig")

    def __init__(self, engines: frozenset[str], sig: Sig) -> None:
        self.engines = engines
        self.sig = sig
        self.buckets: dict[int, list[str]] = {}

    def add(self, free: int, node_id: str) -> None:
        bisect.insort(self.buckets.setdefault(free, []), node_id)

    def remove(self, free: int, node_id: str) -> None:
        bucket = self.buckets[free]
        del bucket[bisect.bisect_left(bucket, node_id)]
        if not bucket:
            del self.buckets[free]

    def size(self) -> int:
        return sum(len(ids) for ids in self.buckets.values())


class Fleet:
    """Every node of one plan() call, with the placements made so far."""

    def __init__(
        self,
        nodes: Iterable[NodeCapacity],
        existing: Sequence[Placement],
        port_range: tuple[int, int],
    ) -> None:
        self.port_range = port_range
        self.lo, self.hi = port_range
        caps: dict[str, NodeCapacity] = {}
        for cap in nodes:
            if cap.node_id in caps:
                raise ValueError(f"node {cap.node_id!r} appears twice")
            caps[cap.node_id] = cap
        held_gpus: dict[str, set[int]] = {}
        held_ports: dict[str, set[int]] = {}
        for placement in existing:
            for shard in placement.shards:
                if shard.node_id in caps:
                    held_gpus.setdefault(shard.node_id, set()).update(shard.gpu_indices)
                    ports = held_ports.setdefault(shard.node_id, set())
                    ports.add(shard.port)
                    if shard.dist_port is not None:
                        ports.add(shard.dist_port)
        self.nodes: dict[str, Node] = {}
        self.sorted_ids = sorted(caps)
        self.fabric_free: dict[str, int] = {}  # free GPUs of schedulable nodes per fabric
        self.max_gpus = 0
        self.cpu_nodes: list[Node] = []  # schedulable nodes without GPUs
        self.scopes: dict[str | None, list[Group]] = {}
        groups: dict[tuple[str | None, frozenset[str], int], Group] = {}
        sigs: dict[tuple[tuple[int, str, int], ...], Sig] = {}  # one object per GPU set
        lo, hi = self.lo, self.hi
        size = max(0, hi - lo + 1)
        for node_id in self.sorted_ids:
            cap = caps[node_id]
            raw = tuple([(g.index, g.name, g.memory_total) for g in cap.gpus])
            sig = sigs.get(raw)
            if sig is None:
                sig = sigs[raw] = tuple(sorted(raw))
            fabrics = cap.fabrics
            if len(fabrics) != 1 or not fabrics[0]:
                fabrics = tuple(sorted({f for f in fabrics if f}))
            gpus = set(cap.used_gpus)
            ports = set(cap.used_ports)
            dirty = False
            if node_id in held_gpus:
                gpus |= held_gpus[node_id]
                ports |= held_ports[node_id]
                dirty = gpus != cap.used_gpus or ports != cap.used_ports
            free_ports = size - sum(1 for p in ports if lo <= p <= hi) if ports else size
            node = Node(cap, sig, fabrics, gpus, ports, free_ports, dirty)
            self.nodes[node_id] = node
            if not node.usable:
                continue
            if not sig:
                self.cpu_nodes.append(node)
            free = len(node.free)
            self.max_gpus = max(self.max_gpus, free)
            for scope in (None, *fabrics):
                key = (scope, cap.engines, id(sig))
                group = groups.get(key)
                if group is None:
                    group = groups[key] = Group(cap.engines, sig)
                    self.scopes.setdefault(scope, []).append(group)
                # Ids come in order: appending keeps every bucket sorted.
                group.buckets.setdefault(free, []).append(node_id)
                node.groups.append(group)
                if scope is not None:
                    self.fabric_free[scope] = self.fabric_free.get(scope, 0) + free
        self.fabric_names = sorted(self.fabric_free)
        self._cand_cache: dict[tuple[str | None, tuple[object, ...]], list[Group]] = {}
        self._specs: dict[tuple[object, ...], Spec] = {}

    # -- lookups --

    def spec(self, profile: DeploymentProfile) -> Spec:
        """`profile`'s Spec, one per call: it keeps what it found about each GPU set."""
        key = spec_key(profile)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = Spec(profile)
        return spec

    def cands(self, scope: str | None, spec: Spec) -> list[Group]:
        """The groups of `scope` whose nodes have the engine and enough usable GPUs for
        a shard of `spec`, busy or not: the solver's pre-filter before the fit check."""
        key = (scope, spec.identity)
        found = self._cand_cache.get(key)
        if found is None:
            found = [
                group
                for group in self.scopes.get(scope, ())
                if spec.engine in group.engines and spec.gpus(group.sig).code is None
            ]
            self._cand_cache[key] = found
        return found

    # -- changes --

    def take(self, node: Node, gpus: tuple[int, ...], nports: int) -> list[int]:
        node.dirty = True
        if gpus:
            old = len(node.free)
            node.free.difference_update(gpus)
            node.gpus.update(gpus)
            new = len(node.free)
            for group in node.groups:
                group.remove(old, node.id)
                group.add(new, node.id)
            for fabric in node.fabrics:
                self.fabric_free[fabric] -= old - new
        # The lowest ports from the range's start that the node does not hold.
        free = itertools.filterfalse(node.ports.__contains__, itertools.count(self.lo))
        ports = list(itertools.islice(free, nports))
        node.ports.update(ports)
        node.free_ports -= nports
        return ports

    def capacities(self) -> tuple[NodeCapacity, ...]:
        out = []
        for node_id in self.sorted_ids:
            node = self.nodes[node_id]
            if node.dirty:
                out.append(
                    attrs.evolve(
                        node.cap, used_gpus=frozenset(node.gpus), used_ports=frozenset(node.ports)
                    )
                )
            else:
                out.append(node.cap)
        return tuple(out)
