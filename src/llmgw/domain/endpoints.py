"""The engine replicas the router sends requests to, and where the set comes from: the
static configuration, or the control plane publishing its ready replicas (DESIGN §2:
the planes meet at the endpoint sink)."""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["Endpoint", "EndpointSink"]


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
