"""Where a router-only gateway's endpoints come from, and how the sources combine.

Three sources feed one endpoint set (docs/router.md, "Where endpoints come from"):

* ``config``: the configuration file's ``[[endpoints]]``, read at start and again on
  SIGHUP;
* ``runtime``: added through the admin API (``POST /api/v1/endpoints``), kept in the
  store and read back at start (instances on one PostgreSQL read each other's);
* ``discovery``: the file ``[discovery] file`` names, which another program writes
  (llmgw.discovery).

Each endpoint is an ``[[endpoints]]`` table, structured and checked by the
configuration's one path (:func:`parse_endpoint`). An id belongs to one source: the
configuration file wins over the store (a stored endpoint it shadows is skipped,
logged), and a discovered endpoint whose id another source has is refused, logged.
Every change is applied as a diff to the data plane's endpoint sink (the router, or
the worker pool): added and changed endpoints are upserted, gone ones drained, then
removed once nothing is in flight to them (or `router.drain_timeout` passed). The
models endpoints name are kept in the catalog (ModelRegistry.set_endpoint_models).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import trio

from llmgw.catalog.live import ModelRegistry
from llmgw.config import JSON_WORDING, ConfigError, EndpointConfig, Wording, check, structure_as
from llmgw.config import converter as config_converter
from llmgw.domain.endpoints import Endpoint, EndpointSink
from llmgw.router.core import endpoint_from_config
from llmgw.router.endpoints import EndpointRegistry
from llmgw.store.base import Store

__all__ = [
    "EndpointChangeError",
    "EndpointSources",
    "Source",
    "endpoint_to_dict",
    "parse_endpoint",
]

log = logging.getLogger("llmgw.endpoints")

Source = Literal["config", "runtime", "discovery"]

#: How often a drained endpoint is looked at for requests still in flight (seconds).
DRAIN_POLL = 0.1


class EndpointChangeError(Exception):
    """A runtime change was refused: `status` is the HTTP status that fits, `code` a
    machine-readable reason, `param` the field at fault (a 400)."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param


def parse_endpoint(data: Mapping[str, Any], wording: Wording = JSON_WORDING) -> EndpointConfig:
    """An ``[[endpoints]]`` table from parsed JSON or TOML, by the configuration's
    structuring and its rules; ConfigError names every key at fault."""
    endpoint = structure_as(data, EndpointConfig, wording)
    problems = check(endpoint)
    if problems:
        raise ConfigError(problems)
    return endpoint


def endpoint_to_dict(endpoint: EndpointConfig) -> dict[str, Any]:
    """The table as the configuration writes it (what the store keeps)."""
    data: dict[str, Any] = config_converter.unstructure(endpoint)
    return data


def outside_config_problems(endpoint: EndpointConfig, key: str = "") -> list[str]:
    """What only the configuration file may give an endpoint: the KV-cache event
    subscriptions are made once, at start, from its [[endpoints]]."""
    if endpoint.kv_events is None:
        return []
    field = f"{key}.kv_events" if key else "kv_events"
    return [
        f"{field}: KV-cache events are subscribed to at start, from the configuration "
        "file's [[endpoints]] only; put this endpoint there, or leave kv_events out"
    ]


class EndpointSources:
    """The three sources of endpoints, applied to `sink` as one set (module docstring).

    `registry` is the data plane's registry the sink feeds (this process's router's):
    what is in flight to a drained endpoint, and the ids the control plane placed.
    `models` hears of the models endpoints name; `store` keeps runtime endpoints
    (None: runtime changes are refused)."""

    def __init__(
        self,
        configured: Sequence[EndpointConfig],
        sink: EndpointSink,
        registry: EndpointRegistry,
        *,
        models: ModelRegistry | None = None,
        store: Store | None = None,
        drain_timeout: float = 30.0,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.sink = sink
        self.registry = registry
        self.models = models
        self.store = store
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.configured = {e.id: e for e in configured}
        self.runtime: dict[str, EndpointConfig] = {}
        self.discovered: dict[str, EndpointConfig] = {}
        # Stored endpoints not applied: id -> why (still in the store).
        self.skipped: dict[str, str] = {}
        # What the sink has from these sources (the configured ones: the router made
        # with the configuration has them already).
        self.applied: dict[str, Endpoint] = {
            e.id: endpoint_from_config(e) for e in self.configured.values()
        }
        # Drained, removed once idle: id -> the deadline (clock) to remove it anyway.
        self.removing: dict[str, float] = {}
        self._wake = trio.Event()

    # -- reading ------------------------------------------------------------------------

    def source_of(self, endpoint_id: str) -> Source | None:
        """Which source an applied endpoint comes from (None: not one of these, say a
        replica the control plane placed)."""
        if endpoint_id in self.configured:
            return "config"
        if endpoint_id in self.runtime:
            return "runtime"
        if endpoint_id in self.discovered:
            return "discovery"
        return None

    def wanted(self) -> dict[str, tuple[EndpointConfig, Source]]:
        """Every endpoint the sources give, by id, each from its one source."""
        found: dict[str, tuple[EndpointConfig, Source]] = {
            i: (e, "config") for i, e in self.configured.items()
        }
        for ident, endpoint in self.runtime.items():
            found.setdefault(ident, (endpoint, "runtime"))
        for ident, endpoint in self.discovered.items():
            found.setdefault(ident, (endpoint, "discovery"))
        return found

    # -- applying -----------------------------------------------------------------------

    def _apply(self) -> None:
        """The sources' set to the sink, as a diff."""
        wanted = self.wanted()
        if self.models is not None:
            # First: a new endpoint's model resolves as soon as the endpoint is there.
            self.models.set_endpoint_models({m for e, _ in wanted.values() for m in e.models})
        for ident in set(self.applied) - set(wanted):
            del self.applied[ident]
            self.sink.drain(ident)
            self.removing[ident] = self.clock() + self.drain_timeout
            log.info("endpoint %s: gone from its source, draining", ident)
        for ident, (config, source) in wanted.items():
            endpoint = endpoint_from_config(config)
            if self.applied.get(ident) == endpoint:
                continue
            self.removing.pop(ident, None)
            log.info(
                "endpoint %s (%s): %s at %s for %s",
                ident,
                source,
                "changed" if ident in self.applied else "added",
                config.url,
                ", ".join(config.models),
            )
            self.applied[ident] = endpoint
            self.sink.upsert(endpoint)
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Remove drained endpoints once nothing is in flight to them, or at their
        deadline; until cancelled."""
        task_status.started()
        while True:
            if not self.removing:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            now = self.clock()
            for ident, deadline in list(self.removing.items()):
                state = self.registry.get(ident)
                if state is not None and state.inflight and now < deadline:
                    continue
                if state is not None and state.inflight:
                    log.warning(
                        "endpoint %s: %d requests still in flight after router.drain_timeout; "
                        "removed anyway",
                        ident,
                        state.inflight,
                    )
                del self.removing[ident]
                self.sink.remove(ident)
                log.info("endpoint %s: removed", ident)
            await trio.sleep(DRAIN_POLL)

    # -- the configuration file (SIGHUP) ----------------------------------------------------

    def set_configured(self, endpoints: Iterable[EndpointConfig]) -> None:
        """The configuration file's [[endpoints]] as read again."""
        configured = {e.id: e for e in endpoints}
        for ident in configured:
            if ident in self.runtime:
                log.warning(
                    "stored endpoint %r is shadowed: the configuration file now defines it "
                    "(it wins)",
                    ident,
                )
        for ident, endpoint in configured.items():
            old = self.configured.get(ident)
            if endpoint.kv_events and (old is None or old.kv_events != endpoint.kv_events):
                log.warning(
                    "endpoint %s: kv_events %s takes a restart (its subscription is made at "
                    "start); served meanwhile without it",
                    ident,
                    endpoint.kv_events,
                )
        self.configured = configured
        self._apply()

    # -- the discovery file ---------------------------------------------------------------

    def set_discovered(self, endpoints: Iterable[EndpointConfig]) -> list[str]:
        """The discovery file's endpoints, as last read whole and valid; those whose id
        another source has are refused. Returns why each refused one was."""
        refused: list[str] = []
        discovered: dict[str, EndpointConfig] = {}
        for endpoint in endpoints:
            other = "the configuration file" if endpoint.id in self.configured else None
            if other is None and endpoint.id in self.runtime:
                other = "the admin API (stored)"
            if other is None and self._placed(endpoint.id):
                other = "the control plane (a replica)"
            if other is not None:
                refused.append(f"discovered endpoint {endpoint.id!r} refused: {other} has that id")
                continue
            discovered[endpoint.id] = endpoint
        self.discovered = discovered
        self._apply()
        return refused

    def _placed(self, ident: str) -> bool:
        """Whether the registry has `ident` from elsewhere (the control plane)."""
        return self.registry.get(ident) is not None and ident not in self.applied

    # -- the admin API and the store ------------------------------------------------------

    def _require_store(self) -> Store:
        if self.store is None:
            raise EndpointChangeError(
                409,
                "no store is configured (store.url), so an endpoint added now would vanish "
                "on restart; configure a store, or add it to the configuration file's "
                "[[endpoints]] or the discovery file",
                code="no_store",
            )
        return self.store

    async def add(self, endpoint: EndpointConfig) -> EndpointConfig:
        """Add a runtime endpoint: checked, stored, then live. 409 for an id another
        endpoint has, whatever its source."""
        store = self._require_store()
        for problem in outside_config_problems(endpoint):
            raise EndpointChangeError(400, problem, code="invalid_endpoint", param="kv_events")
        ident = endpoint.id
        if ident in self.configured:
            raise EndpointChangeError(
                409,
                f"endpoint {ident!r} is defined in the configuration file; edit it there",
                code="endpoint_exists",
            )
        if ident in self.runtime:
            raise EndpointChangeError(
                409,
                f"endpoint {ident!r} exists (added at runtime); remove it first to change it",
                code="endpoint_exists",
            )
        if ident in self.discovered:
            raise EndpointChangeError(
                409,
                f"endpoint {ident!r} comes from the discovery file; change it there",
                code="endpoint_exists",
            )
        if self._placed(ident):
            raise EndpointChangeError(
                409,
                f"endpoint {ident!r} exists (a replica the control plane placed)",
                code="endpoint_exists",
            )
        await store.put_endpoint(ident, endpoint_to_dict(endpoint))
        self.skipped.pop(ident, None)
        self.runtime = {**self.runtime, ident: endpoint}
        self._apply()
        return endpoint

    async def remove(self, endpoint_id: str) -> None:
        """Remove a runtime endpoint: forgotten by the store, then drained (requests in
        flight finish) and removed."""
        store = self._require_store()
        if endpoint_id in self.configured:
            raise EndpointChangeError(
                409,
                f"endpoint {endpoint_id!r} is defined in the configuration file; remove it "
                "there and send the server SIGHUP",
                code="endpoint_in_config",
            )
        if endpoint_id in self.skipped:  # never applied: only the store has it
            await store.delete_endpoint(endpoint_id)
            del self.skipped[endpoint_id]
            return
        if endpoint_id not in self.runtime:
            if endpoint_id in self.discovered:
                raise EndpointChangeError(
                    409,
                    f"endpoint {endpoint_id!r} comes from the discovery file; remove it there",
                    code="endpoint_discovered",
                )
            raise EndpointChangeError(
                404, f"no runtime endpoint {endpoint_id!r}", code="endpoint_not_found"
            )
        await store.delete_endpoint(endpoint_id)
        self.runtime = {k: v for k, v in self.runtime.items() if k != endpoint_id}
        self._apply()

    async def load(self) -> list[str]:
        """Apply the stored runtime endpoints; a warning per one skipped (no longer
        valid, or the configuration file has its id), never fails."""
        if self.store is None:
            return []
        runtime, skipped, warnings = await self._read()
        for warning in warnings:
            log.warning("%s", warning)
        self.skipped = skipped
        self.runtime = runtime
        self._apply()
        return warnings

    async def refresh(self) -> bool:
        """Read the stored runtime endpoints again (another instance on the same store
        may have changed them) and apply any difference. Whether there was one. Raises
        StoreError."""
        if self.store is None:
            return False
        runtime, skipped, warnings = await self._read()
        for warning in warnings:
            ident = warning.split("'")[1] if "'" in warning else ""
            if ident not in self.skipped:  # said once, not every refresh
                log.warning("%s", warning)
        self.skipped = skipped
        if runtime == self.runtime:
            return False
        self.runtime = runtime
        self._apply()
        return True

    async def _read(self) -> tuple[dict[str, EndpointConfig], dict[str, str], list[str]]:
        assert self.store is not None
        runtime: dict[str, EndpointConfig] = {}
        skipped: dict[str, str] = {}
        warnings: list[str] = []
        for stored in await self.store.list_endpoints():
            ident = str(stored.config.get("id", "?"))
            try:
                endpoint = parse_endpoint(stored.config)
            except ConfigError as exc:
                skipped[ident] = f"cannot be read: {'; '.join(exc.problems)}"
                warnings.append(
                    f"stored endpoint {ident!r} skipped, no longer valid: {skipped[ident]} "
                    "(remove it: llmgw-ctl endpoints remove, and add it again fixed)"
                )
                continue
            if ident in self.configured:
                warnings.append(
                    f"stored endpoint {ident!r} skipped: the configuration file defines it "
                    "(it wins)"
                )
                continue
            runtime[ident] = endpoint
        return runtime, skipped, warnings
