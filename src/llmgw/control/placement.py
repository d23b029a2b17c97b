"""Placement (DESIGN §5): which nodes, GPUs and ports a replica gets, or why it gets none.

Pure: values in, values out, no clock and no I/O. The reconciler calls
:func:`plan` once per pass with every replica it wants placed::

    result = plan(capacities, requests, existing_placements, control.port_range, now)

and gets a :class:`~llmgw.control.fleet.Placement` or an :class:`Unplaceable` for
each request, plus the capacities after the new placements (``result.nodes``), so
a second call can chain on the first.

Rules
-----
* The most constrained requests are placed first: those with the fewest places in
  the fleet they could ever fit (counted on the schedulable nodes as if empty, over
  all their profiles), so a model that runs only on some GPUs is not crowded out by
  one that runs anywhere; equally constrained requests keep the order given. A
  request's profiles are tried in order; the first that fits is used.
* Only READY, non-cordoned nodes take new shards, and only if their agent has the
  profile's engine.
* A profile needs ``tensor_parallel x pipeline_parallel`` GPUs, for every engine
  (the simulator too: test fleets run it on fake GPUs, and GPU accounting must
  hold there as well). One exception, for nodes without any GPU: a *CPU-capable*
  profile -- engine ``sim`` or ``llamacpp``, ``tp x pp == 1``, no
  ``min_gpu_memory`` and no ``gpu_name`` -- may run on a GPU-less node, using no
  GPU. GPU nodes are tried first (as for any 1-GPU profile); GPU-less nodes are
  the fallback, least loaded (fewest ports held) first, so a setting meant for a
  GPU is not silently moved to a CPU while a GPU is free.
* A GPU is usable if ``memory_total >= min_gpu_memory`` and ``re.search(gpu_name,
  name)`` matches. A shard gets the lowest-indexed free usable GPUs of its node.
* A GPU or a port is busy if the node's ``used_gpus``/``used_ports`` say so *or*
  an existing placement holds it (agents report shards, not their GPUs, and a
  placement just sent has no report yet). Never two shards on one GPU; never a
  port twice.
* Every shard gets one HTTP port from ``port_range`` (inclusive, lowest free
  first); rank 0 of a multi-node replica also gets its distributed-init port on
  its node.
* Single node, by the policy (``[control] placement``): ``binpack`` (the default),
  among nodes that fit the fullest (fewest free GPUs after placing) wins, to keep
  whole nodes free for big models; ``spread``, the emptiest wins, to spread load
  and the blast radius of a node failure. Ties by node id.
* Multi node (``nodes = tp x pp / gpus_per_node > 1``): one shard of exactly
  ``gpus_per_node`` GPUs on each of ``nodes`` distinct nodes that share a fabric.
  With ``binpack`` the fabric that fits with the least leftover (free GPUs of its
  schedulable nodes after placing) wins, with ``spread`` the most; ties by name;
  inside it nodes are chosen by the policy as above. Rank 0 (the head, which
  serves HTTP) is the first chosen node with two free ports.

Explanations
------------
An :class:`Unplaceable` explains every profile it tried, against the capacities
*after* the whole plan (what an operator sees): a reason per node
(:class:`NodeReason`, ``gpu-3: 2 free GPUs, needs 4``), per fabric for multi-node
profiles (:class:`FabricReason`), node counts by reason, a one-line summary, and
:class:`Hint` values saying what would make it fit: draining one existing
replica (each existing placement alone is tried, smallest first, at most
:data:`DRAIN_HINT_SCAN` of them), uncordoning a node, more nodes in a fabric,
fabric labels. With many nodes the per-node list is capped (``max_node_reasons``,
every reason code still represented); the counts always cover every node.
Everything is attrs values and serialises with cattrs.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import attrs

from llmgw.config import PLACEMENT_POLICIES, DeploymentProfile, ModelConfig
from llmgw.control.fleet import Gpu, NodeInfo, NodeState, Placement, ShardAssignment
from llmgw.domain.engines import cpu_engines

__all__ = [
    "CPU_ENGINES",
    "DRAIN_HINT_SCAN",
    "MAX_NODE_REASONS",
    "AttemptCode",
    "FabricCode",
    "FabricReason",
    "Hint",
    "HintCode",
    "NodeCapacity",
    "NodeCode",
    "NodeReason",
    "PlaceRequest",
    "PlanResult",
    "ProfileAttempt",
    "Unplaceable",
    "cpu_capable",
    "plan",
]

# Engines that can run without a GPU (see the module docstring for the exact rule).
CPU_ENGINES: Final = cpu_engines()
# Existing placements tried, one at a time, for the "fits if X were drained" hint.
DRAIN_HINT_SCAN: Final = 256
# Default cap on the per-node reasons of one profile attempt.
MAX_NODE_REASONS: Final = 50


def _frozen_ints(values: Iterable[int]) -> frozenset[int]:
    return frozenset(values)


def _frozen_strs(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _gpu_tuple(values: Iterable[Gpu]) -> tuple[Gpu, ...]:
    return tuple(values)


# -- inputs --------------------------------------------------------------------------


@attrs.frozen
class NodeCapacity:
    """One node as placement sees it."""

    node_id: str
    state: NodeState
    since: float | None  # when it entered `state` ("lost 3m ago")
    gpus: tuple[Gpu, ...] = attrs.field(converter=_gpu_tuple)
    engines: frozenset[str] = attrs.field(converter=_frozen_strs)
    fabrics: tuple[str, ...] = attrs.field(converter=_str_tuple)
    used_gpus: frozenset[int] = attrs.field(converter=_frozen_ints)  # GPU indices
    used_ports: frozenset[int] = attrs.field(converter=_frozen_ints)
    address: str
    cordoned: bool = False

    @classmethod
    def from_info(
        cls,
        info: NodeInfo,
        state: NodeState,
        *,
        since: float | None = None,
        used_gpus: Iterable[int] = (),
        used_ports: Iterable[int] = (),
        cordoned: bool = False,
    ) -> NodeCapacity:
        return cls(
            node_id=info.node_id,
            state=state,
            since=since,
            gpus=info.gpus,
            engines=frozenset(e.name for e in info.engines),
            fabrics=info.fabrics,
            used_gpus=used_gpus,
            used_ports=used_ports,
            address=info.address,
            cordoned=cordoned,
        )


@attrs.frozen
class PlaceRequest:
    """One replica to place, with its model's deployment profiles in order of preference."""

    model: str
    replica_id: str
    epoch: int
    profiles: tuple[DeploymentProfile, ...]

    @classmethod
    def for_model(cls, model: ModelConfig, replica_id: str, epoch: int) -> PlaceRequest:
        return cls(model.name, replica_id, epoch, model.profiles)


# -- explanations --------------------------------------------------------------------


class NodeCode(enum.StrEnum):
    """Why one node cannot take (a shard of) a replica, from least to most fixable by
    waiting; `FITS` only appears for multi-node profiles (the node could host a shard,
    the fabric is what is missing)."""

    FITS = "fits"
    NO_PORTS = "no_ports"
    BUSY = "busy"  # enough usable GPUs, not enough of them free
    TOO_FEW_GPUS = "too_few_gpus"  # fewer usable GPUs than the profile needs, even idle
    GPU_MEMORY = "gpu_memory"
    GPU_NAME = "gpu_name"
    NO_GPUS = "no_gpus"
    NO_FABRIC = "no_fabric"
    NO_ENGINE = "no_engine"
    CORDONED = "cordoned"
    UNREACHABLE = "unreachable"
    LOST = "lost"


class FabricCode(enum.StrEnum):
    TOO_FEW_NODES = "too_few_nodes"
    NO_HEAD_PORT = "no_head_port"
    FITS = "fits"


class AttemptCode(enum.StrEnum):
    """Why one profile did not fit, as a whole."""

    NO_NODES = "no_nodes"  # no node is known at all
    NO_NODE_FITS = "no_node_fits"
    NO_FABRICS = "no_fabrics"  # multi-node profile, and no node has a fabric label
    NO_FABRIC_FITS = "no_fabric_fits"
    INVALID_PROFILE = "invalid_profile"


class HintCode(enum.StrEnum):
    DRAIN = "drain"  # fits if this replica were drained
    UNCORDON = "uncordon"  # fits if this node were uncordoned
    MORE_NODES = "more_nodes"  # a fabric needs more ready nodes with free GPUs
    LABEL_FABRICS = "label_fabrics"  # no node has a fabric label


@attrs.frozen
class NodeReason:
    node_id: str
    code: NodeCode
    message: str  # "gpu-3: 2 free GPUs, needs 4"


@attrs.frozen
class FabricReason:
    fabric: str
    code: FabricCode
    message: str  # "fabric ib-a: 1 ready node with 8 free GPUs, needs 2"
    ready_nodes: int  # nodes of the fabric that could host a shard now
    needs: int  # nodes the profile needs


@attrs.frozen
class Hint:
    """Something that would make the request fit."""

    code: HintCode
    message: str
    profile: str
    model: str | None = None  # DRAIN: the replica to drain
    replica_id: str | None = None
    nodes: tuple[str, ...] = ()
    fabric: str | None = None


@attrs.frozen
class ProfileAttempt:
    """Why one profile did not fit."""

    profile: str
    code: AttemptCode
    summary: str
    nodes: tuple[NodeReason, ...] = ()  # at most `max_node_reasons`
    fabrics: tuple[FabricReason, ...] = ()  # multi-node profiles only
    node_counts: dict[str, int] = attrs.field(factory=dict)  # NodeCode value -> nodes
    nodes_omitted: int = 0  # nodes counted but not listed in `nodes`


@attrs.frozen
class Unplaceable:
    request: PlaceRequest
    summary: str  # one line
    attempts: tuple[ProfileAttempt, ...]  # one per profile, in order
    hints: tuple[Hint, ...] = ()

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def replica_id(self) -> str:
        return self.request.replica_id


@attrs.frozen
class PlanResult:
    placed: tuple[Placement, ...]
    unplaced: tuple[Unplaceable, ...]
    # Every node (by id) with the GPUs and ports that existing and new placements hold:
    # pass these, with `existing + placed`, to a following call.
    nodes: tuple[NodeCapacity, ...] = ()


# -- plan ----------------------------------------------------------------------------


def cpu_capable(profile: DeploymentProfile) -> bool:
    """Whether `profile` may run on a node without GPUs (see the module docstring)."""
    return (
        profile.engine in CPU_ENGINES
        and profile.gpus == 1
        and profile.min_gpu_memory is None
        and profile.gpu_name is None
    )


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

    `policy` is ``binpack`` or ``spread`` (see the module docstring). Deterministic:
    the same values in (in any order of `nodes` and `existing`) give the same values
    out. Raises ValueError for two nodes with one id or an unknown policy.
    """
    if policy not in PLACEMENT_POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}")
    existing = tuple(existing)
    fleet = _Fleet(nodes, existing, port_range, spread=policy == "spread")
    placed: list[Placement] = []
    failed: list[PlaceRequest] = []
    rooms = {id(r): fleet.room(r) for r in requests}
    for request in sorted(requests, key=lambda r: rooms[id(r)]):
        placement = fleet.place(request)
        if placement is None:
            failed.append(request)
        else:
            placed.append(placement)
    unplaced: list[Unplaceable] = []
    if failed:
        explainer = _Explainer(fleet, existing, now, max_node_reasons)
        unplaced = [explainer.explain(r) for r in failed]
    return PlanResult(tuple(placed), tuple(unplaced), fleet.capacities())


# -- the working state ---------------------------------------------------------------

_Sig = tuple[tuple[int, str, int], ...]  # (index, name, memory_total) of each GPU
_Filter = tuple[int | None, str | None]  # (min_gpu_memory, gpu_name)


class _Spec:
    """What one profile asks of nodes."""

    __slots__ = ("cpu_ok", "engine", "error", "filt", "label", "name", "nodes", "per_node")

    def __init__(self, profile: DeploymentProfile) -> None:
        self.name = profile.name
        self.engine = profile.engine
        self.filt: _Filter = (profile.min_gpu_memory, profile.gpu_name)
        self.cpu_ok = cpu_capable(profile)
        self.error: str | None = None
        total = profile.gpus
        per_node = profile.shard_gpus
        self.per_node = per_node
        self.nodes = profile.node_count
        if total < 1 or per_node < 1 or total % per_node:
            self.error = (
                f"tensor_parallel x pipeline_parallel = {total} GPUs does not split "
                f"into whole nodes of {per_node}"
            )
        elif profile.gpu_name is not None:
            try:
                re.compile(profile.gpu_name)
            except re.error as exc:
                self.error = (
                    f"gpu_name {profile.gpu_name!r} is not a valid regular expression: {exc}"
                )
        if self.nodes > 1:
            self.label = f"{self.name} ({self.nodes} nodes x {_n(per_node, 'GPU')})"
        else:
            self.label = f"{self.name} ({_n(per_node, 'GPU')})"

    @property
    def multi(self) -> bool:
        return self.nodes > 1


def _spec_key(profile: DeploymentProfile) -> tuple[object, ...]:
    return (
        profile.name,
        profile.engine,
        profile.tensor_parallel,
        profile.pipeline_parallel,
        profile.gpus_per_node,
        profile.min_gpu_memory,
        profile.gpu_name,
    )


class _Node:
    __slots__ = (
        "cap",
        "dirty",
        "explain_class",
        "fabrics",
        "free",
        "free_ports",
        "gpus",
        "groups",
        "id",
        "ports",
        "sig",
        "usable",
    )

    def __init__(
        self,
        cap: NodeCapacity,
        sig: _Sig,
        fabrics: tuple[str, ...],
        gpus: set[int],
        ports: set[int],
        free_ports: int,
        dirty: bool,
    ) -> None:
        self.cap = cap
        self.id = cap.node_id
        self.usable = cap.state is NodeState.READY and not cap.cordoned
        self.sig = sig
        self.fabrics = fabrics  # sorted, no empty names
        self.gpus = gpus  # busy GPU indices (may name GPUs the node no longer reports)
        self.ports = ports  # busy ports
        self.free: set[int] = {g[0] for g in sig}
        self.free.difference_update(gpus)
        self.free_ports = free_ports
        self.dirty = dirty
        self.groups: list[_Group] = []
        self.explain_class: _Class | None = None


class _Group:
    """Schedulable nodes of one scope (the fleet, or one fabric) with the same engines
    and GPUs, bucketed by their number of free GPUs (node ids sorted in a bucket)."""

    __slots__ = ("buckets", "engines", "sig")

    def __init__(self, engines: frozenset[str], sig: _Sig) -> None:
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


class _Cand:
    """A group that a profile filter can use, with the usable GPU indices of its nodes."""

    __slots__ = ("all_match", "group", "match", "match_set")

    def __init__(self, group: _Group, match: tuple[int, ...]) -> None:
        self.group = group
        self.match = match
        self.match_set = frozenset(match)
        self.all_match = len(match) == len(group.sig)


_Choice = list[tuple[_Node, tuple[int, ...]]]  # (node, GPU indices) per shard, rank order


class _Fleet:
    def __init__(
        self,
        nodes: Iterable[NodeCapacity],
        existing: Sequence[Placement],
        port_range: tuple[int, int],
        *,
        spread: bool = False,
    ) -> None:
        self.spread = spread
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
        self.nodes: dict[str, _Node] = {}
        self.sorted_ids = sorted(caps)
        self.fabric_free: dict[str, int] = {}  # free GPUs of schedulable nodes per fabric
        self.max_gpus = 0
        self.cpu_nodes: list[_Node] = []  # schedulable nodes without GPUs
        self.scopes: dict[str | None, list[_Group]] = {}
        groups: dict[tuple[str | None, frozenset[str], int], _Group] = {}
        sigs: dict[tuple[tuple[int, str, int], ...], _Sig] = {}  # one object per GPU set
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
            node = _Node(cap, sig, fabrics, gpus, ports, free_ports, dirty)
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
                    group = groups[key] = _Group(cap.engines, sig)
                    self.scopes.setdefault(scope, []).append(group)
                # Ids come in order: appending keeps every bucket sorted.
                group.buckets.setdefault(free, []).append(node_id)
                node.groups.append(group)
                if scope is not None:
                    self.fabric_free[scope] = self.fabric_free.get(scope, 0) + free
        self.fabric_names = sorted(self.fabric_free)
        self._match_cache: dict[tuple[_Filter, _Sig], tuple[int, ...]] = {}
        self._cand_cache: dict[tuple[str | None, str, _Filter, int], list[_Cand]] = {}
        self._specs: dict[tuple[object, ...], _Spec] = {}
        self._regex: dict[str, re.Pattern[str]] = {}

    # -- lookups --

    def spec(self, profile: DeploymentProfile) -> _Spec:
        key = _spec_key(profile)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = _Spec(profile)
        return spec

    def regex(self, pattern: str) -> re.Pattern[str]:
        compiled = self._regex.get(pattern)
        if compiled is None:
            compiled = self._regex[pattern] = re.compile(pattern)
        return compiled

    def match(self, filt: _Filter, sig: _Sig) -> tuple[int, ...]:
        """Indices of the GPUs in `sig` that pass the profile filter."""
        key = (filt, sig)
        found = self._match_cache.get(key)
        if found is None:
            min_memory, pattern = filt
            regex = self.regex(pattern) if pattern is not None else None
            found = tuple(
                index
                for index, name, memory in sig
                if (min_memory is None or memory >= min_memory)
                and (regex is None or regex.search(name))
            )
            self._match_cache[key] = found
        return found

    def cands(self, scope: str | None, spec: _Spec) -> list[_Cand]:
        key = (scope, spec.engine, spec.filt, spec.per_node)
        found = self._cand_cache.get(key)
        if found is None:
            found = []
            for group in self.scopes.get(scope, ()):
                if spec.engine in group.engines:
                    match = self.match(spec.filt, group.sig)
                    if len(match) >= spec.per_node:
                        found.append(_Cand(group, match))
            self._cand_cache[key] = found
        return found

    # -- placing --

    def place(self, request: PlaceRequest) -> Placement | None:
        for profile in request.profiles:
            spec = self.spec(profile)
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

    def _first_fit(self, cand: _Cand, ids: list[str], need: int, below: str | None) -> _Node | None:
        """The first node (by id, before `below`) of a bucket that fits `need` GPUs."""
        for node_id in ids:
            if below is not None and node_id >= below:
                return None
            node = self.nodes[node_id]
            if node.free_ports < 1:
                continue
            if not cand.all_match and len(node.free & cand.match_set) < need:
                continue
            return node
        return None

    def find_single(self, spec: _Spec) -> _Choice | None:
        need = spec.per_node
        cands = self.cands(None, spec)
        if not cands:
            return None
        for free in self._by_policy(range(need, self.max_gpus + 1)):
            best: _Node | None = None
            best_cand: _Cand | None = None
            for cand in cands:
                ids = cand.group.buckets.get(free)
                if ids:
                    node = self._first_fit(cand, ids, need, best.id if best else None)
                    if node is not None:
                        best, best_cand = node, cand
            if best is not None and best_cand is not None:
                return [(best, self._gpus(best, best_cand, need))]
        return None

    def find_cpu(self, spec: _Spec) -> _Choice | None:
        best: _Node | None = None
        for node in self.cpu_nodes:  # sorted by id: ties keep the lowest
            if (
                spec.engine in node.cap.engines
                and node.free_ports >= 1
                and (best is None or node.free_ports > best.free_ports)
            ):
                best = node
        return [(best, ())] if best is not None else None

    def find_multi(self, spec: _Spec) -> _Choice | None:
        need, count = spec.per_node, spec.nodes
        best: tuple[int, _Choice] | None = None
        for fabric in self.fabric_names:
            leftover = self.fabric_free[fabric] - need * count
            if leftover < 0:
                continue
            # The key is smallest for the best fabric: least leftover, or most.
            key = -leftover if self.spread else leftover
            if best is not None and key >= best[0]:
                continue
            cands = self.cands(fabric, spec)
            if not cands:
                continue
            choice = self._pick_in_fabric(cands, need, count)
            if choice is not None:
                best = (key, choice)
        return best[1] if best is not None else None

    def _pick_in_fabric(self, cands: list[_Cand], need: int, count: int) -> _Choice | None:
        chosen: _Choice = []
        head: int | None = None  # position in `chosen` of the first node with 2 free ports
        for free in self._by_policy(range(need, self.max_gpus + 1)):
            fits: list[tuple[str, _Node, _Cand]] = []
            for cand in cands:
                for node_id in cand.group.buckets.get(free, ()):
                    node = self.nodes[node_id]
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
            spec = self.spec(profile)
            if spec.error is not None:
                continue
            if not spec.multi:
                total += sum(
                    c.group.size() * (len(c.match) // spec.per_node) for c in self.cands(None, spec)
                )
                if spec.cpu_ok:
                    total += sum(spec.engine in n.cap.engines for n in self.cpu_nodes)
                continue
            for fabric in self.fabric_names:
                # cands() holds only groups whose nodes fit a shard.
                total += sum(c.group.size() for c in self.cands(fabric, spec)) // spec.nodes
        return total

    def _gpus(self, node: _Node, cand: _Cand, need: int) -> tuple[int, ...]:
        if cand.all_match:
            return tuple(sorted(node.free)[:need])
        return tuple(sorted(node.free & cand.match_set)[:need])

    def commit(
        self, request: PlaceRequest, profile: DeploymentProfile, spec: _Spec, choice: _Choice
    ) -> Placement:
        shards = []
        for rank, (node, gpus) in enumerate(choice):
            head_of_many = spec.multi and rank == 0
            ports = self._take(node, gpus, 2 if head_of_many else 1)
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

    def _take(self, node: _Node, gpus: tuple[int, ...], nports: int) -> list[int]:
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
        ports: list[int] = []
        port = self.lo
        while len(ports) < nports:
            while port in node.ports:
                port += 1
            ports.append(port)
            node.ports.add(port)
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


# -- explaining ----------------------------------------------------------------------


class _Class:
    """Nodes that every profile judges alike (same state, engines, GPUs, free GPUs...)."""

    __slots__ = ("cordoned", "engines", "free", "has_fabric", "members", "ports", "sig", "state")

    def __init__(self, node: _Node) -> None:
        self.state = node.cap.state
        self.cordoned = node.cap.cordoned
        self.engines = node.cap.engines
        self.has_fabric = bool(node.fabrics)
        self.sig = node.sig
        self.free = frozenset(node.free)
        self.ports = min(node.free_ports, 2)
        self.members: list[_Node] = []


_Verdict = tuple[NodeCode, str | None, int]  # code, message (None: per node), closeness


class _Explainer:
    def __init__(
        self, fleet: _Fleet, existing: Sequence[Placement], now: float, max_node_reasons: int
    ) -> None:
        self.fleet = fleet
        self.now = now
        self.cap = max(1, max_node_reasons)
        classes: dict[tuple[object, ...], _Class] = {}
        for node_id in fleet.sorted_ids:
            node = fleet.nodes[node_id]
            key = (
                node.cap.state,
                node.cap.cordoned,
                node.cap.engines,
                bool(node.fabrics),
                node.sig,
                frozenset(node.free),
                min(node.free_ports, 2),
            )
            cls = classes.get(key)
            if cls is None:
                cls = classes[key] = _Class(node)
            cls.members.append(node)
            node.explain_class = cls
        self.classes = list(classes.values())
        self.all_fabrics = sorted({f for node in fleet.nodes.values() for f in node.fabrics})
        # Existing placements, the least disruptive to drain first.
        self.holders = sorted(
            existing,
            key=lambda p: (sum(len(s.gpu_indices) for s in p.shards), p.replica_id, p.model),
        )
        self._verdicts: dict[tuple[int, tuple[object, ...], bool], _Verdict] = {}
        self._drains: dict[tuple[object, ...], Placement | None] = {}
        self._memo: dict[
            tuple[tuple[object, ...], ...], tuple[str, tuple[ProfileAttempt, ...], tuple[Hint, ...]]
        ] = {}

    def explain(self, request: PlaceRequest) -> Unplaceable:
        key = tuple(_spec_key(p) for p in request.profiles)
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

    def verdict(self, cls: _Class, spec: _Spec, ignore_cordon: bool = False) -> _Verdict:
        key = (id(cls), _spec_identity(spec), ignore_cordon)
        found = self._verdicts.get(key)
        if found is None:
            found = self._verdicts[key] = self._judge(cls, spec, ignore_cordon)
        return found

    def _judge(self, cls: _Class, spec: _Spec, ignore_cordon: bool) -> _Verdict:
        if cls.state is NodeState.LOST:
            return NodeCode.LOST, None, 0
        if cls.state is NodeState.UNREACHABLE:
            return NodeCode.UNREACHABLE, None, 0
        if cls.cordoned and not ignore_cordon:
            return NodeCode.CORDONED, "cordoned", 0
        if spec.engine not in cls.engines:
            has = ", ".join(sorted(cls.engines)) or "none"
            return NodeCode.NO_ENGINE, f"engine {spec.engine} not installed (has {has})", 0
        if spec.multi and not cls.has_fabric:
            return NodeCode.NO_FABRIC, "no fabric label: cannot join a multi-node replica", 0
        need = spec.per_node
        no_port = f"no free port in {self.fleet.lo}-{self.fleet.hi}"
        if not cls.sig:
            if spec.cpu_ok:
                if cls.ports < 1:
                    return NodeCode.NO_PORTS, no_port, 0
                return NodeCode.FITS, f"could run it without a GPU ({spec.engine})", 0
            return NodeCode.NO_GPUS, f"no GPUs, needs {need}", 0
        min_memory, pattern = spec.filt
        named = cls.sig
        if pattern is not None:
            regex = self.fleet.regex(pattern)
            named = tuple(g for g in cls.sig if regex.search(g[1]))
            if not named:
                has = ", ".join(sorted({g[1] for g in cls.sig}))
                return NodeCode.GPU_NAME, f"no GPU matches {pattern!r} (has {has})", 0
        if min_memory is not None and not any(g[2] >= min_memory for g in named):
            which = f"GPUs matching {pattern!r}" if len(named) < len(cls.sig) else "GPUs"
            have = _memory_range([g[2] for g in named])
            return (
                NodeCode.GPU_MEMORY,
                f"{which} have {have}, needs {_gb(min_memory)}",
                0,
            )
        match = self.fleet.match(spec.filt, cls.sig)
        every = len(match) == len(cls.sig)
        if len(match) < need:
            message = (
                f"has {_n(len(match), 'GPU')}, needs {need}"
                if every
                else f"has {_n(len(match), 'matching GPU')} (of {len(cls.sig)}), needs {need}"
            )
            return NodeCode.TOO_FEW_GPUS, message, len(match)
        free = len(cls.free.intersection(match))
        if free < need:
            what = "free GPU" if every else "free matching GPU"
            return NodeCode.BUSY, f"{_n(free, what)}, needs {need}", free
        if cls.ports < 1:
            return NodeCode.NO_PORTS, no_port, free
        what = "free GPU" if every else "free matching GPU"
        if spec.multi:
            return NodeCode.FITS, f"{_n(free, what)}: could host a shard", free
        return NodeCode.FITS, f"{_n(free, what)}: could host it", free

    def _message(self, node: _Node, verdict: _Verdict) -> str:
        code, message, _ = verdict
        if message is None:
            since = node.cap.since
            if code is NodeCode.LOST:
                message = "lost" if since is None else f"lost {_ago(self.now - since)} ago"
            else:
                message = (
                    "unreachable (no heartbeat)"
                    if since is None
                    else f"unreachable for {_ago(self.now - since)} (no heartbeat)"
                )
        return f"{node.id}: {message}"

    # -- one profile --

    def _attempt(self, spec: _Spec) -> tuple[ProfileAttempt, list[Hint]]:
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
                    spec.name, AttemptCode.NO_NODES, f"{spec.label}: no nodes registered"
                ),
                [],
            )
        by_code: dict[NodeCode, list[tuple[_Class, _Verdict]]] = {}
        for cls in self.classes:
            verdict = self.verdict(cls, spec)
            by_code.setdefault(verdict[0], []).append((cls, verdict))
        codes = [c for c in NodeCode if c in by_code]
        counts = {c.value: sum(len(cls.members) for cls, _ in by_code[c]) for c in codes}
        listed = self._listing(by_code, codes)
        omitted = len(self.fleet.nodes) - len(listed)
        node_part = _count_phrases(spec, by_code, codes, counts)
        hints: list[Hint] = []
        fabrics: tuple[FabricReason, ...] = ()
        ready: dict[str, int] = {}
        heads: dict[str, int] = {}
        if not spec.multi:
            code = AttemptCode.NO_NODE_FITS
            summary = f"{spec.label}: no node fits: {node_part}"
            hints += self._uncordon_hint(spec)
        else:
            ready, heads = self._fabric_counts(by_code)
            if not self.all_fabrics:
                code = AttemptCode.NO_FABRICS
                summary = (
                    f"{spec.label}: no fabric labels on any node: multi-node placement impossible"
                )
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
                    f"{spec.label}: no fabric has {spec.nodes} ready nodes with "
                    f"{_n(spec.per_node, 'free GPU')} (best: {best} with {ready.get(best, 0)}); "
                    f"{node_part}"
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
        by_code: dict[NodeCode, list[tuple[_Class, _Verdict]]],
        codes: list[NodeCode],
    ) -> tuple[NodeReason, ...]:
        """At most `cap` node reasons, round-robin over the codes so each shows up;
        within a code the closest to fitting first, then by node id."""
        streams: list[tuple[NodeCode, Iterator[tuple[_Node, _Verdict]]]] = []
        for code in codes:
            entries = sorted(by_code[code], key=lambda e: (-e[1][2], e[0].members[0].id))
            streams.append((code, _merge_members(entries)))
        picked: dict[NodeCode, list[tuple[_Node, _Verdict]]] = {c: [] for c in codes}
        total = 0
        live = list(streams)
        while live and total < self.cap:
            still = []
            for code, stream in live:
                if total >= self.cap:
                    break
                item = next(stream, None)
                if item is None:
                    continue
                picked[code].append(item)
                total += 1
                still.append((code, stream))
            live = still
        return tuple(
            NodeReason(node.id, code, self._message(node, verdict))
            for code in codes
            for node, verdict in picked[code]
        )

    def _fabric_counts(
        self, by_code: dict[NodeCode, list[tuple[_Class, _Verdict]]]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Per fabric: nodes that could host a shard, and those of them with 2 free ports."""
        ready: dict[str, int] = {}
        heads: dict[str, int] = {}
        for cls, _ in by_code.get(NodeCode.FITS, ()):
            for node in cls.members:
                for fabric in node.fabrics:
                    ready[fabric] = ready.get(fabric, 0) + 1
                    if cls.ports >= 2:
                        heads[fabric] = heads.get(fabric, 0) + 1
        return ready, heads

    def _fabric_reason(
        self, spec: _Spec, fabric: str, ready: dict[str, int], heads: dict[str, int]
    ) -> FabricReason:
        count = ready.get(fabric, 0)
        nodes = "node" if count == 1 else "nodes"
        with_gpus = f"{count} ready {nodes} with {_n(spec.per_node, 'free GPU')}"
        if count < spec.nodes:
            return FabricReason(
                fabric,
                FabricCode.TOO_FEW_NODES,
                f"fabric {fabric}: {with_gpus}, needs {spec.nodes}",
                count,
                spec.nodes,
            )
        if not heads.get(fabric):
            return FabricReason(
                fabric,
                FabricCode.NO_HEAD_PORT,
                f"fabric {fabric}: {with_gpus}, but none has 2 free ports (HTTP and "
                f"distributed init) in {self.fleet.lo}-{self.fleet.hi} for the head",
                count,
                spec.nodes,
            )
        return FabricReason(
            fabric, FabricCode.FITS, f"fabric {fabric}: {with_gpus}: fits", count, spec.nodes
        )

    # -- hints --

    def _uncordon_hint(self, spec: _Spec) -> list[Hint]:
        best: _Node | None = None
        for cls in self.classes:
            if (
                cls.cordoned
                and cls.state is NodeState.READY
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

    def _more_nodes_hint(self, spec: _Spec, ready: dict[str, int]) -> list[Hint]:
        short = {f: spec.nodes - ready.get(f, 0) for f in self.all_fabrics}
        wanting = [f for f in self.all_fabrics if short[f] > 0]
        if not wanting:
            return []
        fabric = min(wanting, key=lambda f: (short[f], f))
        more = short[fabric]
        return [
            Hint(
                HintCode.MORE_NODES,
                f"needs {more} more ready {'node' if more == 1 else 'nodes'} in fabric "
                f"{fabric} (with {_n(spec.per_node, 'free GPU')} each)",
                spec.name,
                fabric=fabric,
            )
        ]

    def _drain_hint(self, spec: _Spec, ready: dict[str, int], heads: dict[str, int]) -> Hint | None:
        """Drain the smallest existing placement whose removal alone would make `spec` fit."""
        key = _spec_identity(spec)
        if key in self._drains:
            placement = self._drains[key]
        else:
            placement = self._drains[key] = self._drainable(spec, ready, heads)
        if placement is None:
            return None
        frees = " and ".join(
            f"{_n(len(s.gpu_indices), 'GPU')} on {s.node_id}"
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
        self, spec: _Spec, ready: dict[str, int], heads: dict[str, int]
    ) -> Placement | None:
        """Existing placements are tried one at a time, least GPUs first, at most
        DRAIN_HINT_SCAN of them."""
        fleet = self.fleet
        for placement in itertools.islice(self.holders, DRAIN_HINT_SCAN):
            gained: dict[str, list[int]] = {}  # fabric -> [more ready nodes, more heads]
            fits_alone = False
            for shard in placement.shards:
                node = fleet.nodes.get(shard.node_id)
                if node is None or node.explain_class is None:
                    continue
                code = self.verdict(node.explain_class, spec)[0]
                if code not in (NodeCode.BUSY, NodeCode.NO_PORTS, NodeCode.FITS):
                    continue
                freed_ports = sum(
                    1
                    for p in {shard.port, shard.dist_port}
                    if p is not None and p in node.ports and fleet.lo <= p <= fleet.hi
                )
                ports = node.free_ports + freed_ports
                if code is NodeCode.FITS:
                    if spec.multi and node.free_ports < 2 <= ports:
                        for fabric in node.fabrics:
                            gained.setdefault(fabric, [0, 0])[1] += 1
                    continue
                if ports < 1:
                    continue
                if node.sig:
                    match = fleet.match(spec.filt, node.sig)
                    free = len((node.free | set(shard.gpu_indices)).intersection(match))
                    if free < spec.per_node:
                        continue
                elif not spec.cpu_ok:
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


def _spec_identity(spec: _Spec) -> tuple[object, ...]:
    return (spec.engine, spec.filt, spec.per_node, spec.nodes, spec.cpu_ok)


def _tagged(cls: _Class, verdict: _Verdict) -> Iterator[tuple[_Node, _Verdict]]:
    for node in cls.members:
        yield node, verdict


def _merge_members(
    entries: list[tuple[_Class, _Verdict]],
) -> Iterator[tuple[_Node, _Verdict]]:
    """Members of classes already sorted by closeness; equal closeness merged by node id."""
    for _, same in itertools.groupby(entries, key=lambda e: e[1][2]):
        group = list(same)
        yield from heapq.merge(
            *(_tagged(cls, verdict) for cls, verdict in group),
            key=lambda item: item[0].id,
        )


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


def _count_phrases(
    spec: _Spec,
    by_code: dict[NodeCode, list[tuple[_Class, _Verdict]]],
    codes: list[NodeCode],
    counts: dict[str, int],
) -> str:
    min_memory, pattern = spec.filt
    parts = []
    for code in codes:
        count = counts[code.value]
        phrase = _PHRASES[code].format(
            need=spec.per_node,
            memory=_gb(min_memory) if min_memory is not None else "",
            pattern=pattern,
            engine=spec.engine,
        )
        if not spec.multi and code is NodeCode.FITS:
            phrase = "could host it"
        text = f"{_n(count, 'node')} {phrase}"
        if code is NodeCode.BUSY:
            most = max(v[2] for _, v in by_code[code])
            if most:
                best = min(c.members[0].id for c, v in by_code[code] if v[2] == most)
                text += f" (best: {best} with {most} free)"
            else:
                text += " (none free)"
        parts.append(text)
    return ", ".join(parts)


# -- words ---------------------------------------------------------------------------


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _gb(size: int) -> str:
    gb = size / 1e9
    return f"{round(gb)} GB" if abs(gb - round(gb)) < 0.05 else f"{gb:.1f} GB"


def _memory_range(sizes: list[int]) -> str:
    lo, hi = min(sizes), max(sizes)
    if _gb(lo) == _gb(hi):
        return _gb(lo)
    return f"{_gb(lo).removesuffix(' GB')}-{_gb(hi)}"


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"
