"""The store's interface and the values it returns.

A store holds API keys (only their hashes), usage records, models added at
runtime, dashboard sessions (DESIGN §8) and the operator's node cordons. Two
backends implement :class:`Store`: SQLite for one server (:mod:`llmgw.store.sqlite`)
and PostgreSQL for several (:mod:`llmgw.store.postgres`);
:func:`llmgw.store.open_store` picks one from a URL.

Times are wall-clock seconds since the epoch (``time.time()``), as floats, in
every column and value: usage buckets are whole multiples of the bucket size
since the epoch (so in UTC).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, Protocol
from urllib.parse import urlsplit, urlunsplit

import attrs

from llmgw.config import JSON_WORDING, converter, structure_as
from llmgw.domain.catalog import ModelConfig
from llmgw.domain.keys import KeyRecord
from llmgw.domain.usage import UsageRecord

__all__ = [
    "GroupBy",
    "KeyRecord",
    "SchemaTooNew",
    "Session",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "StoredCordon",
    "StoredEndpoint",
    "StoredModel",
    "TimedUsage",
    "UnsupportedStoreURL",
    "UsageRow",
    "model_from_dict",
    "model_to_dict",
    "redact_url",
]

GroupBy = Literal["key", "model"]

# One finished request and the wall-clock time it finished (the batcher stamps it).
TimedUsage = tuple[float, UsageRecord]


class StoreError(Exception):
    """The store could not do what was asked (a database error, named)."""


class StoreUnavailable(StoreError):
    """The database cannot be opened or reached."""


class StoreClosed(StoreError):
    """The store was closed; nothing more can be asked of it."""


class UnsupportedStoreURL(StoreError, ValueError):
    """The URL's scheme names no backend."""


class DuplicateKeyName(StoreError):
    """A key that is not revoked already has this name (names tell keys apart)."""

    def __init__(self, name: str, existing: str) -> None:
        self.name = name
        self.existing = existing  # that key's id
        super().__init__(
            f"a key named {name!r} exists ({existing}) and is not revoked: "
            "choose another name, or revoke that key first"
        )


class SchemaTooNew(StoreError):
    """The database was migrated by a newer llmgw than this one."""

    def __init__(self, found: int, known: int) -> None:
        self.found = found
        self.known = known
        super().__init__(
            f"database schema version {found} is newer than this llmgw "
            f"(knows up to {known}): upgrade llmgw"
        )


@attrs.frozen
class Session:
    """A dashboard login: the key that logged in and until when."""

    key: KeyRecord
    created_at: float
    expires_at: float


@attrs.frozen
class UsageRow:
    """One group (a key or a model) in one time bucket of a usage summary."""

    # The key id or model name; None for requests made without a key.
    group: str | None
    # The bucket's start (a multiple of the bucket size); None when not bucketed.
    bucket: float | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Requests that ended with a status outside 2xx/3xx.
    errors: int
    mean_latency: float
    # None when no request in the group reported a time to first token.
    mean_ttft: float | None


class StoredCordon(NamedTuple):
    """A node an operator cordoned: with `drain`, its replicas move elsewhere too."""

    node_id: str
    drain: bool
    updated_at: float


class StoredModel(NamedTuple):
    """A model added at runtime: its catalog entry in the config's own shape, and when."""

    config: dict[str, Any]
    updated_at: float


class StoredEndpoint(NamedTuple):
    """An endpoint added at runtime: its [[endpoints]] table in the config's own shape
    (its api_key too: the engine's, as a configuration file holds it), and when."""

    config: dict[str, Any]
    updated_at: float


def model_to_dict(model: ModelConfig) -> dict[str, Any]:
    """A catalog entry as the configuration writes it (durations and sizes as strings)."""
    data: dict[str, Any] = converter.unstructure(model)
    return data


def model_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The inverse of :func:`model_to_dict`, by the one structuring path (the store keeps
    it as JSON); raises ConfigError naming the keys at fault.

    Validating a catalog that includes it is the caller's job (``catalog.check_models``).
    """
    return structure_as(data, ModelConfig, JSON_WORDING)


def redact_url(url: str) -> str:
    """`url` without its password (in the authority or a ``password=`` parameter)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable store URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = "&".join(
        "password=***" if p.lower().startswith("password=") else p
        for p in parts.query.split("&")
        if p
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class Store(Protocol):
    """What llmgw persists; every method is async (trio) and safe to call concurrently.

    Cancelling a caller never leaves a half-done change: a write that was handed
    to the database completes (its result is dropped); a long read is interrupted.
    """

    async def migrate(self) -> int:
        """Apply pending migrations (one transaction); returns the schema version.

        Re-running is a no-op. Raises :class:`SchemaTooNew` when the database was
        migrated by a newer llmgw.
        """

    async def aclose(self) -> None:
        """Finish queued writes, wait for running reads, close every connection."""

    async def schema_version(self) -> int:
        """The database's applied schema version (0 before the first migration)."""

    # -- API keys ------------------------------------------------------------------

    async def create_key(
        self,
        name: str,
        *,
        band: str | None = None,
        models: tuple[str, ...] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        admin: bool = False,
        expires_at: float | None = None,
    ) -> tuple[KeyRecord, str]:
        """A new key and its secret (``llmgw-…``): show the secret once, it is not kept.

        Raises :class:`DuplicateKeyName` when a key that is not revoked (an expired one
        included) has `name`; a revoked key's name may be used again."""

    async def lookup_key(self, secret: str) -> KeyRecord | None:
        """The usable key with this secret; None when unknown, revoked or expired."""

    async def list_keys(self) -> list[KeyRecord]:
        """Every key, revoked and expired ones included, oldest first."""

    async def get_key(self, key_id: str) -> KeyRecord | None:
        """The key with this id, whatever its state."""

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such key or it was already revoked."""

    async def count_keys(self, *, admin: bool | None = None) -> int:
        """How many keys are usable now (only admin ones, or only others, if asked)."""

    # -- usage ---------------------------------------------------------------------

    async def record_usage(self, batch: Sequence[TimedUsage]) -> None:
        """Write finished requests in one transaction (the batcher calls this)."""

    async def usage_summary(
        self,
        group_by: GroupBy,
        *,
        since: float | None = None,
        until: float | None = None,
        bucket: float | None = None,
    ) -> list[UsageRow]:
        """Totals per key or model over ``[since, until)``, per `bucket` seconds if given.

        Rows are ordered by bucket, then group (requests without a key first).
        """

    # -- models added at runtime ----------------------------------------------------

    async def put_model(self, model: ModelConfig) -> None:
        """Add or replace a model by name (not validated here: use catalog.check_models)."""

    async def delete_model(self, name: str) -> bool:
        """Forget a runtime model; False when there was none by that name."""

    async def list_models(self) -> list[StoredModel]:
        """Every runtime model as a config dict with its update time, by name."""

    # -- endpoints added at runtime -------------------------------------------------

    async def put_endpoint(self, endpoint_id: str, config: dict[str, Any]) -> None:
        """Add or replace an endpoint by id (not validated here: llmgw.endpoint_sources)."""

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        """Forget a runtime endpoint; False when there was none by that id."""

    async def list_endpoints(self) -> list[StoredEndpoint]:
        """Every runtime endpoint as a config dict with its update time, by id."""

    # -- dashboard sessions ----------------------------------------------------------

    async def create_session(self, key_id: str, ttl: float) -> str:
        """A new session token for `key_id`, valid `ttl` seconds (kept only as a hash)."""

    async def get_session(self, token: str) -> Session | None:
        """The live session; None when unknown, expired, or its key is no longer usable."""

    async def delete_session(self, token: str) -> bool:
        """Log out; False when there was no such session."""

    # -- node cordons ----------------------------------------------------------------

    async def put_cordon(self, node_id: str, *, drain: bool) -> None:
        """Cordon a node (drain: and move its replicas), or change how; by node id."""

    async def delete_cordon(self, node_id: str) -> bool:
        """Uncordon a node; False when it was not cordoned."""

    async def list_cordons(self) -> list[StoredCordon]:
        """Every cordoned node, by id."""

    # -- shared rate limits (llmgw.router.limits) --

    async def take_rate(
        self, key_id: str, kind: str, limit: int, amount: int
    ) -> tuple[int, float | None]:
        """Grant up to `amount` of `key_id`'s `kind` within `limit` per minute, counting
        every process's and instance's grants; what was granted, and when the oldest
        grant of the window was taken (Unix seconds; None: none)."""

    async def add_rate(self, rows: Sequence[tuple[str, str, float, int]]) -> None:
        """Record what was used: (key id, kind, Unix seconds, amount) rows."""

    async def used_rate(self, key_id: str, kind: str) -> tuple[int, float | None]:
        """What the last minute holds of `key_id`'s `kind`, and its oldest entry's time."""

    async def prune_rate(self) -> int:
        """Forget grants no window counts any more; how many."""

    def wall_clock(self) -> float:
        """The clock grants are timed by (Unix seconds)."""

    # -- several instances on one store (llmgw.control.leadership) --

    async def claim_leadership(
        self, name: str, holder: str, agents: str, admin: str, ttl: float
    ) -> int | None:
        """Take the lease `name` for `ttl` seconds when nobody holds it (or its holder's
        has expired), advertising the agent and admin addresses: the new fencing token,
        else None."""

    async def renew_leadership(self, name: str, holder: str, token: int, ttl: float) -> bool:
        """Extend the lease while `holder` still holds it with `token`."""

    async def resign_leadership(self, name: str, holder: str, token: int) -> bool:
        """Let the lease go at once."""

    async def read_leadership(self, name: str) -> tuple[Any, ...] | None:
        """(holder, agent address, admin address, token, expires at, now), if anyone led:
        the lease's end and the time of the read by the lease's clock (PostgreSQL's own on
        PostgreSQL, so instances with skewed clocks agree; this host's on SQLite)."""

    async def publish_endpoints(
        self,
        name: str,
        token: int,
        changes: Sequence[tuple[str, str | None, bool]],
        *,
        full: bool = False,
    ) -> bool:
        """The leader's endpoint changes, (id, JSON body or None to remove, draining);
        False (nothing written) unless `token` still holds the lease `name`."""

    async def published_endpoints(self) -> list[tuple[str, str, bool]]:
        """Every endpoint the leader publishes: (id, JSON body, draining)."""

    async def put_demand(
        self, instance: str, rows: Sequence[tuple[str, int, int, float, int, float | None]]
    ) -> None:
        """This instance's demand per model (replacing its previous rows)."""

    async def read_demand(self, fresh: float) -> list[tuple[Any, ...]]:
        """Every instance's demand rows written in the last `fresh` seconds: (instance,
        model, in flight, queued, saturation, serving, idle for, age in seconds), their
        time and age by the lease's clock (PostgreSQL's own: no skew between hosts)."""
