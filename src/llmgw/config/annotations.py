"""What an attrs field's annotation is, read one way by every walker over the schema.

Three readers walk the same annotations for different ends: the shape check before
structuring (:mod:`.structure`), the environment overlay, which parses a variable into
what its field holds (:mod:`.env`), and the admin API's JSON Schema builder
(:class:`llmgw.admin.schema.SchemaBuilder`), which writes the OpenAPI document and the
configuration reference. Each keeps its own walk, since what it makes of a type
differs (problems, a parsed value, a schema); what a type *is* (a table, an array,
an optional value, the type of a field) is decided here, once.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "field_type",
    "field_types",
    "is_array",
    "is_mapping",
    "is_table",
    "optional_of",
    "union_args",
]

_ARRAYS: tuple[Any, ...] = (tuple, list, frozenset, set, Sequence, typing.Sequence)
_MAPPINGS: tuple[Any, ...] = (dict, Mapping, typing.Mapping)


def union_args(tp: Any) -> tuple[Any, ...] | None:
    """The members of a union (``a | b``, ``Optional[a]``); None for any other type."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def optional_of(tp: Any) -> Any:
    """`a` for ``a | None``; any other type (a union of several, too) as it is."""
    args = union_args(tp)
    if args is None:
        return tp
    others = [a for a in args if a is not type(None)]
    return others[0] if len(others) == 1 else tp


def is_array(tp: Any) -> bool:
    """A tuple, list, set or sequence type, bare or parameterised."""
    return typing.get_origin(tp) in _ARRAYS or tp in _ARRAYS


def is_mapping(tp: Any) -> bool:
    """A dict or mapping type, bare or parameterised."""
    return typing.get_origin(tp) in _MAPPINGS or tp in _MAPPINGS


def is_table(tp: Any) -> bool:
    """A mapping or an attrs class: what TOML writes as a table and JSON as an object."""
    return attrs.has(tp) or is_mapping(tp)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of attrs class `cls`. Resolving string annotations
    costs; the shape check asks once per key of a table, the admin API per request body."""
    return typing.get_type_hints(cls)


def field_type(cls: Any, key: str) -> Any:
    """The type of attrs class `cls`'s field `key`; None for no such field."""
    if attrs.has(cls) and key in attrs.fields_dict(cls):
        return field_types(cls)[key]
    return None
