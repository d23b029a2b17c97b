"""Response parsing for llmgw's HTTP/1.1 client: bytes from an engine in; no I/O.

The client's I/O (connections, the keep-alive pool, reads, writes): :mod:`llmgw.http.client`.

:class:`ResponseParser` holds no socket: bytes go in (:meth:`~ResponseParser.feed`,
:meth:`~ResponseParser.eof`), the status, headers and body pieces come out. It drives
llhttp (`httptools.HttpResponseParser`, the parser uvicorn uses) in its strict mode and
adds llmgw's own rules, so that whatever an engine sends, nothing it forbids reaches a
client and no answer can hold the router's thread or memory:

* refused (:class:`BadResponse`): anything RFC 9112 forbids (a status line or
  header that is not well-formed, a bare CR or LF, NUL and other control characters,
  a chunk size that is not plain hex, bad chunk extensions or trailers, two
  Content-Lengths, Content-Length together with Transfer-Encoding, a chunked coding
  applied twice), a status outside 100-599, a version other than HTTP/1.0 and 1.1, a
  transfer coding other than `chunked` (the proxy cannot undo one), a protocol
  switch nobody asked for, bytes after the response's end that came with it (an
  answer to nothing: a miscounted body, or a second response smuggled in);
* bounded: the response head, informational (1xx) heads included, is at most
  `MAX_HEAD` bytes; framing without body data between (chunk-size lines,
  extensions, trailers) at most `MAX_FRAMING` bytes in a row.

An answer cut short (:meth:`~ResponseParser.eof` before its end) is an
:class:`UpstreamError`, the base class of the client's errors too. Their messages never
name the engine's address (they reach clients).
"""

from __future__ import annotations

import re

import httptools

__all__ = ["MAX_FRAMING", "MAX_HEAD", "BadResponse", "ResponseParser", "UpstreamError"]

#: The response head at most, 1xx heads before it included (bytes).
MAX_HEAD = 64 * 1024
#: Framing bytes in a row with no body data between (chunk-size lines with their
#: extensions, trailer fields), at most: a bound on what llhttp may hold of an unending
#: field, counted per piece fed (so exceeded by up to one piece before it is seen).
MAX_FRAMING = 64 * 1024
# What RFC 9112's reason-phrase excludes: controls other than HTAB.
_BAD_REASON = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class UpstreamError(Exception):
    """The upstream connection failed, or the answer was cut short or broke the rules."""


class BadResponse(UpstreamError):
    """The engine's answer broke HTTP/1.1 (RFC 9112) or a limit llmgw sets on it."""


class ResponseParser:
    """One HTTP/1.1 response from bytes, strictly (see the module's docstring); no I/O.

    After each :meth:`feed`: :attr:`head_done` once the final status and headers are
    in (:attr:`status`, :attr:`headers`, :attr:`length` when declared),
    :attr:`body` the body pieces since the last :meth:`take`, :attr:`complete` once
    the body has ended (:attr:`keep_alive`: whether the connection may carry another
    request). Raises :class:`BadResponse`; after that the parser is of no further use.
    """

    __slots__ = (
        "_chunked",
        "_error",
        "_framing",
        "_head_room",
        "_parser",
        "body",
        "complete",
        "head_done",
        "headers",
        "keep_alive",
        "length",
        "status",
        "until_close",
    )

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head_room = MAX_HEAD
        self._framing = 0
        self._chunked = False
        self._error: BadResponse | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None
        self.body: list[bytes] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False

    # -- llhttp's callbacks ---------------------------------------------------------

    def _fail(self, message: str) -> BadResponse:
        self._error = BadResponse(message)
        return self._error

    def on_message_begin(self) -> None:
        if self.complete:
            # More bytes after the answer, an answer to nothing: an engine that
            # miscounts its body, or a second answer smuggled into the first's.
            raise self._fail("bytes after the end of the response")
        # A final head after an informational one starts afresh.
        self.headers = []
        self.length = None
        self._chunked = False

    def on_status(self, reason: bytes) -> None:
        if _BAD_REASON.search(reason):
            raise self._fail("a control character in the status line")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:  # a trailer field: checked by llhttp, not kept
            self._framing = 0
            return
        if value[-1:] in (b" ", b"\t"):  # llhttp keeps trailing whitespace, not the value's
            value = value.rstrip(b" \t")
        size = len(name)  # cheaper than lowering every name
        if size == 14 and name.lower() == b"content-length":
            self.length = int(value)  # llhttp allows digits only, and one such header
        elif size == 17 and name.lower() == b"transfer-encoding":
            if self._chunked:
                raise self._fail("two Transfer-Encoding fields (chunked may be applied once)")
            if value.strip(b" \t").lower() != b"chunked":
                raise self._fail(f"transfer coding {value[:40]!r} (only chunked is accepted)")
            self._chunked = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if not 100 <= status <= 599:
            raise self._fail(f"status {status} is outside 100-599")
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise self._fail(f"HTTP version {version} (1.0 or 1.1 expected)")
        if status < 200:
            if status == 101:
                raise self._fail("a protocol switch nobody asked for")
            return  # informational: the final answer follows
        self.status = status
        self.head_done = True
        self._framing = 0
        self.until_close = not self._chunked and self.length is None and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._framing = 0

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()

    # -- bytes in, results out -------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Parse the next bytes the engine sent."""
        if len(data) > MAX_FRAMING:  # more than one read's worth: in pieces, for the bounds
            for at in range(0, len(data), MAX_FRAMING):
                self.feed(data[at : at + MAX_FRAMING])
            return
        if not self.head_done:
            room = self._head_room
            if len(data) > room:
                self._execute(data[:room])
                if not self.head_done:
                    raise BadResponse(f"the response head exceeds {MAX_HEAD // 1024} KiB")
                data = data[room:]
            else:
                self._head_room = room - len(data)
        self._framing += len(data)
        self._execute(data)
        if self._framing > MAX_FRAMING:
            raise BadResponse(
                f"more than {MAX_FRAMING // 1024} KiB of chunk framing or trailers without data"
            )

    def _execute(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadResponse("a protocol switch nobody asked for") from None
        except httptools.HttpParserError as exc:
            if self._error is not None:  # raised by a callback of ours
                raise self._error from None
            reason = str(exc).strip() or type(exc).__name__
            raise BadResponse(f"malformed response: {reason[:100]}") from None

    def eof(self) -> None:
        """The engine closed the connection; raises UpstreamError if the answer was not
        complete."""
        if self.complete:
            return
        if self.head_done and self.until_close:
            self.complete = True  # a body delimited by the connection's end
            self.keep_alive = False
            return
        where = "body" if self.head_done else "head"
        raise UpstreamError(
            f"the engine closed the connection in the middle of the response {where}"
        )

    def take(self) -> bytes:
        """The body pieces parsed since the last call, as one bytes object."""
        body = self.body
        if not body:
            return b""
        self.body = []
        return body[0] if len(body) == 1 else b"".join(body)
