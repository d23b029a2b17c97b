"""Example budgets of the property tests under the loaded hypothesis profile.

The profiles are registered in tests/conftest.py:

``ci`` (the default, what ``make test`` and CI run): derandomized, so every run draws
the same examples and a property cannot pass on one machine and fail on another; no
example database, so nothing a local run saved changes what CI sees; no deadline and
no too-slow health check, which measure wall time and so fail at random on a loaded
machine.

``fuzz`` (``make fuzz``): random draws, 20 times each test's budget,
and a database under the checkout's ``.hypothesis/`` that replays what failed before.
A counterexample it finds is printed with a reproduction blob; commit it as an
``@example`` next to its property (or, where the property draws interactively, as a
regression test beside it) so the ``ci`` profile runs it from then on.
"""

from __future__ import annotations

from hypothesis import settings


def examples(n: int) -> int:
    """A test's example budget under the loaded profile: ``n`` in ``ci``, scaled by the
    loaded profile's ``max_examples`` against ``ci``'s in another (``fuzz``: 20x).

    Evaluated by the decorator at collection, after pytest has loaded the profile."""
    return n * settings.default.max_examples // settings.get_profile("ci").max_examples
