"""An httpx client made on first use.

In a process that already runs trio, importing httpx costs about 5 MB and making the
first ``httpx.AsyncClient`` about 4 MB more (httpcore, h11, h2 and an SSL context
with the CA bundle) and 0.1 s. The engine client (:mod:`llmgw.http.engine_client`,
for engines other than plain ``http://``) and the /admin forward each hold one; a
worker process uses neither unless an engine speaks https:// or an /admin page is
asked for. Made on demand, and with httpx imported where it is first needed, they
cost such a process nothing.
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
