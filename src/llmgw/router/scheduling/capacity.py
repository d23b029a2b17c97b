"""Learning how many sequences an engine runs at once, from what it reports.

Where nothing says a replica's capacity (no launch flag the control plane saw, no
``capacity`` on the endpoint, no llama.cpp ``/props``), the router learns it from the
engine's own queue, scrape by scrape (:func:`learn`):

* **The engine holds a queue while its KV cache has room** (``waiting >=
  target_waiting``, KV below its ceiling or unreported): it is at its batch limit, so
  the number it runs is its capacity: ``capacity = running``.
* **It ran all we sent near the learned capacity without queueing** (``waiting == 0``
  and the load at the scrape at least :data:`NEAR` of it): the capacity was learned
  low (a passing burst, or the engine was reconfigured), so it **doubles**. A low
  guess holds traffic back for a few scrapes at most, never for good.
* Otherwise it stays as it is. Before the engine first queues, it is unknown: nothing
  caps a replica that has never said it is full.

A KV cache at its ceiling is its own saturation signal and teaches nothing about the
batch limit, so it is left alone then. Pure: the scraper calls it with each sample.
"""

from __future__ import annotations

__all__ = ["NEAR", "learn"]

# "At the learned capacity": the load of the default band's ceiling (0.85) and up.
NEAR = 0.8


def learn(
    learned: float | None,
    *,
    running: float | None,
    waiting: float | None,
    kv_usage: float | None,
    load: float,
    target_waiting: float,
    kv_ceiling: float,
) -> float | None:
    """The capacity after one scrape (see the module docstring); `load` is the larger
    of the engine's running + waiting and the router's own in-flight count then."""
    if running is None or waiting is None:
        return learned
    if kv_usage is not None and kv_usage >= kv_ceiling:
        return learned
    if waiting >= target_waiting and running >= 1:
        return float(running)
    if learned is not None and waiting == 0 and load >= NEAR * learned:
        return 2 * learned
    return learned
