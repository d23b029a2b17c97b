"""What the admin API's handlers, its guards and the dashboard are called with: the
admin app (:class:`llmgw.admin.api.AdminApp`) as they see it.

The app builds its route table from the handler modules and serves the dashboard
beside it, so they cannot import the app back; they name this Protocol instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from quart import Blueprint

    from llmgw.admin.contract import Route
    from llmgw.catalog.live import ModelRegistry
    from llmgw.catalog.rules import Catalog
    from llmgw.control.controller import Controller
    from llmgw.endpoint_sources import EndpointSources
    from llmgw.router.core import Router
    from llmgw.store.base import Store

__all__ = ["AdminContext", "Traffic"]


class Traffic(Protocol):
    """What the admin API reads of the traffic served: a Router, or the workers of
    one control process merged (llmgw.workers.pool.WorkerPool)."""

    def admission_view(self) -> dict[str, Any]: ...

    def cold_waiting(self, model: str) -> int: ...

    async def metrics_text(self) -> bytes: ...


class AdminContext(Protocol):
    """The admin app: what it serves from, how it is guarded, its routes. `controller`
        is None in router-only mode; `store` and `models` without a store; `endpoint_sources`
    when the caller wires none (then endpoints cannot be changed)."""

    router: Router
    traffic: Traffic
    controller: Controller | None
    store: Store | None
    models: ModelRegistry | None
    endpoint_sources: EndpointSources | None
    admin_auth: bool
    ready: Callable[[], bool]
    max_body_bytes: int
    body_timeout: float | None
    hosts: frozenset[str] | None
    max_profile_seconds: int
    routes: list[Route]

    def catalog(self) -> Catalog:
        """The live catalog."""
        ...

    async def call(
        self, method: str, path: str, *, query: str = "", body: Any = None
    ) -> tuple[int, Any]:
        """One API request made in-process, past the guards (AdminApp.call)."""
        ...

    def owns(self, path: str) -> bool:
        """Whether `path` is the API's (the rest is the dashboard's)."""
        ...

    def protected(self, path: str) -> bool:
        """Whether `path` needs an admin key when admin auth is on."""
        ...

    async def authorize(self) -> None:
        """Refuse the current request without an admin key (ApiError)."""
        ...

    def blueprint(self) -> Blueprint:
        """The API's URL rules."""
        ...
