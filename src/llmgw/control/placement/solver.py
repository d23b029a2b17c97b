"""The solver: plan() places each request on the working state (most constrained
first, by the policy), then has the explainer say why the rest did not fit.

The state's groups and buckets only narrow the search to nodes that might fit; each
node is taken only on the fit check's word (:meth:`Spec.fit
<llmgw.control.placement.spec.Spec.fit>`), the same the explainer reports."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from llmgw.config import PLACEMENT_POLICIES, DeploymentProfile
from llmgw.control.placement.explain import MAX_NODE_REASONS, Explainer
from llmgw.control.placement.spec import Spec
from llmgw.control.placement.state import Fleet, Group, Node
from llmgw.control.placement.values import (
    NodeCapacity,
    NodeCode,
    PlaceRequest,
    PlanResult,
    Unplaceable,
)
from llmgw.domain.fleet import Placement, ShardAssignment


def plan(
    nodes: Iterable[NodeCapacity],
    requests: Sequence[PlaceRequest],
    existing: Iterable[Placement],
    port_range: tuple[int, int],
    now: float,
    *,
    policy: str = "binpack",
    max_node_reasons: int = MAX_NODE_REASONS,
) -> PlanResult:
    """Place `requests` on `nodes` around the `existing` placements; explain the rest.

    `policy` is ``binpack`` or ``spread`` (see the package docstring). Deterministic:
    the same values in (in any order of `nodes` and `existing`) give the same values
    out. Raises ValueError for two nodes with one id or an unknown policy.
    """
    if policy not in PLACEMENT_POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}")
    existing = tuple(existing)
    fleet = Fleet(nodes, existing, port_range)
    solver = Solver(fleet, spread=policy == "spread")
    placed: list[Placement] = []
    failed: list[PlaceRequest] = []
    rooms = solver.rooms(requests)
    for request in sorted(requests, key=lambda r: rooms[id(r)]):
        placement = solver.place(request)
        if placement is None:
            failed.append(request)
        else:
            placed.append(placement)
    unplaced: list[Unplaceable] = []
    if failed:
        explainer = Explainer(fleet, existing, now, max_node_reasons)
        unplaced = [explainer.explain(r) for r in failed]
    return PlanResult(tuple(placed), tuple(unplaced), fleet.capacities())


_Choice = list[tuple[Node, tuple[int, ...]]]  # (node, GPU indices) per shard, rank order


class Solver:
    """Finds nodes, GPUs and ports for one request at a time on `fleet`, by the policy."""

    def __init__(self, fleet: Fleet, *, spread: bool) -> None:
        self.fleet = fleet
        self.spread = spread

    def place(self, request: PlaceRequest) -> Placement | None:
        for profile in request.profiles:
            spec = self.fleet.spec(profile)
            if spec.error is not None:
                continue
            if spec.multi:
                choice = self.find_multi(spec)
            else:
                choice = self.find_single(spec)
                if choice is None and spec.cpu_ok:
                    choice = self.find_cpu(spec)
            if choice is not None:
                return self.commit(request, profile, spec, choice)
        return None

    def _first_fit(self, spec: Spec, ids: list[str], below: str | None) -> Node | None:
        """The first node (by id, before `below`) of a bucket that fits a shard."""
        nodes = self.fleet.nodes
        for node_id in ids:
            if below is not None and node_id >= below:
                return None
            node = nodes[node_id]
            if spec.fit(node)[0] is NodeCode.FITS:
                return node
        return None

    def find_single(self, spec: Spec) -> _Choice | None:
        cands = self.fleet.cands(None, spec)
        if not cands:
            return None
        for free in self._by_policy(range(spec.per_node, self.fleet.max_gpus + 1)):
            best: Node | None = None
            for group in cands:
                ids = group.buckets.get(free)
                if ids:
                    node = self._first_fit(spec, ids, best.id if best else None)
                    if node is not None:
                        best = node
            if best is not None:
                return [(best, self._gpus(best, spec))]
        return None

    def find_cpu(self, spec: Spec) -> _Choice | None:
        best: Node | None = None
        for node in self.fleet.cpu_nodes:  # sorted by id: ties keep the lowest
            if spec.fit(node)[0] is NodeCode.FITS and (
                best is None or node.free_ports > best.free_ports
            ):
                best = node
        return [(best, ())] if best is not None else None

    def find_multi(self, spec: Spec) -> _Choice | None:
        need, count = spec.per_node, spec.nodes
        best: tuple[int, _Choice] | None = None
        for fabric in self.fleet.fabric_names:
            leftover = self.fleet.fabric_free[fabric] - need * count
            if leftover < 0:
                continue
            # The key is smallest for the best fabric: least leftover, or most.
            key = -leftover if self.spread else leftover
            if best is not None and key >= best[0]:
                continue
            cands = self.fleet.cands(fabric, spec)
            if not cands:
                continue
            choice = self._pick_in_fabric(spec, cands)
            if choice is not None:
                best = (key, choice)
        return best[1] if best is not None else None

    def _pick_in_fabric(self, spec: Spec, cands: list[Group]) -> _Choice | None:
        nodes = self.fleet.nodes
        count = spec.nodes
        chosen: _Choice = []
        head: int | None = None  # position in `chosen` of the first node with 2 free ports
        for free in self._by_policy(range(spec.per_node, self.fleet.max_gpus + 1)):
            # A node is in one group of the fabric and buckets are sorted: merged, the
            # bucket's nodes by id, read only as far as needed.
            for node_id in heapq.merge(*(group.buckets.get(free, ()) for group in cands)):
                node = nodes[node_id]
                if spec.fit(node)[0] is not NodeCode.FITS:
                    continue
                if len(chosen) < count:
                    chosen.append((node, self._gpus(node, spec)))
                    if head is None and node.free_ports >= 2:
                        head = len(chosen) - 1
                elif node.free_ports >= 2:
                    # Every chosen node has a single free port: swap in this one, the
                    # next by the policy that can be the head, for the last chosen.
                    chosen[-1] = (node, self._gpus(node, spec))
                    head = len(chosen) - 1
                if len(chosen) == count and head is not None:
                    return [chosen[head], *chosen[:head], *chosen[head + 1 :]]
        return None

    def _by_policy(self, frees: range) -> Iterable[int]:
        """Free-GPU counts in the order the policy tries them: fullest nodes first
        (binpack) or emptiest first (spread)."""
        return reversed(frees) if self.spread else frees

    def rooms(self, requests: Sequence[PlaceRequest]) -> dict[int, int]:
        """By id(request): how many replicas of it the schedulable nodes could hold if
        they were empty, summed over its profiles; the fewer, the more constrained.
        Asked before placing anything, so kept per profile identity."""
        per_spec: dict[tuple[object, ...], int] = {}
        out = {}
        for request in requests:
            total = 0
            for profile in request.profiles:
                spec = self.fleet.spec(profile)
                if spec.error is not None:
                    continue  # (and invalid ones could share a valid one's identity)
                found = per_spec.get(spec.identity)
                if found is None:
                    found = per_spec[spec.identity] = self._room(spec)
                total += found
            out[id(request)] = total
        return out

    def _room(self, spec: Spec) -> int:
        if not spec.multi:
            total = sum(
                g.size() * (len(spec.gpus(g.sig).match) // spec.per_node)
                for g in self.fleet.cands(None, spec)
            )
            if spec.cpu_ok:
                total += sum(spec.engine in n.engines for n in self.fleet.cpu_nodes)
            return total
        # cands() holds only groups whose nodes fit a shard.
        return sum(
            sum(g.size() for g in self.fleet.cands(fabric, spec)) // spec.nodes
            for fabric in self.fleet.fabric_names
        )

    def _gpus(self, node: Node, spec: Spec) -> tuple[int, ...]:
        """The lowest-indexed free usable GPUs of `node` for a shard of `spec`."""
        gpus = spec.gpus(node.sig)
        free = node.free if gpus.every else node.free & gpus.match_set
        return tuple(sorted(free)[: spec.per_node])

    def commit(
        self, request: PlaceRequest, profile: DeploymentProfile, spec: Spec, choice: _Choice
    ) -> Placement:
        shards = []
        for rank, (node, gpus) in enumerate(choice):
            head_of_many = spec.multi and rank == 0
            ports = self.fleet.take(node, gpus, 2 if head_of_many else 1)
            shards.append(
                ShardAssignment(
                    node_id=node.id,
                    rank=rank,
                    gpu_indices=gpus,
                    port=ports[0],
                    dist_port=ports[1] if head_of_many else None,
                )
            )
        return Placement(
            replica_id=request.replica_id,
            model=request.model,
            profile=profile.name,
            epoch=request.epoch,
            shards=tuple(shards),
        )
