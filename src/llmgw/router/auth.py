"""API keys on the client port: who is asking, what they may use, how fast.

Once any key exists (or `auth.required` is set), every request needs
`Authorization: Bearer <secret>`. The key decides the admission band (the band
header is then ignored), is the tenant for fairness inside a band, may be limited
to some models, and may carry requests-per-minute and tokens-per-minute limits.

Key lookups are cached for `auth.cache_ttl` (1 s by default): the store is one
thread hop and a query away, and a revoked key must stop working within a second,
not at the next restart. While the store cannot be asked (restarting, failing over),
a key looked up within STALE_IF_ERROR is taken as it was then, so clients keep
being served through a store restart; a key never seen gets 503.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from llmgw.domain.keys import KeyRecord
from llmgw.router.limits import LimitExceeded, Limits, LocalLimits
from llmgw.store.base import StoreError

log = logging.getLogger("llmgw.auth")

Lookup = Callable[[str], Awaitable[KeyRecord | None]]
Count = Callable[[], Awaitable[int]]


#: Seconds a client is told to wait (Retry-After) when the store fails.
STORE_RETRY_AFTER = 1.0
#: Seconds a key looked up before is still taken as it was while the store fails.
STALE_IF_ERROR = 300.0


class AuthError(Exception):
    """A request refused for who sent it (`status` 401, 403 or 429), or because the
    store could not tell (503)."""

    def __init__(
        self, status: int, message: str, code: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Authenticator:
    def __init__(
        self,
        lookup: Lookup | None,
        count: Count | None,
        *,
        required: bool = False,
        cache_ttl: float = 1.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits | None = None,
    ) -> None:
        """`limits` counts the keys' rpm and tpm (default: in this process alone)."""
        self._lookup = lookup
        self._count = count
        self.required = required
        self.cache_ttl = cache_ttl
        self.cache_size = cache_size
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, KeyRecord | None]] = OrderedDict()
        self._keys_exist: tuple[float, bool] | None = None
        self.limits: Limits = limits or LocalLimits(clock)

    async def enforced(self) -> bool:
        """Whether requests need a key: required, or any key exists (checked at most
        once per cache_ttl)."""
        if self.required:
            return True
        if self._count is None:
            return False
        now = self.clock()
        if self._keys_exist is None or now - self._keys_exist[0] > self.cache_ttl:
            try:
                self._keys_exist = (now, await self._count() > 0)
            except StoreError:
                if self._keys_exist is None or now - self._keys_exist[0] > STALE_IF_ERROR:
                    raise
                return self._keys_exist[1]  # as it was: the store is away
        return self._keys_exist[1]

    async def authenticate(self, authorization: bytes | None) -> KeyRecord | None:
        """The key behind an `Authorization` header; None when keys are not in use.
        Raises AuthError 401 when a key is needed and missing or invalid, and 503 when
        the store cannot be asked (the client may retry: nothing was decided)."""
        try:
            return await self._authenticate(authorization)
        except StoreError as exc:
            log.warning("authentication: the store failed: %s", exc)
            raise AuthError(
                503,
                "the key store is unavailable; retry shortly",
                "store_unavailable",
                retry_after=STORE_RETRY_AFTER,
            ) from None

    async def _authenticate(self, authorization: bytes | None) -> KeyRecord | None:
        if not await self.enforced():
            # Keys are not required yet (none existed at the last check, which is up to
            # cache_ttl old); a valid key sent anyway still counts (band, limits, usage).
            if authorization is None or self._lookup is None:
                return None
            scheme, _, secret = authorization.decode(errors="replace").partition(" ")
            if scheme.lower() != "bearer" or not secret.strip():
                return None
            return await self._cached(secret.strip())
        if authorization is None:
            raise AuthError(
                401, "an API key is required: Authorization: Bearer <key>", "missing_key"
            )
        scheme, _, secret = authorization.decode(errors="replace").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise AuthError(401, "expected Authorization: Bearer <key>", "invalid_authorization")
        key = await self._cached(secret)
        if key is None:
            raise AuthError(401, "invalid, revoked or expired API key", "invalid_api_key")
        return key

    async def _cached(self, secret: str) -> KeyRecord | None:
        # Cached by digest, so secrets are not kept in memory as they are.
        digest = hashlib.sha256(secret.encode()).hexdigest()
        now = self.clock()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] <= self.cache_ttl:
            key = hit[1]
        else:
            try:
                key = await self._lookup(secret) if self._lookup is not None else None
            except StoreError:
                if hit is None or now - hit[0] > STALE_IF_ERROR:
                    raise
                return hit[1] if hit[1] is not None and hit[1].usable(time.time()) else None
            self._cache[digest] = (now, key)
            self._cache.move_to_end(digest)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if key is not None and not key.usable(time.time()):
            return None
        return key

    @staticmethod
    def check_model(key: KeyRecord, requested: str, canonical: str) -> None:
        """403 unless the key may use the model (by its name or the alias asked for)."""
        if key.models is not None and requested not in key.models and canonical not in key.models:
            raise AuthError(
                403,
                f"this API key may not use model {requested!r} "
                f"(allowed: {', '.join(key.models) or 'none'})",
                "model_not_allowed",
            )

    async def admit(self, key: KeyRecord, expected_tokens: int) -> None:
        """Count a request against the key's limits; 429 naming the limit when over
        (503 when shared limits cannot reach the store)."""
        if key.rpm is None and key.tpm is None:
            return
        try:
            await self.limits.admit(key, expected_tokens)
        except LimitExceeded as exc:
            raise AuthError(exc.status, str(exc), exc.code, retry_after=exc.retry_after) from None

    def used(self, key_id: str, tokens: int) -> None:
        """Tokens a finished request of the key used (for its tokens-per-minute limit)."""
        self.limits.used(key_id, tokens)
