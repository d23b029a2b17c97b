"""JSON Schema from attrs classes.

The admin API's JSON is produced by cattrs from frozen attrs view classes, and its
request bodies are structured into attrs classes by the one structuring path
(:func:`llmgw.config.structure_as`). :class:`SchemaBuilder` reads the same classes
(field names, types, defaults) and writes the JSON Schema (2020-12, as OpenAPI 3.1
uses) that the OpenAPI document and the configuration reference refer to, so the
shapes are written once.

It walks the annotations as the structuring path's shape check does, but for another
end: a document describing every field, where the shape check finds the faults of one
value. What a type is (an array, a mapping, a union, a field's type) both ask
:mod:`llmgw.config.annotations`.

Two styles, because two converters write JSON:

* ``"view"``: the views converter (:func:`llmgw.jsonviews.unstructure`): enums
  as their values, tuples and frozensets as arrays, every field present.
* ``"config"``: the configuration's converter (:data:`llmgw.config.converter`):
  durations and sizes as strings (``"5s"``, ``"80GB"``) on output, and also as
  numbers on input.

And two modes: ``"output"`` (every field is always present, so all are required)
and ``"input"`` (only fields without a default are required; unknown keys are
refused, as the converter forbids them).

A field can add JSON Schema keywords through its metadata
(``attrs.field(metadata={"schema": {"minimum": 1}, "description": "..."})``) or,
for classes defined elsewhere, through the builder's `overrides`.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from llmgw.config import converter
from llmgw.config.annotations import field_types, is_array, is_mapping, union_args
from llmgw.units import Bytes, Seconds

__all__ = ["SchemaBuilder"]

Style = Literal["view", "config"]
Mode = Literal["input", "output"]


def _is_newtype(tp: Any) -> bool:
    return isinstance(tp, typing.NewType)


class SchemaBuilder:
    """Collects component schemas (``#/components/schemas/Name``) for attrs classes."""

    def __init__(
        self, overrides: Mapping[tuple[Any, ...], Mapping[str, Any]] | None = None
    ) -> None:
        # (class, field) or (class, field, mode) -> JSON Schema keywords to add.
        self.components: dict[str, dict[str, Any]] = {}
        self.overrides = dict(overrides or {})
        self._names: dict[tuple[type, Mode, Style], str] = {}

    # -- components ------------------------------------------------------------

    def ref(self, cls: type, mode: Mode = "output", style: Style = "view") -> dict[str, Any]:
        """``{"$ref": ...}`` to `cls`'s component, built on first use."""
        key = (cls, mode, style)
        name = self._names.get(key)
        if name is None:
            name = self._name_for(cls, mode)
            self._names[key] = name
            self.components[name] = {}  # reserved first: classes may refer to themselves
            self.components[name] = self.object_schema(cls, mode, style)
        return {"$ref": f"#/components/schemas/{name}"}

    def _name_for(self, cls: type, mode: Mode) -> str:
        base = cls.__name__ + ("Input" if mode == "input" else "")
        name, n = base, 2
        while name in self.components:
            name, n = f"{base}{n}", n + 1
        return name

    def add(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        """Register a hand-written component; returns a reference to it."""
        self.components[name] = schema
        return {"$ref": f"#/components/schemas/{name}"}

    def object_schema(
        self, cls: type, mode: Mode = "output", style: Style = "view"
    ) -> dict[str, Any]:
        """The object schema of attrs class `cls` itself (not a reference)."""
        hints = field_types(cls)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for field in attrs.fields(cls):
            if not field.init:
                continue
            prop = dict(self.of_type(hints[field.name], mode, style))
            extra = {
                **field.metadata.get("schema", {}),
                **self.overrides.get((cls, field.name), {}),
                **self.overrides.get((cls, field.name, mode), {}),
            }
            if extra:
                prop = {"allOf": [prop], **extra} if "$ref" in prop else _merge(prop, extra)
            if description := field.metadata.get("description"):
                prop["description"] = description
            if mode == "input" and field.default is not attrs.NOTHING:
                default = _default_json(field.default, style)
                if default is not _NO_DEFAULT:
                    prop["default"] = default
            properties[field.name] = prop
            if mode == "output" or field.default is attrs.NOTHING:
                required.append(field.name)
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        doc = inspect.getdoc(cls)
        if doc and doc != inspect.getdoc(object) and not doc.startswith(cls.__name__ + "("):
            schema["description"] = doc.split("\n\n")[0].replace("\n", " ")
        if not required:
            del schema["required"]
        return schema

    # -- types -----------------------------------------------------------------

    def of_type(self, tp: Any, mode: Mode, style: Style) -> dict[str, Any]:
        """The JSON Schema of a value of Python type `tp`."""
        if tp is Any:
            return {}
        if tp is None or tp is type(None):
            return {"type": "null"}
        if style == "config" and tp is Seconds:
            return _seconds(mode)
        if style == "config" and tp is Bytes:
            return _bytes(mode)
        if _is_newtype(tp):
            return self.of_type(tp.__supertype__, mode, style)
        if (args := union_args(tp)) is not None:
            return _union([self.of_type(a, mode, style) for a in args])
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is Literal:
            values = list(args)
            schema: dict[str, Any] = {"enum": values}
            if all(isinstance(v, str) for v in values):
                schema = {"type": "string", **schema}
            return schema
        if is_array(tp):
            return self._array(origin or tp, args, mode, style)
        if is_mapping(tp):
            value = self.of_type(args[1], mode, style) if args else {}
            return {"type": "object", "additionalProperties": value}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            values = [m.value for m in tp]
            kind = "string" if all(isinstance(v, str) for v in values) else "integer"
            return {"type": kind, "enum": values}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is str:
            return {"type": "string"}
        if isinstance(tp, type) and attrs.has(tp):
            return self.ref(tp, mode, style)
        raise TypeError(f"no JSON Schema for {tp!r}")

    def _array(
        self, origin: Any, args: tuple[Any, ...], mode: Mode, style: Style
    ) -> dict[str, Any]:
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [self.of_type(a, mode, style) for a in args]
            return {
                "type": "array",
                "prefixItems": items,
                "items": False,
                "minItems": len(items),
                "maxItems": len(items),
            }
        schema: dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = self.of_type(args[0], mode, style)
        if origin in (frozenset, set):
            schema["uniqueItems"] = True
        return schema


_NO_DEFAULT = object()


def _merge(schema: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with the keywords of `extra`; subschemas (``items``) merge, not replace."""
    merged = dict(schema)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _default_json(default: Any, style: Style) -> Any:
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return _NO_DEFAULT
        default = default.factory()
    if default is None or isinstance(default, bool | int | float | str):
        return default
    if isinstance(default, tuple | list | dict):
        return converter.unstructure(default) if style == "config" else _plain(default)
    return _NO_DEFAULT


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _seconds(mode: Mode) -> dict[str, Any]:
    text = {"type": "string", "description": "a duration", "examples": ["250ms", "5s", "1h30m"]}
    if mode == "output":
        return text
    return {"anyOf": [{"type": "number", "minimum": 0}, text]}


def _bytes(mode: Mode) -> dict[str, Any]:
    text = {"type": "string", "description": "a size in bytes", "examples": ["80GB", "32MiB"]}
    if mode == "output":
        return text
    return {"anyOf": [{"type": "integer", "minimum": 0}, text]}


def _union(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """`a | b | None`: a type list when every part is a bare type, else anyOf."""
    schemas: list[dict[str, Any]] = []
    for part in parts:  # `(a | b) | None`: one flat anyOf
        schemas.extend(part["anyOf"] if set(part) == {"anyOf"} else [part])
    if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
        return {"type": [s["type"] for s in schemas]}
    simple_null = [s for s in schemas if s == {"type": "null"}]
    others = [s for s in schemas if s != {"type": "null"}]
    if simple_null and len(others) == 1 and "type" in others[0] and "$ref" not in others[0]:
        only = dict(others[0])
        kind = only["type"]
        if isinstance(kind, str) and "anyOf" not in only:
            only["type"] = [kind, "null"]
            if "enum" in only:  # a Literal or an Enum: null is one of its values then
                only["enum"] = [*only["enum"], None]
            return only
    return {"anyOf": schemas}
