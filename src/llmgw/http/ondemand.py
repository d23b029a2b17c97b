"""An httpx client made on first use.

In a process that already runs trio, importing httpx costs about 5 MB and making the
first ``httpx.AsyncClient`` about 4 MB more (httpcore, h11, h2 and an SSL context
with the CA bundle) and 0.1 s. The sleeper and the /admin forward each hold one, and
the scraper one for https:// engines; a worker process uses none of them unless an
engine sleeps or an /admin page is asked for. Made on demand, and with httpx
imported where it is first needed, they cost such a process nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = ["OnDemandClient"]


class OnDemandClient:
    """``get()`` makes the client with `make` the first time (or returns `given`).

    Where llmgw's own client (:mod:`llmgw.http.client`, plain ``http://`` only) can
    carry a request, it does: :meth:`takes` says which URLs are httpx's instead. A
    `given` client (a library caller's, a test's MockTransport) takes them all."""

    __slots__ = ("_client", "_given", "_make")

    def __init__(
        self, make: Callable[[], httpx.AsyncClient], given: httpx.AsyncClient | None = None
    ) -> None:
        self._make = make
        self._client = given
        self._given = given is not None

    def takes(self, url: str) -> bool:
        """Whether `url` goes through httpx rather than llmgw's own client."""
        return self._given or not url.startswith("http://")

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
