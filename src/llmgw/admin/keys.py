"""``/api/v1/keys``: list, create and revoke API keys.

A key's secret is shown once, in the answer to its creation; the store keeps only
its hash, so no listing can show it again. Keys live in the store: without one
every route here answers 409 saying so.

Shapes: a key is ``{id, name, prefix, band, models, rpm, tpm, admin, status,
created_at, expires_at, revoked_at}`` (times in Unix seconds, `status` one of
active, expired, revoked); ``GET`` answers ``{"keys": [key, ...]}`` oldest first,
``POST`` 201 with the key and its ``secret`` (409 ``duplicate_name`` when a key
that is not revoked has that name: names tell keys apart; a revoked key's name is
free again), ``DELETE keys/{id}`` 200 with the revoked key.
"""

from __future__ import annotations

import time
import unicodedata
from typing import TYPE_CHECKING, Literal

import attrs
from quart import Response

from llmgw.admin.contract import ApiError, json_reply
from llmgw.admin.inputs import json_object
from llmgw.admin.views import unstructure
from llmgw.config import JSON_WORDING, ConfigError, structure_as
from llmgw.domain.keys import KeyRecord
from llmgw.store.base import DuplicateKeyName, Store

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext

__all__ = ["KeyCreate", "KeyList", "KeyView", "NewKeyView"]

NAME_MAX = 200
# Requests or tokens per minute; far above any real limit, and it fits every database.
LIMIT_MAX = 2**31 - 1
EXPIRY_MAX = 100 * 365 * 86400.0  # a hundred years
# No control characters (Unicode category Cc), as the check below says.
NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"

NO_STORE = (
    "API keys live in the store, and no store is configured: set store.url "
    "(e.g. sqlite:///var/lib/llmgw/llmgw.db) to create and list keys"
)

KeyStatus = Literal["active", "expired", "revoked"]


@attrs.frozen
class KeyView:
    """An API key: everything but its secret."""

    id: str
    name: str
    prefix: str = attrs.field(
        metadata={"description": "the secret's first characters, to tell keys apart"}
    )
    band: str | None = attrs.field(
        metadata={"description": "the admission band of its requests; null: the default band"}
    )
    models: tuple[str, ...] | None = attrs.field(
        metadata={"description": "the models (names or aliases) it may use; null: all"}
    )
    rpm: int | None = attrs.field(metadata={"description": "requests per minute; null: no limit"})
    tpm: int | None = attrs.field(metadata={"description": "tokens per minute; null: no limit"})
    admin: bool = attrs.field(metadata={"description": "whether it may use the admin API"})
    status: KeyStatus
    created_at: float = attrs.field(metadata={"description": "Unix seconds"})
    expires_at: float | None = attrs.field(metadata={"description": "Unix seconds; null: never"})
    revoked_at: float | None = attrs.field(metadata={"description": "Unix seconds"})

    @classmethod
    def of(cls, record: KeyRecord, now: float) -> KeyView:
        status: KeyStatus = (
            "revoked"
            if record.revoked_at is not None
            else "active"
            if record.usable(now)
            else "expired"
        )
        return cls(
            id=record.id,
            name=record.name,
            prefix=record.prefix,
            band=record.band,
            models=record.models,
            rpm=record.rpm,
            tpm=record.tpm,
            admin=record.admin,
            status=status,
            created_at=record.created_at,
            expires_at=record.expires_at,
            revoked_at=record.revoked_at,
        )


@attrs.frozen
class NewKeyView(KeyView):
    """A key just created, with its secret: shown this once, never stored."""

    secret: str = attrs.field(
        kw_only=True,
        metadata={"description": "send as `Authorization: Bearer <secret>`; shown only now"},
    )


@attrs.frozen
class KeyList:
    """Every key, revoked and expired ones included, oldest first."""

    keys: tuple[KeyView, ...]


@attrs.frozen
class KeyCreate:
    """A new API key."""

    name: str = attrs.field(
        metadata={
            "schema": {"minLength": 1, "maxLength": NAME_MAX, "pattern": NAME_PATTERN},
            "description": "who or what the key is for (no control characters)",
        }
    )
    band: str | None = attrs.field(
        default=None,
        metadata={"description": "an admission band by name; null: the default band"},
    )
    models: tuple[str, ...] | None = attrs.field(
        default=None,
        metadata={
            "schema": {"uniqueItems": True, "items": {"minLength": 1}},
            "description": "models or aliases it may use (each must exist now); null: all",
        },
    )
    rpm: int | None = attrs.field(
        default=None,
        metadata={
            "schema": {"minimum": 1, "maximum": LIMIT_MAX},
            "description": "requests per minute; null: no limit",
        },
    )
    tpm: int | None = attrs.field(
        default=None,
        metadata={
            "schema": {"minimum": 1, "maximum": LIMIT_MAX},
            "description": "tokens per minute; null: no limit",
        },
    )
    admin: bool = attrs.field(
        default=False, metadata={"description": "whether it may use the admin API"}
    )
    expires_in_seconds: float | None = attrs.field(
        default=None,
        metadata={
            "schema": {"exclusiveMinimum": 0, "maximum": EXPIRY_MAX},
            "description": "lifetime from now; null: it never expires",
        },
    )


def require_store(app: AdminContext) -> Store:
    if app.store is None:
        raise ApiError(409, NO_STORE, "no_store", param="store.url")
    return app.store


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", "invalid_value", param=param)


def _control_characters(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text)


def check_key(request: KeyCreate, bands: list[str], models: set[str]) -> None:
    """The rules a new key must meet beyond its types; 400 naming the key at fault."""
    if not request.name:
        raise _bad("must not be empty", "name")
    if len(request.name) > NAME_MAX:
        raise _bad(f"at most {NAME_MAX} characters, got {len(request.name)}", "name")
    if _control_characters(request.name):
        raise _bad("must not contain control characters", "name")
    if request.band is not None and request.band not in bands:
        raise _bad(f"no band named {request.band!r} (have {', '.join(bands)})", "band")
    if request.models is not None:
        seen: set[str] = set()
        for i, name in enumerate(request.models):
            if name in seen:
                raise _bad(f"{name!r} is listed twice", f"models[{i}]")
            seen.add(name)
            if name not in models:
                raise _bad(f"no model or alias named {name!r}", f"models[{i}]")
    for limit in ("rpm", "tpm"):
        value = getattr(request, limit)
        if value is not None and not 1 <= value <= LIMIT_MAX:
            raise _bad(f"must be in [1, {LIMIT_MAX}], got {value}", limit)
    expiry = request.expires_in_seconds
    if expiry is not None and not 0 < expiry <= EXPIRY_MAX:
        raise _bad(f"must be in (0, {EXPIRY_MAX:.0f}], got {expiry:g}", "expires_in_seconds")


async def list_keys(app: AdminContext) -> Response:
    store = require_store(app)
    now = time.time()
    records = await store.list_keys()
    return json_reply(200, unstructure(KeyList(tuple(KeyView.of(r, now) for r in records))))


async def create_key(app: AdminContext) -> Response:
    store = require_store(app)
    body = await json_object()
    try:
        request = structure_as(body, KeyCreate, JSON_WORDING)
    except ConfigError as exc:
        param = exc.problems[0].split(":", 1)[0]
        raise ApiError(400, "; ".join(exc.problems), "invalid_value", param=param) from None
    bands = [b.name for b in app.router.config.router.admission.bands]
    check_key(request, bands, set(app.catalog().names()))
    now = time.time()
    expires = None if request.expires_in_seconds is None else now + request.expires_in_seconds
    try:
        record, secret = await store.create_key(
            request.name,
            band=request.band,
            models=request.models,
            rpm=request.rpm,
            tpm=request.tpm,
            admin=request.admin,
            expires_at=expires,
        )
    except DuplicateKeyName as exc:
        raise ApiError(409, f"name: {exc}", "duplicate_name", param="name") from None
    view = KeyView.of(record, now)
    created = NewKeyView(**attrs.asdict(view, recurse=False), secret=secret)
    location = f"/api/v1/keys/{record.id}"
    return json_reply(201, unstructure(created), headers={"location": location})


async def revoke_key(app: AdminContext, id: str) -> Response:
    """Revoke a key (it stays listed); revoking a revoked key changes nothing."""
    store = require_store(app)
    key_id = id
    record = await store.get_key(key_id)
    if record is None:
        raise ApiError(404, f"no key {key_id!r}", "key_not_found", param="id")
    now = time.time()
    if (
        app.admin_auth
        and record.admin
        and record.usable(now)
        and await store.count_keys(admin=True) <= 1
    ):
        raise ApiError(
            409,
            f"{key_id} is the last usable admin key, and this admin API needs one: "
            "create another admin key first",
            "last_admin_key",
            param="id",
        )
    await store.revoke_key(key_id)
    revoked = await store.get_key(key_id)
    assert revoked is not None  # keys are never deleted
    return json_reply(200, unstructure(KeyView.of(revoked, time.time())))
