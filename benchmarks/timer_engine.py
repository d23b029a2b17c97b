"""A stand-in engine whose streams each run on their own timer (router_overhead.py).

    python benchmarks/timer_engine.py --port 0 --model M --ready-file F [--itl-ms 5]

llmgw-sim batches like vLLM: one engine step emits one event for every running
stream at once, so a router reading from it gets a burst per step. Here every stream
is independent: its first token comes `--ttft-ms` after its request arrived and each
following token `--itl-ms` after the previous one (on an absolute schedule from the
stream's own start, so streams that started at different moments stay out of phase).
A non-streaming answer is sent when its last token would have been.

Written on the standard library alone (an asyncio Protocol and a small HTTP/1.1
parser), so that it shares nothing with llmgw's HTTP stack. It serves

* POST /v1/chat/completions and /v1/completions, streamed (SSE, chunked, with
  `stream_options.include_usage`) or not; `max_tokens` (or `max_completion_tokens`)
  tokens are generated, 16 when absent;
* GET /health (200, empty, like vLLM), /v1/models, and /metrics with vLLM's gauge
  names (`vllm:num_requests_running` counts the requests in flight, nothing ever
  waits), which is what llmgw's scraper reads;

on keep-alive connections, requests on one connection answered in order. The ready
file gets ``{"listen": ["HOST:PORT"]}`` once the socket listens. SIGTERM or SIGINT
stops it. Only meant for loopback benchmarks: no TLS, no limits beyond a 1 MiB body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import sys
import time
from typing import Any

MAX_HEAD = 64 * 1024
MAX_BODY = 1 << 20
WORDS = tuple(f" {a}{b}{c}" for a in "bdfklmnprstvz" for b in "aeiou" for c in "kmnrst")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class Engine:
    def __init__(self, model: str, ttft: float, itl: float, max_num_seqs: int) -> None:
        self.model = model
        self.ttft = ttft
        self.itl = itl
        self.max_num_seqs = max_num_seqs
        self.running = 0
        self.finished = 0
        self.ids = itertools.count(1)
        self.prefix = f"{os.getpid():x}"

    def metrics(self) -> bytes:
        m = f'{{model_name="{self.model}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{m} {self.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{m} 0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{m} {min(1.0, self.running / self.max_num_seqs)}",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{m} 0",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{m} 0",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{m} {self.finished}",
        ]
        return ("\n".join(lines) + "\n").encode()


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Generation:
    """One request's tokens, each written on this stream's own timer."""

    def __init__(self, conn: Connection, body: dict[str, Any], chat: bool) -> None:
        engine = conn.engine
        self.conn = conn
        self.engine = engine
        self.chat = chat
        self.stream = bool(body.get("stream"))
        opts = body.get("stream_options")
        self.usage_chunk = isinstance(opts, dict) and bool(opts.get("include_usage"))
        n = body.get("max_tokens", body.get("max_completion_tokens"))
        self.tokens = n if isinstance(n, int) and n > 0 else 16
        if chat:
            msgs = body.get("messages") or []
            text = "".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            text = str(body.get("prompt", ""))
        self.prompt_tokens = max(1, len(text) // 4)
        self.words = [WORDS[(hash(text) + i) % len(WORDS)] for i in range(self.tokens)]
        kind = "chatcmpl" if chat else "cmpl"
        self.id = f"{kind}-{engine.prefix}{next(engine.ids):08x}"
        self.created = int(time.time())
        self.index = 0
        self.start = asyncio.get_running_loop().time()
        self.handle: asyncio.TimerHandle | None = None
        engine.running += 1
        self.done = False
        if self.stream:
            obj = "chat.completion.chunk" if chat else "text_completion"
            head_ = {"id": self.id, "object": obj, "created": self.created, "model": engine.model}
            pre = json.dumps(head_, separators=(",", ":"))[:-1]
            if chat:
                self.pre = (pre + ',"choices":[{"index":0,"delta":{"content":').encode()
                self.post = b'},"logprobs":null,"finish_reason":null}]}'
            else:
                self.pre = (pre + ',"choices":[{"index":0,"text":').encode()
                self.post = b',"logprobs":null,"finish_reason":null}]}'
            self.head_obj = head_
            out = head(
                200,
                [
                    ("content-type", "text/event-stream"),
                    ("cache-control", "no-cache"),
                    ("transfer-encoding", "chunked"),
                ],
            )
            if chat:
                role = {
                    **head_,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                out += chunk(event(role))
            conn.write(out)
        self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        if self.stream:
            at = self.start + self.engine.ttft + self.index * self.engine.itl
            self.handle = loop.call_at(at, self._token)
        else:
            at = self.start + self.engine.ttft + (self.tokens - 1) * self.engine.itl
            self.handle = loop.call_at(at, self._complete)

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
        }

    def _token(self) -> None:
        word = json.dumps(self.words[self.index]).encode()
        self.conn.write(chunk(b"data: " + self.pre + word + self.post + b"\n\n"))
        self.index += 1
        if self.index < self.tokens:
            self._schedule()
            return
        if self.chat:
            fin: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None}
        else:
            fin = {"index": 0, "text": "", "logprobs": None}
        fin["finish_reason"] = "length"
        tail = chunk(event({**self.head_obj, "choices": [fin]}))
        if self.usage_chunk:
            tail += chunk(event({**self.head_obj, "choices": [], "usage": self.usage()}))
        tail += chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.conn.write(tail)
        self._finish()

    def _complete(self) -> None:
        text = "".join(self.words)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        body = json.dumps(
            {
                "id": self.id,
                "object": obj,
                "created": self.created,
                "model": self.engine.model,
                "choices": [choice],
                "usage": self.usage(),
            },
            separators=(",", ":"),
        ).encode()
        self.conn.write(
            head(200, [("content-type", "application/json"), ("content-length", str(len(body)))])
            + body
        )
        self._finish()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.engine.running -= 1
        self.engine.finished += 1
        self.conn.response_done()

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        if not self.done:
            self.done = True
            self.engine.running -= 1


class Connection(asyncio.Protocol):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy: Generation | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy is not None:
            self.busy.cancel()
            self.busy = None
        self.transport = None

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.process()

    def response_done(self) -> None:
        self.busy = None
        if self.close_after:
            if self.transport is not None:
                self.transport.close()
            return
        if self.buf:
            self.process()

    def fail(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        data = body.encode()
        self.write(
            head(
                status,
                [
                    ("content-type", "application/json"),
                    ("content-length", str(len(data))),
                    ("connection", "close"),
                ],
            )
            + data
        )
        if self.transport is not None:
            self.transport.close()
        self.buf.clear()

    def process(self) -> None:
        while self.busy is None and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self.fail(400, "request head too large")
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ")
            except ValueError:
                self.fail(400, "bad request line")
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    self.fail(400, "bad header line")
                    return
                headers[name.strip().lower()] = value.strip()
            pos = end + 4
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = self._chunked(pos)
                if body is None:
                    return
                data, pos = body
            else:
                try:
                    length = int(headers.get("content-length", "0"))
                except ValueError:
                    self.fail(400, "bad content-length")
                    return
                if length < 0 or length > MAX_BODY:
                    self.fail(400, "bad content-length")
                    return
                if len(self.buf) < pos + length:
                    return
                data = bytes(self.buf[pos : pos + length])
                pos += length
            del self.buf[:pos]
            conn = headers.get("connection", "").lower()
            self.close_after = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive")
            self.handle(method, target.split("?", 1)[0], data)

    def _chunked(self, pos: int) -> tuple[bytes, int] | None:
        """The whole chunked body from `pos` and the position after it, None if incomplete."""
        out = bytearray()
        while True:
            eol = self.buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            try:
                size = int(bytes(self.buf[pos:eol]).split(b";")[0].strip(), 16)
            except ValueError:
                self.fail(400, "bad chunk size")
                return None
            if size < 0 or len(out) + size > MAX_BODY:
                self.fail(400, "bad chunk size")
                return None
            if size == 0:
                end = self.buf.find(b"\r\n\r\n", eol)
                if end < 0:
                    return None
                return bytes(out), end + 4
            if len(self.buf) < eol + 2 + size + 2:
                return None
            out += self.buf[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2

    def plain(self, status: int, body: bytes, ctype: str) -> None:
        self.write(
            head(status, [("content-type", ctype), ("content-length", str(len(body)))]) + body
        )
        if self.close_after and self.transport is not None:
            self.transport.close()

    def handle(self, method: str, path: str, data: bytes) -> None:
        e = self.engine
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                self.fail(405, f"{method} not allowed on {path}")
                return
            try:
                body = json.loads(data)
            except ValueError:
                self.fail(400, "body is not JSON")
                return
            if not isinstance(body, dict):
                self.fail(400, "body is not a JSON object")
                return
            self.busy = Generation(self, body, chat=path == "/v1/chat/completions")
            return
        if method != "GET":
            self.fail(405, f"{method} not allowed on {path}")
        elif path == "/health":
            self.plain(200, b"", "text/plain")
        elif path == "/metrics":
            self.plain(200, e.metrics(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            models = {
                "object": "list",
                "data": [{"id": e.model, "object": "model", "owned_by": "timer-engine"}],
            }
            self.plain(200, json.dumps(models).encode(), "application/json")
        else:
            self.fail(404, f"no route for {path}")


def write_ready(path: str, address: str) -> None:
    """Written by a rename: the file is complete once it exists."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"listen": [address]}, f)
    os.replace(tmp, path)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    engine = Engine(args.model, args.ttft_ms / 1e3, args.itl_ms / 1e3, args.max_num_seqs)
    server = await loop.create_server(
        lambda: Connection(engine), args.host, args.port, reuse_address=True, backlog=1024
    )
    sock = server.sockets[0]
    host, port = sock.getsockname()[:2]
    if args.ready_file:
        write_ready(args.ready_file, f"{host}:{port}")
    print(
        f"timer_engine: listening on {host}:{port}, serving {args.model} "
        f"(ttft {args.ttft_ms:g} ms, itl {args.itl_ms:g} ms)",
        flush=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="timer-model")
    p.add_argument("--ttft-ms", type=float, default=5.0, help="request to first token")
    p.add_argument("--itl-ms", type=float, default=5.0, help="between a stream's tokens")
    p.add_argument("--max-num-seqs", type=int, default=256, help="for kv_cache_usage_perc")
    p.add_argument("--ready-file", help="write the bound address here once listening")
    args = p.parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
