"""The pipeline's first stage: who is asking (an API key, or nobody where none is
required), and whether that key may send this request now (its models, its rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.http.asgi import header
from llmgw.router.auth import Authenticator, AuthError
from llmgw.router.pipeline.request import KEY_ID
from llmgw.router.refusal import auth_error

if TYPE_CHECKING:
    from llmgw.domain.keys import KeyRecord
    from llmgw.http.asgi import Scope
    from llmgw.router.pipeline.request import Request

__all__ = ["Authenticate"]


class Authenticate:
    """Keys checked against the authenticator's store; refusals as HttpError."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def key(self, scope: Scope, bearer: bytes | None = None) -> KeyRecord | None:
        """The key `scope`'s Authorization header (or `bearer`) presents; None where
        keys are not required. Needs only the headers: a body is never read for a
        client that may not send one."""
        try:
            key = await self.auth.authenticate(bearer or header(scope, b"authorization"))
        except AuthError as exc:
            raise auth_error(exc) from None
        if key is not None:
            scope[KEY_ID] = key.id  # for the access line of a refusal after this
        return key

    def may_use(self, key: KeyRecord | None, requested: str, canonical: str) -> None:
        """403 unless `key` may use the model asked as `requested` (`canonical` its name)."""
        if key is None:
            return
        try:
            self.auth.check_model(key, requested, canonical)
        except AuthError as exc:
            raise auth_error(exc) from None

    async def permit(self, request: Request) -> None:
        """The request's key may use its model, and its rate limits have room for it."""
        key = request.key
        if key is None:
            return
        self.may_use(key, request.body.model, request.model.name)
        try:
            await self.auth.admit(key, request.expected_tokens)
        except AuthError as exc:
            raise auth_error(exc) from None
