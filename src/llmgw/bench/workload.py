"""Seeded synthetic prompts with a controllable shared prefix.

Token approximation: a prompt of N tokens is N pseudo-words of three lowercase
letters joined by spaces. Word plus space is four characters, which the bundled
simulator counts as exactly one token (it cuts text into 4-character slices), and
BPE tokenizers land near one token per such word as well; so the server's
`usage.prompt_tokens` is N plus a few tokens of chat template. The summary reports
the server's count whenever the server sends one.

Shared prefix: requests fall into `prefix_groups` groups (tenants, system prompts).
The first ``round(shared_prefix_ratio * prompt_tokens)`` words of every prompt in a
group are identical; the rest are drawn per request, so only the prefix can hit an
engine's prefix cache. Each request's prompt is a pure function of (spec, index),
so two targets given the same indices receive byte-identical prompts.
"""

from __future__ import annotations

import random

import attrs

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
# 1620 consonant-vowel-consonant words: about one token each (see above).
VOCABULARY: tuple[str, ...] = tuple(
    c + v + e for c in _CONSONANTS for v in _VOWELS for e in _CONSONANTS
)


def _positive(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attr.name} must be at least 1, got {value}")


def _ratio(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attr.name} must be in [0, 1], got {value}")


def _non_negative(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attr.name} must not be negative, got {value}")


@attrs.frozen
class WorkloadSpec:
    """What prompts look like. `sessions` = 0 means requests carry no session."""

    prompt_tokens: int = attrs.field(default=256, validator=_positive)
    output_tokens: int = attrs.field(default=64, validator=_positive)
    shared_prefix_ratio: float = attrs.field(default=0.0, validator=_ratio)
    prefix_groups: int = attrs.field(default=1, validator=_positive)
    sessions: int = attrs.field(default=0, validator=_non_negative)
    seed: int = 0

    @property
    def prefix_words(self) -> int:
        return round(self.shared_prefix_ratio * self.prompt_tokens)


@attrs.frozen
class Prompt:
    """One request's input. `words` is the approximate prompt length in tokens."""

    index: int
    group: int
    session: str | None
    text: str
    words: int
    prefix_words: int
    max_tokens: int


class Workload:
    """Prompts by request index for one `WorkloadSpec`."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._prefixes: dict[int, tuple[str, ...]] = {}

    def session_of(self, index: int) -> int | None:
        return None if self.spec.sessions == 0 else index % self.spec.sessions

    def group_of(self, index: int) -> int:
        # A session keeps one prefix group, as a conversation keeps its system prompt;
        # that keeps session affinity and prefix affinity pointing the same way.
        session = self.session_of(index)
        key = index if session is None else session
        return key % self.spec.prefix_groups

    def prefix(self, group: int) -> tuple[str, ...]:
        """The words every prompt of `group` starts with."""
        if group not in self._prefixes:
            self._prefixes[group] = self._make_prefix(group)
        return self._prefixes[group]

    def _make_prefix(self, group: int) -> tuple[str, ...]:
        n = self.spec.prefix_words
        if n == 0:
            return ()
        rng = random.Random(f"llmgw-bench:{self.spec.seed}:prefix:{group}")
        # The first word differs between groups by construction, so two groups share
        # not even one cache block by accident.
        offset = random.Random(f"llmgw-bench:{self.spec.seed}:offset").randrange(len(VOCABULARY))
        first = VOCABULARY[(offset + group) % len(VOCABULARY)]
        return (first, *rng.choices(VOCABULARY, k=n - 1))

    def prompt(self, index: int) -> Prompt:
        spec = self.spec
        group = self.group_of(index)
        prefix = self.prefix(group)
        rng = random.Random(f"llmgw-bench:{spec.seed}:request:{index}")
        suffix = rng.choices(VOCABULARY, k=spec.prompt_tokens - len(prefix))
        session = self.session_of(index)
        return Prompt(
            index=index,
            group=group,
            session=None if session is None else f"bench-{spec.seed}-{session}",
            text=" ".join((*prefix, *suffix)),
            words=spec.prompt_tokens,
            prefix_words=len(prefix),
            max_tokens=spec.output_tokens,
        )
