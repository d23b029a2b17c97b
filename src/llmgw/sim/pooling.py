"""Embeddings, rerank, score and audio: deterministic answers derived from the
input (an embedding depends only on its text; a document's relevance is the share of
the query's 4-character pieces it holds), with usage counted in tokens."""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import time
from collections.abc import Mapping
from typing import Any

from llmgw.http import asgi
from llmgw.router.body import BodyError
from llmgw.router.forms import parse_form
from llmgw.sim import parsing, tokens
from llmgw.sim.state import SimState
from llmgw.sim.wire import HTTPError, Receive, Scope, Send, parse_json, read_body, send_json


def _texts(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise HTTPError(400, f"'{name}' must be a string or a list of them", param=name)
    return texts


def _similarity(query: str, document: str) -> float:
    """The share of `query`'s 4-character pieces found in `document` (0 to 1)."""
    wanted = set(tokens.pieces(query.lower()))
    if not wanted:
        return 0.0
    have = set(tokens.pieces(document.lower()))
    return round(len(wanted & have) / len(wanted), 6)


def embedding(text_key: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on the input (blake2b-seeded Gaussian)."""
    seed = int.from_bytes(hashlib.blake2b(text_key, digest_size=8).digest(), "little")
    rng = random.Random(seed)
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class Pooling:
    """The routes that answer without generating: embeddings, rerank and score (vLLM's
    pooling tasks), and audio transcription and translation."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.config = state.config
        self.faults = state.faults

    async def rerank(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's (and Jina's, Cohere's) rerank: each document scored against the query
        by the share of the query's 4-character pieces it contains, best first."""
        body = parse_json(await read_body(scope, receive))
        model = parsing.check_model(self.config, body)
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str):
            raise HTTPError(400, "'query' must be a string", param="query")
        if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            raise HTTPError(400, "'documents' must be a list of strings", param="documents")
        top_n = body.get("top_n", len(documents))
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
            raise HTTPError(400, "'top_n' must be a whole number", param="top_n")
        scored = sorted(
            ((i, _similarity(query, d)) for i, d in enumerate(documents)),
            key=lambda x: (-x[1], x[0]),
        )
        results = [
            {"index": i, "document": {"text": documents[i]}, "relevance_score": score}
            for i, score in scored[: top_n or len(documents)]
        ]
        used = tokens.count(query) * len(documents) + sum(tokens.count(d) for d in documents)
        await send_json(
            send,
            200,
            {
                "id": self.state.next_id("rerank"),
                "model": model,
                "usage": {"total_tokens": used},
                "results": results,
            },
        )

    async def score(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /score: `text_1` against each of `text_2` (strings or lists of them)."""
        body = parse_json(await read_body(scope, receive))
        model = parsing.check_model(self.config, body)
        firsts, seconds = _texts(body, "text_1"), _texts(body, "text_2")
        if len(firsts) != 1 and len(firsts) != len(seconds):
            raise HTTPError(400, "'text_1' must be one text or as many as 'text_2'", param="text_1")
        pairs = [(firsts[0] if len(firsts) == 1 else firsts[i], t) for i, t in enumerate(seconds)]
        used = sum(tokens.count(a) + tokens.count(b) for a, b in pairs)
        await send_json(
            send,
            200,
            {
                "id": self.state.next_id("score"),
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": [
                    {"index": i, "object": "score", "score": _similarity(a, b)}
                    for i, (a, b) in enumerate(pairs)
                ],
                "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0},
            },
        )

    async def audio(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's transcription and translation: text derived from the upload (its name
        and size, so a test can tell it arrived whole), usage in tokens."""
        content_type = asgi.header(scope, b"content-type") or b""
        try:
            form = parse_form(await read_body(scope, receive), content_type)
        except BodyError as e:
            raise HTTPError(400, str(e), param=e.param) from None
        parsing.check_model(self.config, {"model": form.model})
        upload = form.part("file")
        if upload is None or upload[0] is None:
            raise HTTPError(400, "a 'file' upload is required", param="file")
        filename, data = upload
        verb = "translated" if scope["path"].endswith("translations") else "transcribed"
        text = f"{verb} {filename}: {len(data)} bytes"
        heard = max(1, len(data) // 320)  # about 100 tokens a second of 16 kHz 16-bit audio
        words = tokens.count(text)
        usage = {
            "type": "tokens",
            "input_tokens": heard,
            "output_tokens": words,
            "total_tokens": heard + words,
        }
        await send_json(send, 200, {"text": text, "usage": usage})

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = parse_json(await read_body(scope, receive))
        model = parsing.check_model(self.config, body)
        inputs = _embedding_inputs(body.get("input"))
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise HTTPError(400, "'encoding_format' must be 'float' or 'base64'")
        dim = body.get("dimensions") or self.config.embedding_dim
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
            raise HTTPError(400, "'dimensions' must be a positive integer", param="dimensions")

        async def work() -> None:
            data = []
            total = 0
            for i, item in enumerate(inputs):
                if isinstance(item, str):
                    key, n = item.encode("utf-8", "surrogatepass"), tokens.count(item)
                else:
                    key, n = struct.pack(f"<{len(item)}q", *item), len(item)
                total += n
                vector = embedding(key, dim)
                value: Any = vector
                if fmt == "base64":
                    value = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
                data.append({"object": "embedding", "index": i, "embedding": value})
            await send_json(
                send,
                200,
                {
                    "object": "list",
                    "data": data,
                    "model": model,
                    "usage": {"prompt_tokens": total, "total_tokens": total},
                },
            )

        await self.faults.run(receive, send, work, stream=False)


def _embedding_inputs(value: Any) -> list[str | list[int]]:
    def is_ids(x: Any) -> bool:
        return (
            isinstance(x, list)
            and bool(x)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        )

    if isinstance(value, str):
        return [value]
    if is_ids(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, str) or is_ids(x) for x in value):
        return list(value)
    raise HTTPError(
        400, "'input' must be a string, a list of strings, or token id lists", param="input"
    )
