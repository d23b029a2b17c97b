"""The router's memories of requests: stateful plugins that own their tables
(:mod:`.hooks` says when they are called).

* :class:`SessionMemory`: each session's replica (session affinity's home);
* :class:`PrefixMemory`: which replicas hold which prompt prefixes, estimated from the
  router's own picks and corrected by the engines' answers, or the engines' own KV
  indexes where they publish them (prefix affinity's homes, and every scorer's idea of
  a prompt's prefill work).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.router.affinity import PrefixIndex, Probe, SessionTable
from llmgw.router.scheduling.hooks import Ask, Done, Facts

if TYPE_CHECKING:
    from prometheus_client import Counter

    from llmgw.router.scheduling.scheduler import Decision

__all__ = ["PrefixMemory", "SessionMemory"]


class SessionMemory:
    """Each session's replica: where its conversation's cache is."""

    def __init__(self, table: SessionTable) -> None:
        self.table = table

    def prepare(self, ask: Ask, facts: Facts, now: float) -> None:
        if ask.session_key:
            facts.session_endpoint = self.table.lookup(ask.session_key, now)

    def pre_request(self, ask: Ask, decision: Decision, now: float) -> None:
        # Remembered at once, not when the answer is complete: a burst of requests
        # from a new session must not scatter before the first finishes.
        if ask.session_key:
            self.table.record(ask.session_key, decision.endpoint_id, now)

    def complete(self, ask: Ask, done: Done, note: object) -> None:
        # A retry may have served elsewhere than the pick: the session follows it.
        if (
            ask.session_key
            and done.status < 400
            and done.clean
            and self.table.lookup(ask.session_key, done.ended) != done.endpoint_id
        ):
            self.table.record(ask.session_key, done.endpoint_id, done.ended)

    def forget(self, endpoint_id: str) -> None:
        self.table.forget(endpoint_id)


class PrefixMemory:
    """Which replicas hold which prompt prefixes: the estimated table, overlaid by the
    engines' own indexes where the ask carries them (Ask.exact)."""

    def __init__(self, index: PrefixIndex, predictions: Counter) -> None:
        self.index = index
        # llmgw_prefix_predictions_total{model,outcome}: how often the table was right.
        self._predictions = predictions

    def prepare(self, ask: Ask, facts: Facts, now: float) -> None:
        matches: dict[str, float] = {}
        cached: dict[str, float] = {}
        if ask.prefix:
            matches, cached = self.index.lookup(ask.prefix, now)
        if ask.exact is not None:
            matches, cached = ask.exact.overlay(matches, cached)
        facts.prefix_matches, facts.cached_tokens = matches, cached

    def pre_request(self, ask: Ask, decision: Decision, now: float) -> Probe | None:
        """What the table says the pick holds of the prompt (weighed against the
        engine's answer at :meth:`complete`), then the pick marked as holding it."""
        if not ask.prefix:
            return None
        chosen = decision.endpoint_id
        probe = self.index.probe(
            ask.prefix, chosen, now, ask.prompt_tokens, decision.held.get(chosen, 0.0)
        )
        self.index.table.record(ask.prefix, chosen, now)
        return probe

    def complete(self, ask: Ask, done: Done, note: object) -> str | None:
        usage = done.usage
        if (
            not isinstance(note, Probe)
            or done.endpoint_id != done.picked  # the probe was the pick's
            or usage is None
            or usage.estimated
            or usage.cached_tokens is None  # absent is not 0: nothing to learn
            or done.status != 200
            or not done.clean
        ):
            return None
        # Blocks marked less than this request's own wait for its first token before it
        # was picked may have been in their first prefill then.
        settle = done.ttft if done.ttft is not None else done.latency
        outcome = self.index.observe(
            done.endpoint_id, note, usage.cached_tokens, usage.prompt_tokens, settle
        )
        if outcome is not None:
            self._predictions.labels(ask.model, outcome).inc()
        return outcome

    def forget(self, endpoint_id: str) -> None:
        self.index.table.forget(endpoint_id)
