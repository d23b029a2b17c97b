"""Durations, byte sizes, listen addresses and hidden secrets as operators write (and
read) them in configuration.

Durations are held as float seconds, sizes as int bytes; both parse from the
human forms (``"250ms"``, ``"1h30m"``, ``"32MiB"``, ``"40GB"``) and plain numbers,
and print back in the shortest exact human form so ``--print-config`` round-trips.
"""

from __future__ import annotations

import re
import typing

import attrs

# Marker types: a float field typed `Seconds` is written as a duration, an int
# field typed `Bytes` as a size. Plain aliases keep mypy's view simple while the
# configuration's converter dispatches on the alias object itself.
Seconds = typing.NewType("Seconds", float)
Bytes = typing.NewType("Bytes", int)

#: What llmgw writes in place of a secret it shows (``--print-config``, the admin API's
#: models); copied back into a configuration or a body, it is refused, not sent.
HIDDEN = "<hidden>"

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_duration(value: object) -> float:
    """Seconds from ``5``, ``2.5``, ``"250ms"``, ``"10m"`` or ``"1h30m"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '5s' or '250ms', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _DURATION_PART.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"expected a duration such as '5s', '250ms', '10m' or '1h', got {value!r}"
                ) from None
    else:
        raise ValueError(f"expected a duration such as '5s' or '250ms', got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact form: 0.25 -> '250ms', 600 -> '10m', 5400 -> '90m'."""
    ms = round(seconds * 1000)
    if abs(ms - seconds * 1000) > 1e-6:
        return f"{seconds}s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_size(value: object) -> int:
    """Bytes from ``1024``, ``"40GB"``, ``"32MiB"`` (decimal and binary units)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as '40GB' or '32MiB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value.strip().lower())):
        number, unit = m.groups()
        if unit not in _SIZE_UNITS:
            raise ValueError(
                f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, GB, MiB, GiB"
            )
        size = int(float(number) * _SIZE_UNITS[unit])
    else:
        raise ValueError(f"expected a size such as '40GB' or '32MiB', got {value!r}")
    if size < 0:
        raise ValueError(f"a size cannot be negative, got {value!r}")
    return size


def format_size(size: int) -> str:
    """The exact form with the smallest number: 80000000000 -> '80GB', 2**25 -> '32MiB'."""
    best = f"{size}B"
    quotient = size
    for unit in ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB"):
        factor = _SIZE_UNITS[unit.lower()]
        if size and size % factor == 0 and size // factor < quotient:
            best, quotient = f"{size // factor}{unit}", size // factor
    return best


@attrs.frozen
class Address:
    """A listen address; an empty host means every interface."""

    host: str
    port: int

    @property
    def bind_host(self) -> str:
        return self.host or "0.0.0.0"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(value: str) -> Address:
    """``":8080"``, ``"127.0.0.1:9090"``, ``"[::1]:7443"`` or ``"localhost:80"``."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"expected '[IPv6]:PORT', got {value!r}")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected HOST:PORT or :PORT, got {value!r}")
        if ":" in host:
            raise ValueError(f"put an IPv6 host in brackets, as '[{host}]:{port_text}'")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number in 0..65535, got {port_text!r} in {value!r}")
    return Address(host, int(port_text))
