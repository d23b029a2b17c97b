"""Which replica holds each stored response of the Responses API.

vLLM (and SGLang) keep a stored response inside the one server process that made
it, so ``previous_response_id`` (and ``GET``/``DELETE /v1/responses/{id}``) only
work on that replica. The router remembers, per response id it relayed, the
endpoint and model that produced it, and sends follow-ups there and nowhere else:
a follow-up on another replica would be refused by that engine at best, answered
without its context at worst.

Scoped to the API key that made it: a stored response holds its conversation, so
its home records the key's id (never the secret), and any other key is told the id
is unknown (404, as OpenAI answers: it does not confirm that the id exists) on
``GET``, ``DELETE``, ``.../cancel``, ``.../input_items`` and ``previous_response_id``.
Without keys (auth off) every client is the one principal, and any may use any id.

Bounded: at most :data:`MAX_HOMES` ids, each for :data:`TTL` seconds from when it
was made or last used; the oldest go first. A router that restarts, or another
llmgw instance, does not know the ids (the client is told so, never routed blind).
"""

from __future__ import annotations

import re
from collections import OrderedDict

import attrs

__all__ = ["MAX_HOMES", "TTL", "Home", "ResponseHomes", "response_id_in"]

#: Response ids remembered at once (about 150 bytes each).
MAX_HOMES = 100_000
#: Seconds a response id is remembered after it was made or last used.
TTL = 24 * 3600.0

# A response's own id comes first in vLLM's and SGLang's answers and in the stream's
# first event (response.created); nothing before it is an id of this shape.
_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,200})"')
#: How far into an answer the id is looked for.
SCAN_BYTES = 16 * 1024


def response_id_in(data: bytes) -> str | None:
    """The first response id in `data` (the start of an answer), if any."""
    found = _ID.search(data, 0, SCAN_BYTES)
    return found.group(1).decode() if found else None


@attrs.frozen
class Home:
    endpoint: str
    model: str
    #: The id of the key that made it; None with auth off (one principal).
    owner: str | None = None


class ResponseHomes:
    """Response id -> the endpoint and model that made it (see the module docstring)."""

    def __init__(self, max_homes: int = MAX_HOMES, ttl: float = TTL) -> None:
        self.max_homes = max_homes
        self.ttl = ttl
        self._homes: OrderedDict[str, tuple[Home, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def record(self, response_id: str, home: Home, now: float) -> None:
        self._homes[response_id] = (home, now + self.ttl)
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.max_homes:
            self._homes.popitem(last=False)

    def lookup(self, response_id: str, now: float, owner: str | None) -> Home | None:
        """The home of `response_id` for the key `owner` (its id; None with auth off),
        kept for another TTL; None if unknown, expired or another key's (which must
        look the same to the caller, and does not renew it)."""
        entry = self._homes.get(response_id)
        if entry is None:
            return None
        home, expires = entry
        if expires <= now:
            del self._homes[response_id]
            return None
        if home.owner != owner:
            return None
        self.record(response_id, home, now)
        return home

    def forget(self, response_id: str) -> None:
        self._homes.pop(response_id, None)
