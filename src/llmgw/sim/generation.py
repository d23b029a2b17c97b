"""Generation: chat and completions (streamed as SSE or whole), Anthropic's
``/v1/messages`` over the same chat, and vLLM's Responses API with its store.

Every sequence produces exactly the tokens its ``max_tokens`` (or
``max_completion_tokens``, else ``--default-max-tokens``) asks for; a handler aborts its
sequence the moment the client goes away (see :meth:`FaultInjector.run`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import trio

from llmgw.http import asgi
from llmgw.router import anthropic
from llmgw.router.messages import AnthropicSend
from llmgw.sim import parsing, responses
from llmgw.sim.driver import Output
from llmgw.sim.model import Finished, Request, Token
from llmgw.sim.parsing import GenerationRequest
from llmgw.sim.state import SimState
from llmgw.sim.wire import (
    HTTPError,
    Receive,
    Scope,
    Send,
    dumps,
    parse_json,
    read_body,
    send_json,
    start_stream,
)


class Generation:
    """Chat, completions, Anthropic's messages and the Responses API over the engine."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.config = state.config
        self.engine = state.engine
        self.driver = state.driver
        self.faults = state.faults
        #: Stored responses live in this process, so a ``previous_response_id`` made
        #: elsewhere is a 404 here, as with vLLM.
        self.store = responses.ResponseStore()

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=True)

    async def responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's Responses API, text only; stored responses live in this process,
        so a ``previous_response_id`` made elsewhere is a 404 here, as with vLLM."""
        body = parse_json(await read_body(scope, receive))
        model = parsing.check_model(self.config, body)
        previous = body.get("previous_response_id")
        history: list[dict[str, Any]] = []
        if previous is not None:
            stored = self.store.get(previous) if isinstance(previous, str) else None
            if stored is None:
                raise HTTPError(
                    404,
                    f"Response with id '{previous}' not found.",
                    param="previous_response_id",
                    code="response_not_found",
                )
            history = stored[1]
        try:
            conversation = [*history, *responses.input_messages(body)]
        except ValueError as e:
            raise HTTPError(400, str(e), param="input") from None
        limit = body.get("max_output_tokens")
        chat_body = {"model": model, "messages": conversation, "stream": body.get("stream")}
        if limit is not None:
            chat_body["max_tokens"] = limit
        req = parsing.generation_request(self.config, self.engine, chat_body, chat=True)
        rid = self.state.next_id("resp", sep="_")  # vLLM's shape: resp_<hex>
        writer = responses.EventWriter(rid, model, previous)

        async def work() -> None:
            outputs, _ = self._submit(req, rid)
            try:
                if req.stream:
                    await start_stream(send)
                    await send(
                        {"type": "http.response.body", "body": writer.start(), "more_body": True}
                    )
                text: list[str] = []
                done: Finished | None = None
                async for out in outputs:
                    if isinstance(out, Token):
                        text.append(out.text)
                        if req.stream:
                            piece = writer.delta(out.text)
                            await send(
                                {"type": "http.response.body", "body": piece, "more_body": True}
                            )
                    else:
                        done = out
                if done is None:
                    raise HTTPError(500, "the request was aborted")
                usage = responses.usage_of(
                    done.prompt_tokens, done.completion_tokens, done.cached_tokens
                )
                answer = responses.response_object(
                    rid, model, "".join(text), usage, previous=previous
                )
                if body.get("store", True) is not False:
                    reply = {"role": "assistant", "content": "".join(text)}
                    self.store.put(answer, [*conversation, reply])
                if req.stream:
                    await send({"type": "http.response.body", "body": writer.end(answer)})
                else:
                    await send_json(send, 200, answer)
            finally:
                self.driver.abort(rid)

        await self.faults.run(receive, send, work, req.stream)

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server's ``/v1/messages``: Anthropic's API over the simulator's own chat
        generation (translated as llmgw does, so the engine answers in that shape)."""
        try:
            request = parse_json(await read_body(scope, receive))
            chat = anthropic.to_chat(request)
        except anthropic.MessagesError as e:
            await send_json(send, e.status, e.body())
            return
        reply = AnthropicSend(
            cast(asgi.Send, send),
            request["model"],
            stream=bool(chat.get("stream")),
            stop_sequences=request.get("stop_sequences"),
        )
        await self._generate_from(chat, receive, cast(Send, reply), chat=True)

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            request = parse_json(await read_body(scope, receive))
            chat = anthropic.to_chat({**request, "max_tokens": 1})
        except anthropic.MessagesError as e:
            await send_json(send, e.status, e.body())
            return
        ids = parsing.prompt_ids(self.config, chat, chat=True)
        await send_json(send, 200, {"input_tokens": len(ids)})

    async def stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET`` or ``DELETE /v1/responses/{id}`` of this process's store."""
        rid = scope["path"].removeprefix("/v1/responses/").rstrip("/")
        stored = self.store.get(rid)
        if stored is None:
            raise HTTPError(404, f"Response with id '{rid}' not found.", code="response_not_found")
        if scope["method"] == "GET":
            await send_json(send, 200, stored[0])
        elif scope["method"] == "DELETE":
            self.store.delete(rid)
            await send_json(send, 200, {"id": rid, "object": "response", "deleted": True})
        else:
            raise HTTPError(405, f"method {scope['method']} not allowed here")

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=False)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        await self._generate_from(parse_json(await read_body(scope, receive)), receive, send, chat)

    async def _generate_from(
        self, body: Mapping[str, Any], receive: Receive, send: Send, chat: bool
    ) -> None:
        req = parsing.generation_request(self.config, self.engine, body, chat)
        rid = self.state.next_id("chatcmpl" if chat else "cmpl")

        async def work() -> None:
            outputs, reason = self._submit(req, rid)
            try:
                if req.stream:
                    await self._stream(send, req, rid, reason, outputs)
                else:
                    await self._complete(send, req, rid, reason, outputs)
            finally:
                self.driver.abort(rid)  # no-op when it finished; frees blocks when it did not

        await self.faults.run(receive, send, work, req.stream)

    def _submit(
        self, req: GenerationRequest, rid: str
    ) -> tuple[trio.MemoryReceiveChannel[Output], str]:
        """Queue `req` on the engine (after the first-token fault's delay): its output
        channel, and the finish reason its end will have."""
        delay = self.faults.current.first_token_delay
        request = Request(
            request_id=rid,
            prompt=req.prompt,
            max_tokens=req.max_tokens,
            seed=req.seed,
            not_before=trio.current_time() + delay if delay > 0 else 0.0,
        )
        reason = "length" if req.explicit_max_tokens else "stop"
        try:
            return self.driver.submit(request, reason), reason
        except ValueError as e:
            raise HTTPError(400, str(e)) from None

    def _usage(self, done: Finished) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }

    async def _complete(
        self,
        send: Send,
        req: GenerationRequest,
        rid: str,
        reason: str,
        outputs: trio.MemoryReceiveChannel[Output],
    ) -> None:
        text: list[str] = []
        done: Finished | None = None
        async for out in outputs:
            if isinstance(out, Token):
                text.append(out.text)
            else:
                done = out
        if done is None:
            raise HTTPError(500, "the request was aborted")
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        await send_json(
            send,
            200,
            {
                "id": rid,
                "object": "chat.completion" if req.chat else "text_completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [choice],
                "usage": self._usage(done),
            },
        )

    async def _stream(
        self,
        send: Send,
        req: GenerationRequest,
        rid: str,
        reason: str,
        outputs: trio.MemoryReceiveChannel[Output],
    ) -> None:
        created = int(time.time())
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(req.model)},"choices":['
        ).encode()
        if req.chat:
            piece_head = b'{"index":0,"delta":{"content":'
            piece_tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            piece_head = b'{"index":0,"text":'
            piece_tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        limit = self.faults.current.abort_after_chunks
        sent = 0

        async def push(chunks: list[bytes], last: bool) -> bool:
            """Send SSE events; False once the abort fault has cut the stream."""
            nonlocal sent
            if limit is not None and sent + len(chunks) >= limit:
                # Stop after exactly `limit` events, without [DONE]; returning mid-body
                # makes the server close the connection.
                cut = b"".join(chunks[: limit - sent])
                await send({"type": "http.response.body", "body": cut, "more_body": True})
                return False
            sent += len(chunks)
            if last:
                chunks.append(b"data: [DONE]\n\n")
            body = b"".join(chunks)
            await send({"type": "http.response.body", "body": body, "more_body": not last})
            return True

        await start_stream(send)
        # Like vLLM, the role chunk goes out with the first token, not before it: a
        # router that times the first event must see the real time to first token.
        role_event: list[bytes] = []
        if req.chat:
            role = b'{"index":0,"delta":{"role":"assistant","content":""},'
            role_event = [head + role + b'"logprobs":null,"finish_reason":null}]}\n\n']

        done: Finished | None = None
        while done is None:
            try:
                out = await outputs.receive()
            except trio.EndOfChannel:
                return  # aborted elsewhere: end the stream without [DONE]
            batch = [out]
            while True:  # everything already waiting goes out in one write
                try:
                    batch.append(outputs.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            events: list[bytes] = role_event
            role_event = []
            for item in batch:
                if isinstance(item, Token):
                    text = json.dumps(item.text).encode()
                    events.append(head + piece_head + text + piece_tail)
                else:
                    done = item
            if done is None and not await push(events, False):
                return

        if req.chat:
            final = b'{"index":0,"delta":{},"logprobs":null,"finish_reason":'
        else:
            final = b'{"index":0,"text":"","logprobs":null,"finish_reason":'
        events.append(head + final + f'"{reason}"}}]}}\n\n'.encode())
        if req.include_usage:
            events.append(head + b'],"usage":' + dumps(self._usage(done)) + b"}\n\n")
        await push(events, True)
