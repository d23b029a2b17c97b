"""The environment's layer: ``LLMGW_A__B=value`` sets key ``a.b``.

Each variable is parsed into what its field holds (an integer, a boolean, an array or
a table in TOML syntax), found by walking the schema's annotations down the key;
``__2__`` indexes into an array (``LLMGW_ROUTER__ADMISSION__BANDS__2__PRIORITY=5``). An
unknown key is left in place for structuring, which names it and suggests the closest.
"""

from __future__ import annotations

import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from llmgw.config.annotations import field_type, is_array, is_mapping, union_args
from llmgw.config.files import merge
from llmgw.config.schema import Config
from llmgw.config.structure import ConfigError
from llmgw.units import Bytes, Seconds

__all__ = ["ENV_PREFIX", "env_overlay"]

ENV_PREFIX = "LLMGW_"


def env_overlay(environ: Mapping[str, str], base: Any) -> dict[str, Any]:
    """Apply ``LLMGW_A__B=value`` variables onto the merged dict `base`; returns a new dict."""
    result: Any = base
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        result = _set_path(result, parts, environ[name], Config, name)
    return typing.cast(dict[str, Any], result)


def _first_of(tp: Any) -> Any:
    """`tp`, or the first member of a union that is not None."""
    args = union_args(tp)
    return tp if args is None else next((a for a in args if a is not type(None)), tp)


def _inner(tp: Any, key: str) -> Any:
    """The type found one step below `tp` at `key` (a field, dict value or array item)."""
    tp = _first_of(tp)
    args = typing.get_args(tp)
    if is_mapping(tp):
        return args[1] if args else None
    if is_array(tp):
        return args[0] if args else None
    return field_type(tp, key)


def _parse_env_value(tp: Any, raw: str, key: str) -> Any:
    """Parse an environment string into what the field at `key` expects."""
    tp = _first_of(tp)
    if tp is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError([f"{key}: expected true or false, got {raw!r}"])
    if tp is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError([f"{key}: expected an integer, got {raw!r}"]) from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError([f"{key}: expected a number, got {raw!r}"]) from None
    if tp in (str, Seconds, Bytes):
        return raw
    # Arrays and tables: TOML syntax (`[20000, 20999]`, `{ a = "b" }`), or a
    # comma-separated list for arrays of plain values.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if typing.get_origin(tp) is tuple:
            return [p.strip() for p in raw.split(",") if p.strip()]
        raise ConfigError([f"{key}: cannot parse {raw!r} as a TOML value"]) from None


def _set_path(node: Any, parts: list[str], raw: str, tp: Any, name: str) -> Any:
    key, rest = parts[0], parts[1:]
    if isinstance(node, list):
        if not key.isdigit() or int(key) >= len(node):
            raise ConfigError([f"{name}: no array element {key!r} to set"])
        copy = list(node)
        sub_tp = _inner(tp, key)
        copy[int(key)] = (
            _set_path(copy[int(key)], rest, raw, sub_tp, name)
            if rest
            else merge(copy[int(key)], _parse_env_value(sub_tp, raw, name))
        )
        return copy
    node = dict(node) if isinstance(node, dict) else {}
    sub_tp = _inner(tp, key)
    if sub_tp is None:
        # Unknown: leave it for the structuring step, which names it and suggests.
        node[key] = raw if not rest else _set_path({}, rest, raw, None, name)
        return node
    if rest:
        node[key] = _set_path(node.get(key, {}), rest, raw, sub_tp, name)
    else:
        # A table given whole merges like one from the file: it cannot drop built-ins.
        value = _parse_env_value(sub_tp, raw, name)
        node[key] = merge(node[key], value) if key in node else value
    return node
