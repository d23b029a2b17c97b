"""The engine driver: one task runs the pure :class:`~llmgw.sim.model.Engine` in real
(trio) time and hands each token to the request waiting for it."""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from llmgw.sim.metrics import Recorder
from llmgw.sim.model import Engine, Finished, Request, Token

Output = Token | Finished


class EngineDriver:
    """Runs the engine in real (trio) time and routes its tokens to their requests."""

    def __init__(self, engine: Engine, recorder: Recorder) -> None:
        self.engine = engine
        self.recorder = recorder
        self._outputs: dict[str, trio.MemorySendChannel[Output]] = {}
        self._reasons: dict[str, str] = {}
        self._last_token_at: dict[str, float] = {}
        self._wake = trio.Event()
        #: Called after every step (the KV-cache events go out then), if set.
        self.after_step: Callable[[], None] | None = None

    def submit(self, request: Request, finish_reason: str) -> trio.MemoryReceiveChannel[Output]:
        """Queue `request`; its tokens, then its Finished, arrive on the returned channel."""
        self.engine.add(request, trio.current_time())  # ValueError for impossible requests
        send, receive = trio.open_memory_channel[Output](math.inf)
        self._outputs[request.request_id] = send
        self._reasons[request.request_id] = finish_reason
        self._wake.set()
        return receive

    def abort(self, request_id: str) -> None:
        """Forget a request and free its KV blocks now (no-op once it has finished)."""
        if self.engine.abort(request_id):
            self.recorder.finished["abort"] += 1
        self._reasons.pop(request_id, None)
        self._last_token_at.pop(request_id, None)
        channel = self._outputs.pop(request_id, None)
        if channel is not None:
            channel.close()

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            step = self.engine.begin_step(now)
            if step is None:
                wake_at = self.engine.next_wakeup(now)
                with trio.move_on_at(math.inf if wake_at is None else wake_at):
                    await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.sleep_until(step.ends)
            now = trio.current_time()
            outcome = self.engine.end_step(now)
            if self.after_step is not None:
                self.after_step()
            rec = self.recorder
            rec.stepped(outcome.step)
            for latency in outcome.first_token_latencies:
                rec.ttft.observe(latency)
            if outcome.tokens:
                rec.generated(now, len(outcome.tokens))
            for token in outcome.tokens:
                rid = token.request_id
                last = self._last_token_at.get(rid)
                if last is not None:
                    rec.itl.observe(now - last)
                self._last_token_at[rid] = now
                self._deliver(rid, token, last=False)
            for done in outcome.finished:
                rid = done.request_id
                rec.e2e.observe(done.finished_at - done.arrival)
                rec.sequence_done(done)
                rec.finished[self._reasons.pop(rid, "length")] += 1
                self._last_token_at.pop(rid, None)
                self._deliver(rid, done, last=True)

    def _deliver(self, request_id: str, output: Output, last: bool) -> None:
        channel = self._outputs.pop(request_id, None) if last else self._outputs.get(request_id)
        if channel is None:
            return
        try:
            channel.send_nowait(output)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The handler is gone without aborting; never let that stop the engine.
            self.abort(request_id)
        if last:
            channel.close()
