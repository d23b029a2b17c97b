"""Damage to well-formed messages, for the parsers' fuzz tests (both directions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st


def mangle(draw: Any, message: bytes, alphabet: Sequence[int]) -> bytes:
    """`message` with one to three bytes replaced, inserted or deleted (bytes drawn
    from `alphabet`: the ones a parser must treat with care), or plain junk."""
    if draw(st.booleans()):
        return bytes(draw(st.binary(min_size=1, max_size=400)))
    data = bytearray(message)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = draw(st.sampled_from(list(alphabet)))
        if op == "insert" or at == len(data):
            data.insert(at, byte)
        elif op == "replace":
            data[at] = byte
        else:
            del data[at]
    return bytes(data)
