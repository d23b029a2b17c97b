"""The rules a structured configuration must meet: how a rule is worded, and the one
walk that asks each value of the configuration for its problems.

Each schema class states the rules about its own fields in a ``problems(key)``
method, next to those fields (:mod:`.schema`); a rule across tables sits in the
class that holds both (``auth.required`` needs ``store.url``: :class:`Config`).
:func:`check` walks the structured tree and asks every value that has the method,
with the dotted key it sits at, so a problem names the exact key:
``router.admission.bands[2].saturation_ceiling: must be in (0, 1], got 1.5``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

__all__ = ["Checked", "at", "between", "check", "positive"]


@runtime_checkable
class Checked(Protocol):
    """A configuration value that knows the rules about its own fields."""

    def problems(self, key: str) -> list[str]:
        """Every rule this value breaks, as ``key.field: problem`` lines; `key` is where
        it sits in the configuration ("" at the top)."""
        ...


def check(config: object) -> list[str]:
    """Every rule a structured configuration breaks, as ``key: problem`` lines: each
    value's own first, then its fields', in the schema's order."""
    return _walk(config, "")


def _walk(value: object, key: str) -> list[str]:
    if isinstance(value, tuple):
        return [p for i, item in enumerate(value) for p in _walk(item, f"{key}[{i}]")]
    if isinstance(value, dict):
        return [p for name, item in value.items() for p in _walk(item, at(key, str(name)))]
    cls = type(value)
    if not attrs.has(cls):
        return []
    problems = value.problems(key) if isinstance(value, Checked) else []
    for field in attrs.fields(cls):
        problems.extend(_walk(getattr(value, field.name), at(key, field.name)))
    return problems


def at(key: str, name: str) -> str:
    """The dotted key of field `name` of the table at `key`."""
    return f"{key}.{name}" if key else name


def between(
    problems: list[str], key: str, value: float, lo: float, hi: float, *, lo_open: bool = False
) -> None:
    below = value <= lo if lo_open else value < lo
    if below or value > hi:
        left = "(" if lo_open else "["
        problems.append(f"{key}: must be in {left}{lo:g}, {hi:g}], got {value:g}")


def positive(problems: list[str], key: str, value: float) -> None:
    if value <= 0:
        problems.append(f"{key}: must be greater than 0, got {value:g}")
