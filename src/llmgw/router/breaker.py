"""Per-endpoint circuit breaker and the classification of request outcomes.

States (DESIGN §4.7)::

    closed --(threshold consecutive failures)--> open --(cooldown passes)--> half_open
    half_open --(the one probe succeeds)--> closed
    half_open --(the probe fails)--> open (another cooldown)

Open and half-open are told apart by time alone (`now` is passed in, no clock is
read). Every request takes a :class:`Ticket` with :meth:`Breaker.acquire` and hands it
back with exactly one of :meth:`~Breaker.success`, :meth:`~Breaker.failure`,
:meth:`~Breaker.release` (or :meth:`~Breaker.record` with an :class:`Outcome`). The
ticket is what makes the rules hold under concurrency:

* a result counts only for the breaker "epoch" it was issued in. The epoch advances
  each time the breaker opens, so requests still in flight when it tripped
  (stragglers) can neither extend the cooldown nor close a half-open breaker;
* in half-open only the current probe's result decides. :meth:`~Breaker.release`
  gives the probe slot back when the probe ended without a verdict (the client went
  away, a 429), so half-open can never get stuck;
* the probe may report success as soon as the engine answered (response headers),
  and a later failure of the same request (a broken stream) still counts, against
  the now closed breaker.

What counts as a failure is :func:`verdict` of an :class:`Outcome`: the replica's
fault (cannot connect, a phase deadline passed, a 5xx other than 501, a stream that
broke, an answer that broke HTTP/1.1 or a size limit) is a failure; the request's
fault (4xx) proves the replica alive and is a success; 429 and a client that went
away give no verdict. A 429 does not open the breaker, but :meth:`Breaker.rate_limited`
remembers it for its ``Retry-After`` (or a default hold) and :meth:`Breaker.throttled`
tells the scorer, which treats the replica as saturated (used only when nothing
unsaturated is left) and scores it down.
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "Breaker",
    "BreakerState",
    "Outcome",
    "Ticket",
    "Verdict",
    "classify_status",
    "counts_as_failure",
    "verdict",
]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(enum.Enum):
    """How one attempt against one endpoint ended, as seen by the proxy."""

    OK = "ok"  # 1xx-3xx
    CLIENT_ERROR = "client_error"  # 4xx other than 408 and 429: the request is at fault
    RATE_LIMITED = "rate_limited"  # 429: alive but full
    NOT_IMPLEMENTED = "not_implemented"  # 501: this engine lacks the route, it is not broken
    SERVER_ERROR = "server_error"  # other 5xx
    CONNECT_ERROR = "connect_error"  # DNS, refused, reset or TLS failure before a response
    TIMEOUT = "timeout"  # any phase deadline (dial .. total), and an engine's 408
    BROKEN_STREAM = "broken_stream"  # the body ended early or the connection dropped mid-stream
    # The answer broke HTTP/1.1 (RFC 9112) or one of llmgw's limits on it (head, body,
    # SSE event sizes); its connection is discarded.
    BAD_RESPONSE = "bad_response"
    CLIENT_GONE = "client_gone"  # the client disconnected: says nothing about the replica


class Verdict(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    NONE = "none"


_VERDICTS = {
    Outcome.OK: Verdict.SUCCESS,
    Outcome.CLIENT_ERROR: Verdict.SUCCESS,
    Outcome.NOT_IMPLEMENTED: Verdict.SUCCESS,
    Outcome.RATE_LIMITED: Verdict.NONE,
    Outcome.CLIENT_GONE: Verdict.NONE,
    Outcome.SERVER_ERROR: Verdict.FAILURE,
    Outcome.CONNECT_ERROR: Verdict.FAILURE,
    Outcome.TIMEOUT: Verdict.FAILURE,
    Outcome.BROKEN_STREAM: Verdict.FAILURE,
    Outcome.BAD_RESPONSE: Verdict.FAILURE,
}


def classify_status(status: int) -> Outcome:
    """The outcome of an engine's HTTP status code."""
    if status == 429:
        return Outcome.RATE_LIMITED
    if status == 408:
        return Outcome.TIMEOUT
    if status == 501:
        return Outcome.NOT_IMPLEMENTED
    if status >= 500:
        return Outcome.SERVER_ERROR
    if status >= 400:
        return Outcome.CLIENT_ERROR
    return Outcome.OK


def verdict(outcome: Outcome) -> Verdict:
    """What `outcome` means for the endpoint's breaker."""
    return _VERDICTS[outcome]


def counts_as_failure(outcome: Outcome) -> bool:
    return _VERDICTS[outcome] is Verdict.FAILURE


@attrs.frozen
class Ticket:
    """Issued by :meth:`Breaker.acquire`; return it with one outcome call."""

    epoch: int
    # 0 for an ordinary request, else the serial of the half-open probe slot it holds.
    probe: int = 0

    @property
    def is_probe(self) -> bool:
        return self.probe != 0


class Breaker:
    """Circuit breaker of one endpoint. Owned by that endpoint's state; not thread-safe.

    `probe_timeout` (None = never) frees a probe slot that was never handed back, as
    a guard against a leaked ticket; set it above the longest time a probe can take to
    reach its verdict (dial + response_header deadlines). A probe that outlives it is
    ignored when it finally reports.
    """

    __slots__ = (
        "_default_hold",
        "_epoch",
        "_failures",
        "_max_hold",
        "_open_until",
        "_probe",
        "_probe_since",
        "_serial",
        "_throttled_until",
        "cooldown",
        "probe_timeout",
        "threshold",
    )

    def __init__(
        self,
        threshold: int,
        cooldown: float,
        *,
        probe_timeout: float | None = None,
        rate_limit_hold: float = 1.0,
        max_rate_limit_hold: float = 30.0,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1, got {threshold}")
        if cooldown <= 0:
            raise ValueError(f"cooldown must be positive, got {cooldown}")
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self._default_hold = rate_limit_hold
        self._max_hold = max_rate_limit_hold
        self._epoch = 0
        self._failures = 0
        self._open_until: float | None = None  # None: closed
        self._probe = 0  # serial of the outstanding probe, 0 = slot free
        self._probe_since = 0.0
        self._serial = 0
        self._throttled_until = float("-inf")

    # -- queries --------------------------------------------------------------

    def state(self, now: float) -> BreakerState:
        if self._open_until is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if now < self._open_until else BreakerState.HALF_OPEN

    def allows(self, now: float) -> bool:
        """Whether :meth:`acquire` would hand out a ticket now (no side effects)."""
        if self._open_until is None:
            return True
        return now >= self._open_until and self._probe_free(now)

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def retry_at(self) -> float | None:
        """When an open breaker turns half-open (for ``Retry-After``); None when closed."""
        return self._open_until

    def throttled(self, now: float) -> bool:
        """Whether the endpoint answered 429 recently enough to count as saturated."""
        return now < self._throttled_until

    # -- transitions ----------------------------------------------------------

    def acquire(self, now: float) -> Ticket | None:
        """A ticket for one attempt, or None when the breaker keeps the endpoint out.

        In half-open this takes the single probe slot (``ticket.is_probe``).
        """
        if self._open_until is None:
            return Ticket(self._epoch)
        if now < self._open_until or not self._probe_free(now):
            return None
        self._serial += 1
        self._probe = self._serial
        self._probe_since = now
        return Ticket(self._epoch, self._probe)

    def success(self, ticket: Ticket, now: float) -> BreakerState | None:
        """Record a success; returns the state entered, or None when nothing changed."""
        if ticket.epoch != self._epoch:
            return None  # issued before the breaker last opened
        if self._open_until is None:
            self._failures = 0
            return None
        if ticket.probe != self._probe or not ticket.is_probe:
            return None  # an abandoned or timed-out probe: the current one decides
        self._open_until = None
        self._probe = 0
        self._failures = 0
        return BreakerState.CLOSED

    def failure(self, ticket: Ticket, now: float) -> BreakerState | None:
        """Record a failure; returns BreakerState.OPEN when this opened it, else None."""
        if ticket.epoch != self._epoch:
            return None
        if self._open_until is None:
            self._failures += 1
            if self._failures < self.threshold:
                return None
        elif ticket.probe != self._probe or not ticket.is_probe:
            return None
        self._trip(now)
        return BreakerState.OPEN

    def release(self, ticket: Ticket, now: float) -> None:
        """Hand a ticket back without a verdict: frees the probe slot if it held it."""
        if ticket.is_probe and ticket.epoch == self._epoch and ticket.probe == self._probe:
            self._probe = 0

    def rate_limited(self, ticket: Ticket, now: float, retry_after: float | None = None) -> None:
        """The engine answered 429: no verdict, but avoid it for `retry_after` seconds."""
        self.release(ticket, now)
        hold = self._default_hold if retry_after is None or retry_after < 0 else retry_after
        self._throttled_until = max(self._throttled_until, now + min(hold, self._max_hold))

    def record(
        self, ticket: Ticket, outcome: Outcome, now: float, *, retry_after: float | None = None
    ) -> BreakerState | None:
        """Dispatch `outcome` to success / failure / release; returns the state entered."""
        v = _VERDICTS[outcome]
        if v is Verdict.SUCCESS:
            return self.success(ticket, now)
        if v is Verdict.FAILURE:
            return self.failure(ticket, now)
        if outcome is Outcome.RATE_LIMITED:
            self.rate_limited(ticket, now, retry_after)
        else:
            self.release(ticket, now)
        return None

    def reset(self) -> None:
        """Close the breaker at once (an operator's action); outstanding tickets lapse."""
        self._epoch += 1
        self._open_until = None
        self._probe = 0
        self._failures = 0

    # -- internals ------------------------------------------------------------

    def _probe_free(self, now: float) -> bool:
        if self._probe == 0:
            return True
        return self.probe_timeout is not None and now - self._probe_since >= self.probe_timeout

    def _trip(self, now: float) -> None:
        self._epoch += 1
        self._open_until = now + self.cooldown
        self._probe = 0
        self._failures = 0
