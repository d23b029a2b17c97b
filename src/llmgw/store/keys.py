"""API key and session secrets: generation and the hash the store keeps instead.

A secret is ``llmgw-`` followed by 32 random bytes from :mod:`secrets` in URL-safe
base64 (43 characters): 256 bits of entropy. The store keeps only
``SHA-256(secret)`` (hex) and a short display prefix.

Why a plain, fast hash and not bcrypt/scrypt/argon2: slow, salted hashes exist to
make guessing *low-entropy* secrets (passwords) expensive. Nobody can enumerate
2^256 candidates at any hash speed, so a slow hash adds no protection here, while
it would cost tens of milliseconds of CPU on *every* request (keys are checked on
the hot path) and, being salted, would rule out finding a key by an indexed
lookup on its hash. SHA-256 is deterministic, so the hash itself is the unique,
indexed lookup key; a leaked database still reveals no usable secret.

Session tokens for the dashboard are generated and stored the same way.
"""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "llmgw-"
# Random characters kept for display after the ``llmgw-`` prefix (48 of the 256 bits).
DISPLAY_CHARS = 8


def generate_secret() -> str:
    """A new API key secret: ``llmgw-`` + 256 random bits, URL-safe."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The hex SHA-256 of a secret: what the store keeps and looks keys up by."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    """The part of a secret that listings show (``llmgw-AbCd1234``)."""
    return secret[: len(SECRET_PREFIX) + DISPLAY_CHARS]


def new_key_id() -> str:
    """A key's public identifier (not secret: it appears in usage records and logs)."""
    return "key_" + secrets.token_hex(8)


def new_session_token() -> str:
    """A dashboard session token (256 random bits); stored as :func:`hash_secret` too."""
    return secrets.token_urlsafe(32)
