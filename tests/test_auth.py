"""API-key checks of the client port, with a fake key lookup and clock."""

from __future__ import annotations

import time

import pytest

from llmgw.domain.keys import KeyRecord
from llmgw.router.auth import STALE_IF_ERROR, Authenticator, AuthError
from llmgw.store.base import StoreError


def key(**kw: object) -> KeyRecord:
    base: dict[str, object] = dict(
        id="k1",
        name="team",
        prefix="llmgw-abc",
        band=None,
        models=None,
        rpm=None,
        tpm=None,
        admin=False,
        created_at=time.time(),
    )
    base.update(kw)
    return KeyRecord(**base)  # type: ignore[arg-type]


class Keys:
    def __init__(self, records: dict[str, KeyRecord]) -> None:
        self.records = records
        self.lookups = 0

    async def lookup(self, secret: str) -> KeyRecord | None:
        self.lookups += 1
        return self.records.get(secret)

    async def count(self) -> int:
        return len(self.records)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_no_keys_no_auth_until_one_exists() -> None:
    keys, clock = Keys({}), Clock()
    auth = Authenticator(keys.lookup, keys.count, clock=clock)
    assert await auth.authenticate(None) is None
    keys.records["s3cret"] = key()
    assert await auth.authenticate(None) is None  # the count is cached for a second
    clock.now = 1.5
    with pytest.raises(AuthError) as info:
        await auth.authenticate(None)
    assert info.value.status == 401 and info.value.code == "missing_key"


async def test_bearer_keys_are_checked_and_cached_for_cache_ttl() -> None:
    keys, clock = Keys({"s3cret": key()}), Clock()
    auth = Authenticator(keys.lookup, keys.count, required=True, clock=clock)
    assert (await auth.authenticate(b"Bearer s3cret")).id == "k1"  # type: ignore[union-attr]
    assert (await auth.authenticate(b"Bearer s3cret")).id == "k1"  # type: ignore[union-attr]
    assert keys.lookups == 1
    for bad, code in ((b"Basic abc", "invalid_authorization"), (b"Bearer nope", "invalid_api_key")):
        with pytest.raises(AuthError) as info:
            await auth.authenticate(bad)
        assert (info.value.status, info.value.code) == (401, code)
    # Revoked: effective once the cached lookup is older than cache_ttl.
    del keys.records["s3cret"]
    clock.now = 1.1
    with pytest.raises(AuthError):
        await auth.authenticate(b"Bearer s3cret")


async def test_expired_key_is_refused_even_from_the_cache() -> None:
    keys = Keys({"old": key(expires_at=time.time() - 1)})
    auth = Authenticator(keys.lookup, keys.count, required=True, clock=Clock())
    with pytest.raises(AuthError):
        await auth.authenticate(b"Bearer old")


def test_models_a_key_may_use() -> None:
    limited = key(models=("llama3",))
    Authenticator.check_model(limited, "llama3", "llama-3.1-8b")
    Authenticator.check_model(limited, "x", "llama3")
    with pytest.raises(AuthError) as info:
        Authenticator.check_model(limited, "qwen", "qwen")
    assert info.value.status == 403 and "allowed: llama3" in str(info.value)


async def test_requests_per_minute() -> None:
    clock = Clock()
    auth = Authenticator(None, None, clock=clock)
    k = key(rpm=2)
    await auth.admit(k, 10)
    clock.now = 10.0
    await auth.admit(k, 10)
    with pytest.raises(AuthError) as info:
        await auth.admit(k, 10)
    assert info.value.status == 429 and "2 requests per minute" in str(info.value)
    assert info.value.retry_after == 50.0  # the first request leaves the window at 60 s
    clock.now = 60.5
    await auth.admit(k, 10)


async def test_tokens_per_minute_count_what_requests_used() -> None:
    clock = Clock()
    auth = Authenticator(None, None, clock=clock)
    k = key(tpm=1000)
    await auth.admit(k, 900)  # the first request always goes: nothing used yet
    auth.used("k1", 900)
    with pytest.raises(AuthError) as info:
        await auth.admit(k, 200)
    assert info.value.code == "tpm_exceeded" and "1000 tokens per minute" in str(info.value)
    await auth.admit(k, 50)
    clock.now = 61.0
    await auth.admit(k, 900)


async def test_a_valid_key_counts_even_before_keys_are_enforced() -> None:
    keys, clock = Keys({}), Clock()
    auth = Authenticator(keys.lookup, keys.count, clock=clock)
    assert await auth.authenticate(b"Bearer anything") is None  # open port: no key needed
    keys.records["fresh"] = key()  # created within the count cache's second
    found = await auth.authenticate(b"Bearer fresh")
    assert found is not None and found.id == "k1"
    assert await auth.authenticate(b"Bearer wrong") is None  # still open, not refused


class FailingKeys(Keys):
    """Keys whose store can be made to fail."""

    failing = False

    async def lookup(self, secret: str) -> KeyRecord | None:
        if self.failing:
            raise StoreError("the store is restarting")
        return await super().lookup(secret)

    async def count(self) -> int:
        if self.failing:
            raise StoreError("the store is restarting")
        return await super().count()


async def test_a_key_seen_before_is_served_while_the_store_is_away() -> None:
    keys, clock = FailingKeys({"s3cret": key()}), Clock()
    auth = Authenticator(keys.lookup, keys.count, clock=clock)
    assert await auth.authenticate(b"Bearer s3cret") is not None
    keys.failing = True
    clock.now = 10.0  # past cache_ttl: the store is asked, and fails
    found = await auth.authenticate(b"Bearer s3cret")
    assert found is not None and found.id == "k1"  # as it was
    with pytest.raises(AuthError) as info:  # never seen: nothing to go by
        await auth.authenticate(b"Bearer other")
    assert info.value.status == 503 and info.value.code == "store_unavailable"
    clock.now = 10.0 + STALE_IF_ERROR + 1  # too long ago to go by
    with pytest.raises(AuthError) as info:
        await auth.authenticate(b"Bearer s3cret")
    assert info.value.status == 503
    keys.failing = False  # back: asked again
    assert await auth.authenticate(b"Bearer s3cret") is not None
