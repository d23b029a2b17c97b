"""The simulator's KV-cache event publisher: what vLLM sends with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``,
on a ZMQ PUB socket, one message per engine step that changed the cache (the wire
format: :mod:`llmgw.domain.kv_events`).

The socket always binds (the engine is the stable side; routers connect), and a
port of ``0`` or ``*`` picks a free one: :attr:`KVPublisher.address` is where it
listens. A PUB socket never blocks a sender: a subscriber that cannot keep up loses
messages (ZMQ's high-water mark), and sees a gap in the sequence numbers.

With a replay address, a ROUTER socket serves what vLLM's does: a client (a DEALER,
or a REQ) sends a sequence number (8 bytes, big-endian) and is sent every batch still
buffered from that number on, each as (sequence number, payload), then the end
marker (-1, empty); :meth:`KVPublisher.serve_replay` answers, in the trio loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import zmq

from llmgw.domain.kv_events import (
    END_SEQ,
    SEQ_BYTES,
    Event,
    EventBatch,
    encode_batch,
    encode_seq,
)
from llmgw.zmqio import recv_multipart

#: Batches kept for replay (vLLM's buffer_steps default).
REPLAY_STEPS = 10_000


def _any_port(endpoint: str) -> str:
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


def _bound(sock: zmq.Socket[bytes]) -> str:
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


__all__ = ["KVPublisher"]


class KVPublisher:
    """A bound PUB socket and the sequence numbers of what it sent."""

    def __init__(self, endpoint: str, topic: str = "", replay: str | None = None) -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.bind(_any_port(endpoint))
            if replay is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(_any_port(replay))
        except zmq.ZMQError:
            self.close()
            raise
        self.address = _bound(self._pub)
        self.replay_address = None if self._replay is None else _bound(self._replay)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_STEPS)
        self._topic = topic.encode()
        self._seq = 0
        #: While set, batches are not sent (their sequence numbers used up; they stay
        #: in the replay buffer, as messages lost on the way would): the events "stop"
        #: as a dead publisher's would, and a subscriber sees the gap after.
        self.paused = False
        self.sent = 0

    def publish(self, events: Sequence[Event]) -> None:
        if not events:
            return
        seq = self._seq
        self._seq += 1
        payload = encode_batch(EventBatch(time.time(), tuple(events), 0))
        if self._replay is not None:
            self._buffer.append((seq, payload))
        if self.paused:
            return
        try:
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass  # no room: lost, as vLLM's would be past its high-water mark

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled (returns at once without a replay
        socket)."""
        sock = self._replay
        if sock is None:
            return
        while True:
            frames = await recv_multipart(sock)
            if len(frames) != 3 or len(frames[2]) != SEQ_BYTES:
                continue  # (client id, empty delimiter, start): nothing else is asked
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    sock.send_multipart((client, b"", encode_seq(seq), payload), zmq.NOBLOCK)
            sock.send_multipart((client, b"", END_SEQ, b""), zmq.NOBLOCK)

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
