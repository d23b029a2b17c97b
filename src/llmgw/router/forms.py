"""Multipart form bodies (audio uploads): the model read from their ``model`` field.

Parsed strictly with werkzeug's multipart decoder: one ``model`` field of UTF-8 text,
at most :data:`MAX_PARTS` parts, a body that ends where it says. The engine gets the
client's bytes, unless the model must be renamed (an alias, a fallback): then the
parts are written again with the same boundary, the ``model`` field's value changed.
"""

from __future__ import annotations

from typing import Any

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from llmgw.router.body import BodyError

__all__ = ["MAX_PARTS", "FormBody", "parse_form"]

#: Parts a form may have (an upload is a file and a few fields).
MAX_PARTS = 64
# What may be written back into a part's head unchanged.
_SAFE = str.maketrans("", "", '"\r\n\0')


class _Part:
    __slots__ = ("content_type", "data", "filename", "name")

    def __init__(self, name: str, filename: str | None, content_type: str | None) -> None:
        self.name = name
        self.filename = filename
        self.content_type = content_type
        self.data = bytearray()


class FormBody:
    """A multipart request body, as the router needs it (the interface of
    :class:`llmgw.router.body.RequestBody`: a form never streams here)."""

    stream = False
    include_usage = False
    max_tokens: int | None = None

    def __init__(self, raw: bytes, content_type: bytes, boundary: bytes, parts: list[_Part]):
        self.raw = raw
        self.content_type = content_type
        self._boundary = boundary
        self._parts = parts
        self.model = next(p.data.decode() for p in parts if p.name == "model")

    def member(self, name: str) -> Any:
        return None

    def part(self, name: str) -> tuple[str | None, bytes] | None:
        """The first part called `name`: its file name (None for a plain field) and
        its data."""
        found = next((p for p in self._parts if p.name == name), None)
        return None if found is None else (found.filename, bytes(found.data))

    def affinity_fields(self, chars: int | None = None) -> dict[str, Any]:
        return {}  # an upload has no prompt text to share a prefix by

    def payload(self, model: str, add_usage: bool) -> bytes:
        if model == self.model:
            return self.raw
        out = bytearray()
        for part in self._parts:
            out += b"--" + self._boundary + b"\r\n"
            disposition = f'form-data; name="{part.name}"'
            if part.filename is not None:
                disposition += f'; filename="{part.filename}"'
            out += f"Content-Disposition: {disposition}\r\n".encode()
            if part.content_type is not None:
                out += f"Content-Type: {part.content_type}\r\n".encode()
            out += b"\r\n"
            out += model.encode() if part.name == "model" else part.data
            out += b"\r\n"
        out += b"--" + self._boundary + b"--\r\n"
        return bytes(out)


def parse_form(raw: bytes, content_type: bytes) -> FormBody:
    """The multipart body `raw`; BodyError naming what is wrong."""
    mimetype, options = parse_options_header(content_type.decode("latin-1"))
    boundary = options.get("boundary", "")
    if mimetype != "multipart/form-data" or not boundary or len(boundary) > 200:
        raise BodyError("expected multipart/form-data with a boundary")
    decoder = MultipartDecoder(boundary.encode("latin-1"), max_parts=MAX_PARTS)
    decoder.receive_data(raw)
    decoder.receive_data(None)
    parts: list[_Part] = []
    try:
        while True:
            event = decoder.next_event()
            if isinstance(event, Field | File):
                name = event.name
                filename = event.filename if isinstance(event, File) else None
                if name != name.translate(_SAFE) or (
                    filename is not None and filename != filename.translate(_SAFE)
                ):
                    raise BodyError("a form part's name has a quote or a control character")
                parts.append(_Part(name, filename, event.headers.get("content-type")))
            elif isinstance(event, Data):
                if not parts:
                    raise BodyError("form data before any part")
                parts[-1].data += event.data
            elif isinstance(event, Epilogue):
                break
            elif isinstance(event, NeedData):
                raise BodyError("the form ends before its closing boundary")
    except ValueError as exc:  # werkzeug's word for a malformed part
        raise BodyError(f"malformed form: {exc}") from None
    except RequestEntityTooLarge:  # its word for too many parts
        raise BodyError(f"the form has more than {MAX_PARTS} parts") from None
    models = [p for p in parts if p.name == "model" and p.filename is None]
    if len(models) != 1:
        raise BodyError("the form must have one 'model' field", "model")
    try:
        name = models[0].data.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("'model' must be UTF-8 text", "model") from None
    if not name or name != name.translate(_SAFE):
        raise BodyError("'model' must be a model name", "model")
    return FormBody(raw, content_type, boundary.encode("latin-1"), parts)
