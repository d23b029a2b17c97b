"""What a stateful plugin hears of a request, and when (llm-d's scheduler has the same
three moments).

A plugin that remembers requests (a session's replica, which replicas hold which
prompt) owns its table and keeps it through optional hooks, called by the request
pipeline (llmgw.router.pipeline) for every request the plugin's router schedules:

* ``prepare(ask, facts, now)``: before the pick, add what it knows of `ask` to the
  :class:`Facts` the filters and scorers read;
* ``pre_request(ask, decision, now)``: once a replica is picked, before the attempt;
  what it returns comes back at ``complete`` (per-request state with no table of
  requests in flight to leak);
* ``complete(ask, done, note)``: when the request ends, served, failed or abandoned;
  it may return the outcome of a prediction it made, for the request's usage record;
* ``forget(endpoint_id)``: the replica left the fleet.

Filters, scorers and pickers named in a routing profile get the same hooks by
defining them; the router's own memories (:mod:`.memory`) are plugins of this kind
with no filter of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from llmgw.domain.usage import Usage
    from llmgw.router.kv_events import Exact
    from llmgw.router.scheduling.scheduler import Decision

__all__ = ["Ask", "Complete", "Done", "Facts", "Forget", "PreRequest", "Prepare", "hooks_of"]


@attrs.frozen
class Ask:
    """What scheduling knows of one request for one model (a fallback is another ask)."""

    model: str
    session_key: str | None
    # The prompt's leading text's block hashes for this model (empty: none to hash).
    prefix: tuple[int, ...]
    # Its estimated prompt tokens (its prefill work where nothing is cached).
    prompt_tokens: float
    # What the engines' own KV indexes say the replicas they cover hold of it.
    exact: Exact | None = None


@attrs.define
class Facts:
    """What the memories know of an ask, read by the filters and scorers."""

    session_endpoint: str | None = None
    prefix_matches: dict[str, float] = attrs.field(factory=dict)
    cached_tokens: dict[str, float] = attrs.field(factory=dict)


@attrs.frozen
class Done:
    """How a scheduled request ended at the replica that answered it."""

    endpoint_id: str
    # The replica the pick chose (a retry may have been served by another).
    picked: str
    status: int
    usage: Usage | None
    ttft: float | None
    # Seconds from the request's arrival; and the clock when it ended.
    latency: float
    ended: float
    # The answer arrived whole and well-formed.
    clean: bool


class Prepare(Protocol):
    def prepare(self, ask: Ask, facts: Facts, now: float) -> None: ...


class PreRequest(Protocol):
    def pre_request(self, ask: Ask, decision: Decision, now: float) -> object: ...


class Complete(Protocol):
    def complete(self, ask: Ask, done: Done, note: object) -> str | None: ...


class Forget(Protocol):
    def forget(self, endpoint_id: str) -> None: ...


@attrs.frozen
class Hooks:
    """The hooks of a set of plugins, each plugin once, in the order given."""

    prepare: tuple[Prepare, ...] = ()
    pre_request: tuple[PreRequest, ...] = ()
    complete: tuple[Complete, ...] = ()
    forget: tuple[Forget, ...] = ()


def hooks_of(plugins: Iterable[object]) -> Hooks:
    """The hooks the objects in `plugins` define, each object once, in their order."""
    unique = list({id(p): p for p in plugins}.values())

    def having(name: str) -> tuple[Any, ...]:
        return tuple(p for p in unique if callable(getattr(p, name, None)))

    return Hooks(having("prepare"), having("pre_request"), having("complete"), having("forget"))
