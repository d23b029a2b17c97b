"""View values as JSON: the one converter the admin API answers with.

Every view (the control plane's, the router's endpoints and admission, keys, usage,
debug) is a frozen attrs value written by this converter: enums as their values, tuples
and frozensets as arrays, every field present, numbers as numbers. It is not the
configuration's converter (:data:`llmgw.config.converter`), which writes durations and
sizes as the strings an operator reads back in; a view's seconds are numbers. Nor is
it the agent protocol's (:mod:`llmgw.transport.convert`: protobuf field mapping) or the
bench's (:mod:`llmgw.bench.stats`: its own result files).
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from cattrs.preconf.json import make_converter

__all__ = ["from_dict", "unstructure"]

T = TypeVar("T")

_converter = make_converter()
_converter.register_unstructure_hook_func(
    lambda t: isinstance(t, type) and issubclass(t, enum.Enum), lambda e: e.value
)


def unstructure(value: Any) -> Any:
    """A view value as plain JSON-able data."""
    return _converter.unstructure(value)


def from_dict(data: Any, cls: type[T]) -> T:
    """A dict built by llmgw itself (the router's endpoint and admission views) as its
    view class, on its way out: what is answered is then exactly what the class, and
    the OpenAPI document made from it, say. Not for input (a missing key is a bug here:
    it raises); input goes through :func:`llmgw.config.structure_as`."""
    return _converter.structure(data, cls)
