"""Placement (DESIGN §5): which nodes, GPUs and ports a replica gets, or why it gets none.

Pure: values in, values out, no clock and no I/O. The reconciler calls
:func:`plan` once per pass with every replica it wants placed::

    result = plan(capacities, requests, existing_placements, control.port_range, now)

and gets a :class:`~llmgw.domain.fleet.Placement` or an :class:`Unplaceable` for
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

Modules
-------
``values`` the public values and codes; ``spec`` what a profile asks of a node and
the one fit check (``Spec.fit``) that both the solver and the explainer ask about
each node; ``state`` the working state one call changes; ``solver`` :func:`plan` and
the search; ``explain`` the explanations; ``wording`` their phrases.
"""

from llmgw.control.placement.explain import DRAIN_HINT_SCAN, MAX_NODE_REASONS
from llmgw.control.placement.solver import plan
from llmgw.control.placement.spec import CPU_ENGINES, cpu_capable
from llmgw.control.placement.values import (
    AttemptCode,
    FabricCode,
    FabricReason,
    Hint,
    HintCode,
    NodeCapacity,
    NodeCode,
    NodeReason,
    PlaceRequest,
    PlanResult,
    ProfileAttempt,
    Unplaceable,
)

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
