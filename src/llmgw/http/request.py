"""Request parsing for llmgw's HTTP/1.1 server: bytes in, requests out; no I/O.

The server's I/O (accept loop, connections, deadlines, responses) is in :mod:`llmgw.http.server`.

Requests are parsed by llhttp, Node.js's parser, through httptools (as uvicorn does);
:class:`RequestReader` adds what llmgw refuses beyond RFC 9112's syntax. A request it
refuses is a :class:`Refusal`, which carries the status to answer; the server answers
it and closes the connection.

* Limits: a head of at most :data:`MAX_HEAD_BYTES` and :data:`MAX_HEADERS` fields
  (``431``), trailers of at most 4 KiB.
* Parsing is strict where leniency lets a front proxy and this server disagree about
  where a request ends (request smuggling): bare CR or LF, NUL, whitespace before a
  header's colon, folded lines, Content-Length together with Transfer-Encoding, two
  Content-Lengths, malformed chunk sizes, extensions or trailers, codings other than
  ``chunked``: all 400 (or 501).
* An upgrade (or CONNECT) ends the parsing: that request is served as a plain one, and
  nothing after it is read as HTTP/1.1.
"""

from __future__ import annotations

from collections import deque

import httptools

__all__ = ["MAX_HEADERS", "MAX_HEAD_BYTES", "Refusal", "Request", "RequestReader"]

#: Largest request head (request line and headers) accepted; larger: 431.
MAX_HEAD_BYTES = 64 * 1024
#: Most header fields in a request head (nginx and Envoy allow about 100); more: 431.
MAX_HEADERS = 100
#: Bytes of a chunk-size line kept across reads to read its size.
_MAX_SIZE_LINE = 256
#: Largest trailer section of a chunked body (its fields are read and dropped).
_MAX_TRAILER_BYTES = 4096


class Refusal(Exception):
    """The request cannot be served; answer `status` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """One request as the parser delivers it (requests queue in arrival order)."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "expect_continue",
        "fed",
        "head_bytes",
        "head_done",
        "headers",
        "keep_alive",
        "method",
        "received",
        "trailer_bytes",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.method = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0  # the head so far: target, names and values with separators
        self.fed = 0  # bytes fed to the parser while this head was incomplete (feed())
        self.head_done = False  # the head is complete and valid: the request is served
        self.version = "1.1"
        self.keep_alive = True
        self.expect_continue = False
        self.chunked = False
        self.body = bytearray()  # arrived, not yet handed to the app
        self.received = 0  # body bytes so far
        self.trailer_bytes = 0
        self.complete = False  # the whole message is parsed


class RequestReader:
    """Bytes in, requests out: llhttp (through httptools) frames and checks them, and
    this adds what llmgw refuses beyond RFC 9112's syntax. No I/O.

    Requests queue in `requests` as their first byte arrives; one is ready when its
    head is (`head_done`), and its body collects in `body` as it comes. When the input
    breaks, `error` says how and nothing after it is parsed; a request whose head was
    not complete then is dropped from the queue, so the ones before it are still
    served and the error answered after them.
    """

    __slots__ = (
        "_begun",
        "_chunk_header",
        "_chunks",
        "_line",
        "_parser",
        "_refusal",
        "error",
        "max_body",
        "requests",
        "stopped",
    )

    def __init__(self, max_body: int | None = None) -> None:
        #: A chunk announced larger than this is refused at once (413), without waiting
        #: for its bytes; None: no limit here (the app's).
        self.max_body = max_body
        self._chunks = False  # a chunked body is being read: its size lines are looked at
        self._chunk_header = False  # llhttp read a chunk's size line
        self._line = b""  # the size line's start, from an earlier read
        self._parser = httptools.HttpRequestParser(self)
        self.requests: deque[Request] = deque()
        self.error: Refusal | None = None
        self.stopped = False  # an upgrade (or CONNECT): the rest is not HTTP/1.1
        self._refusal: Refusal | None = None
        self._begun = 0  # requests begun so far

    def feed(self, data: bytes) -> None:
        if self.error is not None or self.stopped:
            return
        requests = self.requests
        carried = bool(requests) and not requests[-1].complete
        begun = self._begun
        try:
            if self._chunks:
                self._feed_chunks(data)
            else:
                self._parser.feed_data(data)
                if self._chunks and self._begun - begun == 1 and not carried:
                    # A chunked head began and ended in this read (its first request):
                    # the size lines that came with it, llhttp has read already.
                    self._first_chunks(data, data.find(b"\r\n\r\n") + 4)
        except httptools.HttpParserUpgrade:
            # llmgw serves no upgrades: the request is answered as a plain one, and the
            # connection closes after it (its next bytes are another protocol's).
            self.stopped = True
        except httptools.HttpParserError as exc:
            refusal = self._refusal or Refusal(400, f"malformed request: {_reason(exc)}")
            self._fail(refusal)
            return
        tail = requests[-1] if requests else None
        if tail is not None and not tail.head_done:
            # llhttp hands a header over only once the next one starts, buffering it
            # until then, so `_grow` cannot see a line still coming. Count the bytes
            # fed instead: all of this read belongs to the head if the head was under
            # way before it or began it. A head that began after another request's
            # bytes in one read counts from the next read (at most one read more).
            began = self._begun - begun
            if began == 0 or (began == 1 and not carried):
                tail.fed += len(data)
                if tail.fed > MAX_HEAD_BYTES:
                    self._fail(_too_large())

    def _first_chunks(self, data: bytes, start: int) -> None:
        """Check the size lines of a chunked body from `start` (its first byte) to the
        end of `data`, which the parser has read: a size line, that many bytes and a
        CRLF, again. llhttp has checked the framing; a line that is not a size is left
        to it."""
        size = len(data)
        while start < size and self.error is None:
            end = data.find(b"\n", start) + 1
            if end <= 0:  # the line ends in the next read: _feed_chunks reads it
                self._line = data[start:][-_MAX_SIZE_LINE:]
                return
            announced = self._check_chunk(data[start:end])
            if not announced:  # the last chunk, or not a size line
                return
            start = end + announced + 2

    def _feed_chunks(self, data: bytes, start: int = 0) -> None:
        """Feed a chunked body from `start` line by line, so that a size line llhttp has
        just read is the end of what it was fed: httptools does not tell a chunk's size,
        and a chunk announced larger than the limit is refused before its bytes come.
        Only chunked bodies are fed so: the other requests are fed a read at a time."""
        parser = self._parser
        view = memoryview(data)
        size = len(data)
        while start < size and self._chunks and self.error is None:
            end = data.find(b"\n", start) + 1 or size
            piece = view[start:end]
            self._chunk_header = False
            parser.feed_data(piece)
            if self._chunk_header:
                self._check_chunk(self._line + bytes(piece))
                self._line = b""
            elif data[end - 1] != 0x0A:
                # A line still coming (a read ends here): keep its start.
                self._line = (self._line + bytes(piece))[-_MAX_SIZE_LINE:]
            else:
                self._line = b""
            start = end
        if start < size and self.error is None:
            parser.feed_data(view[start:])

    def _check_chunk(self, line: bytes) -> int | None:
        """The size a chunk-size `line` announces (None if it is not one); refused when
        over the limit."""
        digits = line.rstrip(b"\r\n").rpartition(b"\n")[2].partition(b";")[0].strip()
        try:
            announced = int(digits, 16)
        except ValueError:
            return None
        if self.max_body is not None and announced > self.max_body:
            self._fail(
                Refusal(413, f"a chunk of {announced} bytes exceeds the limit of {self.max_body}")
            )
        return announced

    def _fail(self, refusal: Refusal) -> None:
        self.error = refusal
        if self.requests and not self.requests[-1].head_done:
            self.requests.pop()

    def _refuse(self, status: int, message: str) -> None:
        self._refusal = Refusal(status, message)
        raise self._refusal

    def _grow(self, request: Request, n: int) -> None:
        request.head_bytes += n
        if request.head_bytes > MAX_HEAD_BYTES:
            self._refusal = _too_large()
            raise self._refusal

    # -- httptools callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begun += 1
        self.requests.append(Request())

    def on_url(self, url: bytes) -> None:
        request = self.requests[-1]
        if not request.url:
            request.method = self._parser.get_method()
            if request.method == b"PRI":
                self._refuse(505, "only HTTP/1.1 and HTTP/1.0 are served")  # HTTP/2's preface
        # The request line: method SP target SP HTTP/1.x CRLF.
        self._grow(request, len(url) if request.url else len(request.method) + len(url) + 12)
        request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.requests[-1]
        size = len(name) + len(value) + 4
        if request.head_done:  # a trailer field: read and dropped
            request.trailer_bytes += size
            if request.trailer_bytes > _MAX_TRAILER_BYTES:
                self._refuse(400, f"the trailer section exceeds {_MAX_TRAILER_BYTES} bytes")
            return
        self._grow(request, size)
        if len(request.headers) >= MAX_HEADERS:
            self._refuse(431, f"the request head has more than {MAX_HEADERS} header fields")
        # llhttp drops the whitespace before a value, not after it (RFC 9112 5: OWS).
        request.headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        request = self.requests[-1]
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._refuse(505, "only HTTP/1.1 and HTTP/1.0 are served")
        self._grow(request, 2)  # the blank line
        request.version = version
        request.keep_alive = version == "1.1" and parser.should_keep_alive()
        hosts = 0
        for name, value in request.headers:
            if name == b"host":
                hosts += 1
            elif name == b"transfer-encoding":
                # llhttp accepts any codings that end in chunked; llmgw decodes none.
                if value.lower() != b"chunked" or request.chunked:
                    self._refuse(501, "only the chunked transfer coding is supported")
                if version == "1.0":
                    self._refuse(400, "chunked bodies need HTTP/1.1")
                request.chunked = True
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    self._refuse(417, "only Expect: 100-continue is supported")
                request.expect_continue = version == "1.1"
        if version == "1.1" and hosts != 1:
            self._refuse(400, "an HTTP/1.1 request needs exactly one Host header")
        request.head_done = True
        self._chunks = request.chunked and self.max_body is not None

    def on_body(self, body: bytes) -> None:
        request = self.requests[-1]
        request.body += body
        request.received += len(body)

    def on_chunk_header(self) -> None:
        self._chunk_header = True

    def on_message_complete(self) -> None:
        self.requests[-1].complete = True
        self._chunks = False


def _reason(exc: Exception) -> str:
    return str(exc.args[0]) if exc.args else type(exc).__name__


def _too_large() -> Refusal:
    return Refusal(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes")
