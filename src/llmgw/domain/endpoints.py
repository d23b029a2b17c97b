"""The engine replicas the router sends requests to, and where the set comes from: the
static configuration, or the control plane publishing its ready replicas (DESIGN §2:
the planes meet at the endpoint sink)."""

from __future__ import annotations

import re
from typing import Protocol

import attrs

__all__ = ["EPOCH_TOKEN_SHIFT", "Endpoint", "EndpointSink", "public_name"]

#: A replica's epoch carries the fencing token of the leader that placed it from this
#: bit up (llmgw.control.leadership.epoch_floor); below is its count of placements.
EPOCH_TOKEN_SHIFT = 41
_PLACEMENTS = (1 << EPOCH_TOKEN_SHIFT) - 1
# A replica's id as the reconciler makes it: ``{model}-r{epoch}``.
_REPLICA_ID = re.compile(r"(.+)-r([0-9]{1,30})")


def public_name(endpoint_id: str) -> str:
    """The endpoint as clients see it (``x-llmgw-endpoint``, error messages): a replica
    ``{model}-r{epoch}`` without the leader's fencing token in its epoch's high bits,
    which is the control plane's business (``tiny-r4398046511107`` is ``tiny-r3``:
    the third placement of leader 2); any other id (a configured endpoint's name, a
    replica placed without a leader, whose epoch counts from the clock) as it is.
    Unique among the replicas one leader placed; the admin API shows both."""
    found = _REPLICA_ID.fullmatch(endpoint_id)
    if found is None:
        return endpoint_id
    epoch = int(found.group(2))
    if epoch <= _PLACEMENTS:
        return endpoint_id
    return f"{found.group(1)}-r{epoch & _PLACEMENTS}"


@attrs.frozen
class Endpoint:
    """An engine replica the router may send requests to."""

    id: str
    url: str
    models: tuple[str, ...]
    pool: str = "default"
    weight: float = 1.0
    priority: int = 0
    # Sequences the engine runs at once, when known (see Candidate.capacity).
    capacity: int | None = None
    # Sent with every request and scrape to this engine (its API key, as configured);
    # kept out of reprs, logs and the admin API.
    headers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), repr=False)
    # Idle this long (nothing in flight, nothing routed to it), the router puts the
    # engine to sleep through its sleep API (vLLM's) and wakes it before the next
    # request it routes there (router/sleep.py). None: never.
    sleep_after: float | None = None


class EndpointSink(Protocol):
    """Where the endpoint set comes from: static config or the control plane."""

    def upsert(self, endpoint: Endpoint) -> None:
        """Add an endpoint, or replace one with the same id (keeping its live state)."""

    def drain(self, endpoint_id: str) -> None:
        """Stop sending new requests to the endpoint; requests in flight finish."""

    def remove(self, endpoint_id: str) -> None:
        """Forget the endpoint."""
