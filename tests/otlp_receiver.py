"""An OTLP/HTTP trace receiver in the test process: what a collector gets from llmgw.

A stdlib HTTP server on a loopback port of its own takes ``POST /v1/traces`` bodies,
decodes them with opentelemetry-proto's own classes (ExportTraceServiceRequest) and
keeps every span as a plain :class:`Span`.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

PATH = "/v1/traces"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@attrs.frozen
class Span:
    service: str
    name: str
    kind: int  # ProtoSpan.SpanKind
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    error: bool  # its status is ERROR
    start_ns: int
    end_ns: int


class Receiver:
    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self.posts = 0

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource in request.resource_spans:
            service = _attributes(resource.resource.attributes).get("service.name", "")
            for scope in resource.scope_spans:
                span: ProtoSpan
                for span in scope.spans:
                    found.append(
                        Span(
                            service=service,
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                            error=span.status.code == span.status.STATUS_CODE_ERROR,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self._spans.extend(found)
            self.posts += 1


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver listening on 127.0.0.1 until the block ends; its `url` is the traces
    endpoint to configure."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != PATH:
                self.send_error(404)
                return
            receiver.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # pytest shows failures; a line per export is noise

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host, port = http.server_address[:2]
    receiver = Receiver(f"http://{host!s}:{port}{PATH}")
    thread = threading.Thread(target=http.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        http.shutdown()
        http.server_close()
        thread.join()
