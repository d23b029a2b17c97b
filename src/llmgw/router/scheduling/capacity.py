"""Learning how many sequences an engine runs at once, from what it reports.

Where nothing says a replica's capacity (no launch flag the control plane saw, no
``capacity`` on the endpoint, no llama.cpp ``/props``), the router learns it from the
engine's own queue, scrape by scrape (:func:`learn`), in the manner of TCP's
congestion window:

* **First**, the engine holds a real queue while its KV cache has room (``waiting >=
  target_waiting``, KV below its ceiling or unreported) in two scrapes in a row: it is
  at its batch limit, so the number it runs is its capacity. One such scrape may be a
  burst that arrived between two engine steps, or an engine behind on its own steps
  for a moment; a queue that is still there a scrape later is not. Before that it is
  unknown, and nothing caps a replica that has never said it is full.
* **Near the learned capacity** (the load at the scrape at least :data:`NEAR` of it,
  which is where the router holds traffic once it knows one):

  - any queue means the router sent past the limit: it comes down to what the
    engine runs, by at most :data:`DECAY` a scrape (one scrape can catch the engine
    between finishing some sequences and starting the queued ones, running fewer
    than it can);
  - no queue means it may have more room than learned: the capacity grows by
    :data:`GROWTH`, and the growth doubles with each such scrape in a row (10 %,
    20 %, 40 %, ...), so a guess learned low from a passing burst recovers in a few
    scrapes while probing past a real limit costs an engine queue of about a tenth
    of its batch for one scrape.

* A real queue (``waiting >= target_waiting``) anywhere also brings it down that way.
  While it comes down, the queue itself keeps the replica saturated (its queue term),
  so admission holds traffic back meanwhile.

A KV cache at its ceiling is its own saturation signal and teaches nothing about the
batch limit, so it is left alone then. Pure: the scraper calls it with each sample.
"""

from __future__ import annotations

import attrs

__all__ = ["DECAY", "GROWTH", "NEAR", "Learned", "learn"]

# "At the learned capacity": the load of the default band's ceiling (0.85) and up.
NEAR = 0.8
GROWTH = 0.1
DECAY = 0.1


@attrs.frozen
class Learned:
    capacity: float | None  # None: one queued scrape seen, not learned yet
    # Scrapes in a row near the capacity with no queue (how fast it grows).
    streak: int = 0


def learn(
    learned: Learned | None,
    *,
    running: float | None,
    waiting: float | None,
    kv_usage: float | None,
    load: float,
    target_waiting: float,
    kv_ceiling: float,
) -> Learned | None:
    """The capacity after one scrape (see the module docstring); `load` is the larger
    of the engine's running + waiting and the router's own in-flight count then."""
    if running is None or waiting is None:
        return learned
    if kv_usage is not None and kv_usage >= kv_ceiling:
        return learned
    queued = waiting >= target_waiting and running >= 1
    if learned is None or learned.capacity is None:
        if not queued:
            return None
        return Learned(float(running)) if learned is not None else Learned(None)
    near = load >= NEAR * learned.capacity
    if queued or (near and waiting > 0 and running >= 1):
        return Learned(max(float(running), (1 - DECAY) * learned.capacity))
    if not near:
        return learned
    grown = learned.capacity * (1 + GROWTH * 2**learned.streak)
    return Learned(max(grown, learned.capacity + 1), learned.streak + 1)
