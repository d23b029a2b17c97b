"""The Responses API's stored responses: ``GET`` and ``DELETE /v1/responses/{id}``,
``POST .../{id}/cancel``, ``GET .../{id}/input_items``, sent to the replica that made
the response (it alone has it); 404 when llmgw does not know it, another key made it,
or that replica is gone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from llmgw.http.asgi import send_json
from llmgw.http.client import UpstreamError
from llmgw.router.pipeline.request import REQUEST_ID
from llmgw.router.proxy import BufferFull
from llmgw.router.refusal import HttpError, buffer_full_error

if TYPE_CHECKING:
    from llmgw.domain.keys import KeyRecord
    from llmgw.http.asgi import Scope, Send
    from llmgw.http.engine_client import EngineClient
    from llmgw.router.endpoints import EndpointRegistry
    from llmgw.router.pipeline.authenticate import Authenticate
    from llmgw.router.proxy import BufferBudget
    from llmgw.router.responses import ResponseHomes

__all__ = ["PREFIX", "StoredResponses"]

#: The path prefix of a stored response's routes.
PREFIX = "/v1/responses/"
# What follows a stored response's id -> the methods that reach its replica.
_ACTIONS = {"": ("GET", "DELETE"), "cancel": ("POST",), "input_items": ("GET",)}


class StoredResponses:
    """Relays requests for stored responses to their replicas."""

    def __init__(
        self,
        responses: ResponseHomes,
        endpoints: EndpointRegistry,
        authenticate: Authenticate,
        client: EngineClient,
        budget: BufferBudget,
        *,
        max_bytes: int,
        timeout: float,
    ) -> None:
        """`client` is the engines' client; answers are held whole (like any
        non-streaming answer) within `budget`, up to `max_bytes` each and `timeout`."""
        self.responses = responses
        self.endpoints = endpoints
        self.authenticate = authenticate
        self.client = client
        self.budget = budget
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, key: KeyRecord | None, send: Send) -> None:
        rest = scope["path"].rstrip("/")[len(PREFIX) :]
        response_id, _, action = rest.partition("/")
        allowed = _ACTIONS.get(action)
        if allowed is None or not response_id:
            raise HttpError(404, f"no route {scope['path']}", code="not_found")
        if scope["method"] not in allowed:
            raise HttpError(405, f"method {scope['method']} not allowed here")
        owner = key.id if key is not None else None
        home = self.responses.lookup(response_id, trio.current_time(), owner)
        state = self.endpoints.get(home.endpoint) if home is not None else None
        if home is None or state is None:
            raise HttpError(
                404,
                f"response {response_id!r} is unknown to this gateway, or the replica that "
                "stored it is gone",
                code="response_not_found",
            )
        self.authenticate.may_use(key, home.model, home.model)
        url = state.endpoint.url.rstrip("/") + scope["path"]
        if action == "input_items" and scope.get("query_string"):
            url += "?" + bytes(scope["query_string"]).decode("latin-1")  # its paging
        headers = [(b"x-request-id", scope[REQUEST_ID]), *state.endpoint.headers]
        status, data = await self._fetch(scope["method"], url, headers, state.public)
        try:
            if scope["method"] == "DELETE" and status == 200:
                self.responses.forget(response_id)
            await send_json(
                send,
                status,
                bytes(data),
                [
                    (b"x-request-id", scope[REQUEST_ID]),
                    (b"x-llmgw-endpoint", state.public.encode()),
                ],
            )
        finally:
            self.budget.give(len(data))

    async def _fetch(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], public: str
    ) -> tuple[int, bytearray]:
        """The replica's answer, taken from the budget (the caller gives it back)."""
        data = bytearray()
        try:
            with trio.fail_after(self.timeout):
                async with self.client.request(method, url, headers) as answer:
                    while chunk := await answer.read_some():
                        if len(data) + len(chunk) > self.max_bytes:
                            raise HttpError(
                                502,
                                f"endpoint {public!r} answered more than {self.max_bytes} bytes",
                                type_="server_error",
                                code="upstream_error",
                            )
                        self.budget.take(len(chunk))
                        data += chunk
        except (trio.TooSlowError, UpstreamError) as exc:
            self.budget.give(len(data))
            why = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
            raise HttpError(
                502,
                f"endpoint {public!r} did not answer: {why}",
                type_="server_error",
                code="upstream_error",
            ) from None
        except BufferFull as exc:
            self.budget.give(len(data))
            raise buffer_full_error(exc) from None
        except BaseException:
            self.budget.give(len(data))
            raise
        return answer.status_code, data
