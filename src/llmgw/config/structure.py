"""The one way input becomes llmgw's attrs values: configuration files, stored runtime
models, the workers' catalog and the admin API's request bodies all go through
:func:`structure_as`, and its problems are worded here.

Structuring is two steps over one path. The shape check first: tables and arrays
where the schema has them, since cattrs would iterate a string into an array of
characters, or fail on one with a bare TypeError. Then cattrs with strict hooks (no
``"3"`` for 3, durations and sizes in their written forms, unknown keys refused), whose
tree of errors is flattened into ``key: problem`` lines with llmgw's wording ("did you
mean", what replaced a removed key). A document is worded in its own vocabulary: a
configuration file's TOML ("must be a table") or a request body's JSON ("expected an
object").

The same converter writes values back in the configuration's shape (durations and sizes
as strings) for ``--print-config``, the store and the workers. The admin API's views are
written by another one (:mod:`llmgw.jsonviews`): live numbers, not a document to read
back.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from llmgw import units
from llmgw.config.annotations import field_type, is_array, is_table, union_args
from llmgw.units import Bytes, Seconds

__all__ = [
    "JSON_WORDING",
    "REMOVED_KEYS",
    "TOML_WORDING",
    "ConfigError",
    "Wording",
    "converter",
    "shape_problems",
    "structure_as",
    "unstructure",
]

T = TypeVar("T")


class ConfigError(Exception):
    """The configuration cannot be used; `problems` name each key and what is wrong."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


# -- the converter -------------------------------------------------------------------


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)
    conv.register_structure_hook(Seconds, lambda v, _: Seconds(units.parse_duration(v)))
    conv.register_unstructure_hook(Seconds, lambda v: units.format_duration(v))
    conv.register_structure_hook(Bytes, lambda v, _: Bytes(units.parse_size(v)))
    conv.register_unstructure_hook(Bytes, lambda v: units.format_size(v))

    def strict(kind: type[Any]) -> Any:
        # cattrs would happily turn "3" into 3 or 1.5 into 1; a config typo should not pass.
        def hook(value: object, _: object) -> Any:
            if isinstance(value, bool) and kind is not bool:
                raise ValueError(f"expected {kind.__name__}, got {value!r}")
            if kind is float and isinstance(value, int | float):
                return float(value)
            if not isinstance(value, kind):
                raise ValueError(f"expected {kind.__name__}, got {value!r}")
            return value

        return hook

    for kind in (int, float, str, bool):
        conv.register_structure_hook(kind, strict(kind))
    return conv


converter = _make_converter()


def unstructure(value: object) -> Any:
    """`value` in the configuration's shape as TOML can hold it: nested dicts, durations
    and sizes as strings, and no None values (TOML has no null)."""

    def prune(item: Any) -> Any:
        if isinstance(item, dict):
            return {k: prune(v) for k, v in item.items() if v is not None}
        if isinstance(item, list | tuple):
            return [prune(v) for v in item]
        return item

    return prune(converter.unstructure(value))


# -- wording ---------------------------------------------------------------------------


@attrs.frozen
class Wording:
    """How a shape problem is put: a configuration file speaks TOML ("must be a
    table"), the admin API's bodies JSON ("expected an object")."""

    # What a value is called, by the first of these types it is an instance of...
    kinds: tuple[tuple[type | tuple[type, ...], str], ...]
    # ...or else by this, formatted with its Python type's name.
    other: str
    table: str = "a table"
    wants: str = "must be"

    def kind(self, value: object) -> str:
        """What `value` is, in this vocabulary (with its article)."""
        for types_, name in self.kinds:
            if isinstance(value, types_):
                return name
        return self.other.format(type(value).__name__)


TOML_WORDING = Wording(
    (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (Mapping, "a table"),
        ((list, tuple), "an array"),
    ),
    other="a {}",
)
#: Shape problems of a JSON request body, in JSON's words ("expected an array").
JSON_WORDING = Wording(
    (
        (str, "a string"),
        (dict, "an object"),
        (bool, "a boolean"),
        ((int, float), "a number"),
        (type(None), "null"),
    ),
    other="{}",
    table="an object",
    wants="expected",
)

# Keys that no longer exist, and what replaced them (named in the unknown-key error).
REMOVED_KEYS = {
    "router.scoring.target_inflight": (
        "removed: a replica is full when its engine says so (its queue, KV cache, a "
        "429) or at its capacity: launch flags under the control plane, or "
        "`capacity` on a static endpoint"
    ),
    "router.scoring.session_load_factor": (
        "removed: a session stays on its replica while that one has room and its "
        "prefill work (what it still has to prefill, plus the part of this prompt it "
        "does not hold) is the least; see docs/scheduling.md"
    ),
}


# -- the shape check --------------------------------------------------------------------


def shape_problems(
    value: Any, tp: Any, path: str = "", wording: Wording = TOML_WORDING
) -> list[str]:
    """Tables and arrays where the schema `tp` has them (the first step of
    :func:`structure_as`; alone, for a partial document such as a PATCH body, whose
    keys are all optional). Scalars are left to the converter's strict hooks, unknown
    keys to its extra-key check."""
    args = union_args(tp)
    if args is not None:
        candidates = [a for a in args if a is not type(None)]
        if value is None or len(candidates) != 1:
            return []
        tp = candidates[0]
    where, wants, args = path or "<root>", wording.wants, typing.get_args(tp)
    if is_table(tp):
        if not isinstance(value, Mapping):
            return [f"{where}: {wants} {wording.table}, got {wording.kind(value)}"]
        problems: list[str] = []
        for key, item in value.items():
            sub_tp = field_type(tp, key) if attrs.has(tp) else (args[1] if args else None)
            if sub_tp is not None:  # unknown keys are the converter's to name
                sub = f"{path}.{key}" if path else str(key)
                problems.extend(shape_problems(item, sub_tp, sub, wording))
        return problems
    if is_array(tp):
        if not isinstance(value, list | tuple):
            return [f"{where}: {wants} an array, got {wording.kind(value)}"]
        if not args:
            return []
        fixed = typing.get_origin(tp) is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        if fixed and len(value) != len(args):
            return [f"{where}: {wants} an array of {len(args)} values, got {len(value)}"]
        return [
            p
            for i, item in enumerate(value)
            for p in shape_problems(item, args[i] if fixed else args[0], f"{path}[{i}]", wording)
        ]
    return []


# -- cattrs' errors as keys ---------------------------------------------------------------


def _converter_problems(exc: BaseException, path: str) -> list[str]:
    """cattrs' tree of errors as ``key: problem`` lines, a line per leaf."""
    problems: list[str] = []
    if isinstance(exc, ClassValidationError | IterableValidationError):
        with_notes, others = exc.group_exceptions()
        for sub, note in with_notes:
            step = getattr(note, "name", None) or getattr(note, "index", None)
            if isinstance(step, int):
                sub_path = f"{path}[{step}]"
            else:
                sub_path = f"{path}.{step}" if path else str(step)
            problems.extend(_converter_problems(sub, sub_path))
        for sub in others:
            problems.extend(_converter_problems(sub, path))
        return problems
    if isinstance(exc, ForbiddenExtraKeysError):
        known = [f.name for f in attrs.fields(exc.cl)] if exc.cl and attrs.has(exc.cl) else []
        for extra in sorted(exc.extra_fields):
            key = f"{path}.{extra}" if path else extra
            close = difflib.get_close_matches(extra, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if key in REMOVED_KEYS:
                hint = f" ({REMOVED_KEYS[key]})"
            problems.append(f"{key}: unknown key{hint}")
        return problems
    if isinstance(exc, KeyError):
        # cattrs notes the missing attribute, so `path` already ends with its name.
        return [f"{path}: required key is missing"]
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TypeError | AttributeError):
        # A value of another kind than the schema's (a string for a table): the shape
        # check names both kinds before cattrs runs, so this is a last resort.
        message = "has the wrong type"
    return [f"{path or '<root>'}: {message}"]


# -- the entry point ----------------------------------------------------------------------


def structure_as(data: Mapping[str, Any], tp: type[T], wording: Wording = TOML_WORDING) -> T:
    """An attrs instance of `tp` from parsed TOML or JSON, by the shape check and the
    strict converter; raises ConfigError naming every bad key. The rules about values
    (ranges, names that must exist) are the caller's: :func:`llmgw.config.check` for a
    configuration, ``catalog.check_models`` for models."""
    shape = shape_problems(data, tp, "", wording)
    if shape:
        raise ConfigError(shape)
    try:
        return converter.structure(dict(data), tp)
    except Exception as exc:  # cattrs raises a tree of errors; flatten it into keys
        raise ConfigError(_converter_problems(exc, "")) from None
