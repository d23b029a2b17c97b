"""An httpx client made on first use.

Making an ``httpx.AsyncClient`` loads the CA bundle into an SSL context: about 8 MB
and 0.1 s for a process's first, about 1 MB each after. The scraper, the sleeper and
the /admin forward each hold one, and a worker process uses none of them unless an
engine sleeps or an /admin page is asked for; made on demand, they cost it nothing.
The modules that use one import httpx where they first need it, for the same reason
(its import is another 6.5 MB).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = ["OnDemandClient"]


class OnDemandClient:
    """``get()`` makes the client with `make` the first time (or returns `given`)."""

    __slots__ = ("_client", "_make")

    def __init__(
        self, make: Callable[[], httpx.AsyncClient], given: httpx.AsyncClient | None = None
    ) -> None:
        self._make = make
        self._client = given

    @property
    def made(self) -> bool:
        return self._client is not None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = self._make()
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
