"""API keys as the store keeps them and the router checks them."""

from __future__ import annotations

import attrs

__all__ = ["KeyRecord"]


@attrs.frozen
class KeyRecord:
    """An API key as stored: everything but the secret, which only its creator saw."""

    id: str
    name: str
    # The secret's first characters (``llmgw-AbCd1234``), to tell keys apart in listings.
    prefix: str
    # The admission band its requests go to; None: the configured default band.
    band: str | None
    # The models (names or aliases) it may use; None: all of them.
    models: tuple[str, ...] | None
    # Requests and tokens per minute; None: unlimited.
    rpm: int | None
    tpm: int | None
    admin: bool
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None

    def usable(self, now: float) -> bool:
        """Neither revoked nor expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)
