"""The simulator's KV-cache event publisher: what vLLM sends with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``,
on a ZMQ PUB socket, one message per engine step that changed the cache (the wire
format: :mod:`llmgw.domain.kv_events`).

The socket always binds (the engine is the stable side; routers connect), and a
port of ``0`` or ``*`` picks a free one: :attr:`KVPublisher.address` is where it
listens. A PUB socket never blocks a sender: a subscriber that cannot keep up loses
messages (ZMQ's high-water mark), and sees a gap in the sequence numbers.

No replay socket: a router that connects late learns the blocks stored from then on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

from llmgw.domain.kv_events import Event, EventBatch, encode_batch, encode_seq

__all__ = ["KVPublisher"]


class KVPublisher:
    """A bound PUB socket and the sequence numbers of what it sent."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            endpoint = endpoint[:-2] + ":*"
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            self._pub.bind(endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        last = self._pub.getsockopt(zmq.LAST_ENDPOINT)
        self.address = last.decode() if isinstance(last, bytes) else str(last)
        self._topic = topic.encode()
        self._seq = 0
        #: While set, batches are dropped (their sequence numbers used up): the events
        #: "stop" as a dead publisher's would, and a subscriber sees the gap after.
        self.paused = False
        self.sent = 0

    def publish(self, events: Sequence[Event]) -> None:
        if not events:
            return
        seq = self._seq
        self._seq += 1
        if self.paused:
            return
        payload = encode_batch(EventBatch(time.time(), tuple(events), 0))
        try:
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass  # no room: lost, as vLLM's would be past its high-water mark

    def close(self) -> None:
        self._pub.close(linger=0)
        self._ctx.term()
