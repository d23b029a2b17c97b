"""The solver: plan() places each request on the working state (most constrained
first, by the policy), then has the explainer say why the rest did not fit."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmgw.config import PLACEMENT_POLICIES, DeploymentProfile
from llmgw.control.fleet import Placement, ShardAssignment
from llmgw.control.placement.explain import MAX_NODE_REASONS, Explainer
from llmgw.control.placement.spec import Spec
from llmgw.control.placement.state import Cand, Fleet, Node
from llmgw.control.placement.values import NodeCapacity, PlaceRequest, PlanResult, Unplaceable


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
    rooms = {id(r): solver.room(r) for r in requests}
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

    def _first_fit(self, cand: Cand, ids: list[str], need: int, below: str | None) -> Node | None:
        """The first node (by id, before `below`) of a bucket that fits `need` GPUs."""
        for node_id in ids:
            if below is not None and node_id >= below:
                return None
            node = self.fleet.nodes[node_id]
            if node.free_ports < 1:
                continue
            if not cand.all_match and len(node.free & cand.match_set) < need:
                continue
            return node
        return None

    def find_single(self, spec: Spec) -> _Choice | None:
        need = spec.per_node
        cands = self.fleet.cands(None, spec)
        if not cands:
            return None
        for free in self._by_policy(range(need, self.fleet.max_gpus + 1)):
            best: Node | None = None
            best_cand: Cand | None = None
            for cand in cands:
                ids = cand.group.buckets.get(free)
                if ids:
                    node = self._first_fit(cand, ids, need, best.id if best else None)
                    if node is not None:
                        best, best_cand = node, cand
            if best is not None and best_cand is not None:
                return [(best, self._gpus(best, best_cand, need))]
        return None

    def find_cpu(self, spec: Spec) -> _Choice | None:
        best: Node | None = None
        for node in self.fleet.cpu_nodes:  # sorted by id: ties keep the lowest
            if (
                spec.engine in node.cap.engines
                and node.free_ports >= 1
                and (best is None or node.free_ports > best.free_ports)
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
            choice = self._pick_in_fabric(cands, need, count)
            if choice is not None:
                best = (key, choice)
        return best[1] if best is not None else None

    def _pick_in_fabric(self, cands: list[Cand], need: int, count: int) -> _Choice | None:
        chosen: _Choice = []
        head: int | None = None  # position in `chosen` of the first node with 2 free ports
        for free in self._by_policy(range(need, self.fleet.max_gpus + 1)):
            fits: list[tuple[str, Node, Cand]] = []
            for cand in cands:
                for node_id in cand.group.buckets.get(free, ()):
                    node = self.fleet.nodes[node_id]
                    if node.free_ports < 1:
                        continue
                    if not cand.all_match and len(node.free & cand.match_set) < need:
                        continue
                    fits.append((node_id, node, cand))
            fits.sort(key=lambda t: t[0])
            for _, node, cand in fits:
                if len(chosen) < count:
                    chosen.append((node, self._gpus(node, cand, need)))
                    if head is None and node.free_ports >= 2:
                        head = len(chosen) - 1
                elif node.free_ports >= 2:
                    # Every chosen node has a single free port: swap in this one, the
                    # next by the policy that can be the head, for the last chosen.
                    chosen[-1] = (node, self._gpus(node, cand, need))
                    head = len(chosen) - 1
                if len(chosen) == count and head is not None:
                    return [chosen[head], *chosen[:head], *chosen[head + 1 :]]
        return None

    def _by_policy(self, frees: range) -> Iterable[int]:
        """Free-GPU counts in the order the policy tries them: fullest nodes first
        (binpack) or emptiest first (spread)."""
        return reversed(frees) if self.spread else frees

    def room(self, request: PlaceRequest) -> int:
        """How many replicas of `request` the schedulable nodes could hold if they were
        empty, summed over its profiles: the fewer, the more constrained."""
        total = 0
        for profile in request.profiles:
            spec = self.fleet.spec(profile)
            if spec.error is not None:
                continue
            if not spec.multi:
                total += sum(
                    c.group.size() * (len(c.match) // spec.per_node)
                    for c in self.fleet.cands(None, spec)
                )
                if spec.cpu_ok:
                    total += sum(spec.engine in n.cap.engines for n in self.fleet.cpu_nodes)
                continue
            for fabric in self.fleet.fabric_names:
                # cands() holds only groups whose nodes fit a shard.
                total += sum(c.group.size() for c in self.fleet.cands(fabric, spec)) // spec.nodes
        return total

    def _gpus(self, node: Node, cand: Cand, need: int) -> tuple[int, ...]:
        if cand.all_match:
            return tuple(sorted(node.free)[:need])
        return tuple(sorted(node.free & cand.match_set)[:need])

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
