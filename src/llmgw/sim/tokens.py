"""An approximate, deterministic tokenizer and the simulator's pseudo-word vocabulary.

Counting rule: a text is cut into consecutive 4-character slices from its start (the
last slice may be shorter), so a text of ``n`` characters is ``ceil(n / 4)`` tokens.
That is close to what BPE tokenizers average on English prose and, more importantly
for a prefix cache, it is *prefix-stable*: two texts that share their first ``4k``
characters share their first ``k`` tokens. A slice's id is its CRC-32 folded into a
32k vocabulary — stable across processes, unlike Python's salted ``hash(str)``.

Generated tokens are drawn from a fixed vocabulary of 4-character pseudo-words
(a space and three letters: ``" bak"``), so generated text re-tokenizes to exactly the
number of tokens that were generated.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

VOCAB_SIZE = 32_000
CHARS_PER_TOKEN = 4

_ONSETS = "bdfghklmnprstvz"
_VOWELS = "aeiou"
_CODAS = "klmnrst"
#: Every generated token is one of these: " " + consonant + vowel + consonant.
WORDS: tuple[str, ...] = tuple(f" {o}{v}{c}" for o in _ONSETS for v in _VOWELS for c in _CODAS)


def token_id(piece: str) -> int:
    """The id of one token's text."""
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) % VOCAB_SIZE


def pieces(text: str) -> list[str]:
    """The text of each token of `text`."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def encode(text: str) -> list[int]:
    """Token ids for `text` (see the module docstring for the rule)."""
    return [token_id(p) for p in pieces(text)]


def count(text: str) -> int:
    """Number of tokens in `text`, without building the ids."""
    return -(-len(text) // CHARS_PER_TOKEN)


#: Ids of the generated vocabulary, aligned with WORDS.
WORD_IDS: tuple[int, ...] = tuple(token_id(w) for w in WORDS)


def render_chat(messages: Sequence[Any]) -> str:
    """A ChatML-like prompt from OpenAI chat messages, ending with the assistant's turn.

    Only text content is rendered; other content parts (images, audio) are skipped.
    Raises ValueError when a message is not an object with a string role.
    """
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        parts.append(f"<|{m['role']}|>\n{_content_text(m.get('content'))}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p) for p in content)
    raise ValueError("message 'content' must be a string, a list of parts, or null")


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    return ""
