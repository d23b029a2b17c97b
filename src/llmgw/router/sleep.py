"""Sleeping engines: idle replicas give back their GPU memory and wake in seconds.

An endpoint with ``sleep_after`` (its deployment profile's, for the engines the router
sleeps: vLLM and llmgw-sim, llmgw.domain.engines) that has had nothing in flight for that
long is put to sleep: ``POST /sleep?level=1`` (vLLM's level 1: weights to CPU memory,
the KV cache dropped). It keeps its GPUs and stays routable: the next attempt routed
to it first wakes it (``POST /wake_up``) and then sends the request, so a request
pays the wake (seconds) instead of a cold start (minutes).

The sleep and the wake of one endpoint take turns on its lock. An endpoint is marked
asleep *before* its sleep call goes out, so an attempt that arrives meanwhile waits
for the call and then wakes it; an attempt in flight keeps it awake (the sleeper only
looks at endpoints with nothing in flight). A sleep call that fails leaves the
endpoint awake (and tried again after another ``sleep_after``); a wake that fails is
the attempt's failure (retried elsewhere, counted by the breaker), and the endpoint
stays asleep, to be woken by the next attempt.

llama.cpp sleeps on its own (``--sleep-idle-seconds``) and wakes at its next request:
the router has nothing to do for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from llmgw.http.client import UpstreamError
from llmgw.http.engine_client import EngineClient
from llmgw.router.breaker import Outcome
from llmgw.router.endpoints import EndpointRegistry, EndpointState
from llmgw.router.metrics import RouterMetrics
from llmgw.router.proxy import AttemptFailed

__all__ = ["CHECK_EVERY", "Sleeper"]

log = logging.getLogger("llmgw.router")

#: How often idle endpoints are looked for (seconds): a sleep comes at most this late.
CHECK_EVERY = 1.0
#: A sleep call's deadline (vLLM copies the weights to CPU memory: seconds for a large
#: model).
SLEEP_TIMEOUT = 120.0
#: A wake call's deadline (the weights back to the GPUs).
WAKE_TIMEOUT = 120.0
#: An answer to a sleep or wake call is read this far, no further (vLLM's is empty).
_ANSWER_BYTES = 65536


class Sleeper:
    def __init__(
        self,
        endpoints: EndpointRegistry,
        metrics: RouterMetrics,
        *,
        client: EngineClient,
        on_woke: Callable[[EndpointState], None] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.metrics = metrics
        self.client = client
        self.on_woke = on_woke

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Put idle endpoints to sleep until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                now = trio.current_time()
                for state in self.endpoints.all():
                    if self._idle(state, now):
                        # Marked now, synchronously: no attempt can slip in before.
                        state.asleep = True
                        nursery.start_soon(self._sleep, state)
                await trio.sleep(CHECK_EVERY)

    def _idle(self, state: EndpointState, now: float) -> bool:
        after = state.endpoint.sleep_after
        if after is None or state.asleep or state.draining or state.inflight:
            return False
        if state.used_at is None:  # never used: idle since the router first saw it
            state.used_at = now
        return now - state.used_at >= after

    async def _sleep(self, state: EndpointState) -> None:
        model = state.endpoint.models[0]
        async with state.sleep_lock:
            try:
                with trio.fail_after(SLEEP_TIMEOUT):
                    status, _ = await self.client.fetch(
                        "POST",
                        f"{state.endpoint.url.rstrip('/')}/sleep?level=1",
                        state.endpoint.headers,
                        body=b"",
                        limit=_ANSWER_BYTES,
                    )
                failed = None if status == 200 else f"answered {status}"
            except trio.TooSlowError:
                failed = f"no answer within {SLEEP_TIMEOUT:g}s"
            except UpstreamError as exc:
                failed = str(exc)
            if failed is not None:
                state.asleep = False
                state.used_at = trio.current_time()  # try again after another sleep_after
                self.metrics.sleeps.labels(model, "sleep_failed").inc()
                log.warning("endpoint %s did not go to sleep: %s", state.endpoint.id, failed)
                return
            self.metrics.sleeps.labels(model, "sleep").inc()
            log.info(
                "endpoint %s is asleep (idle for %gs)",
                state.endpoint.id,
                state.endpoint.sleep_after,
            )

    async def wake(self, state: EndpointState) -> None:
        """Wake `state`'s engine if it sleeps; raises AttemptFailed when it does not
        wake. Called by an attempt, with the attempt counted in flight."""
        if not state.asleep:
            return
        model = state.endpoint.models[0]
        async with state.sleep_lock:
            if not state.asleep:  # another attempt woke it meanwhile
                return
            started = trio.current_time()
            try:
                with trio.fail_after(WAKE_TIMEOUT):
                    status, _ = await self.client.fetch(
                        "POST",
                        f"{state.endpoint.url.rstrip('/')}/wake_up",
                        state.endpoint.headers,
                        body=b"",
                        limit=_ANSWER_BYTES,
                    )
            except trio.TooSlowError:
                self.metrics.sleeps.labels(model, "wake_failed").inc()
                raise AttemptFailed(
                    Outcome.TIMEOUT, f"did not wake within {WAKE_TIMEOUT:g}s", phase="wake"
                ) from None
            except UpstreamError as exc:  # its message names no address: it may reach clients
                self.metrics.sleeps.labels(model, "wake_failed").inc()
                raise AttemptFailed(
                    Outcome.CONNECT_ERROR, f"could not be woken: {exc}", phase="wake"
                ) from None
            if status != 200:
                self.metrics.sleeps.labels(model, "wake_failed").inc()
                raise AttemptFailed(
                    Outcome.SERVER_ERROR,
                    f"could not be woken: /wake_up answered {status}",
                    phase="wake",
                    status=status,
                )
            state.asleep = False
            if self.on_woke is not None:
                self.on_woke(state)
            self.metrics.sleeps.labels(model, "wake").inc()
            self.metrics.wake.labels(model).observe(trio.current_time() - started)
            log.info("endpoint %s woke in %.2fs", state.endpoint.id, trio.current_time() - started)
