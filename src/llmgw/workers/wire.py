"""The messages between the control process and a worker, and their framing.

Each message is a msgspec struct, tagged by its class name, encoded as MessagePack
and sent as one frame: a 4-byte big-endian length, then that many bytes. Frames over
:data:`MAX_FRAME` are refused (a worker's metrics are the largest message: tens of
kilobytes). Both ends are llmgw of the same installation (the control process starts
its workers from its own interpreter), so there is no version negotiation.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import trio

from llmgw.domain.endpoints import Endpoint
from llmgw.domain.engine_metrics import EngineSample
from llmgw.domain.usage import UsageRecord

__all__ = [
    "MAX_FRAME",
    "Asleep",
    "Catalog",
    "Channel",
    "Drain",
    "Family",
    "FromWorker",
    "Hello",
    "Listening",
    "Metrics",
    "MetricsAsk",
    "ModelDemand",
    "Passed",
    "Reload",
    "Remove",
    "Report",
    "Samples",
    "Scraped",
    "Stop",
    "ToWorker",
    "Upsert",
    "Usage",
    "Wake",
    "WireError",
    "Woke",
]

#: The largest frame either end accepts (bytes).
MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")


# -- control process -> worker -------------------------------------------------------


class Hello(msgspec.Struct, tag=True, frozen=True):
    """The first message: all a worker needs to start serving."""

    worker: int  # its number, 0..N-1 (in logs)
    config: dict[str, Any]  # the effective configuration, unstructured
    models: list[dict[str, Any]]  # the catalog's models, unstructured
    endpoints: list[Endpoint]  # every endpoint the control plane publishes now
    draining: list[str]  # those of them that take no new requests
    client: list[str]  # the client addresses to bind (HOST:PORT), SO_REUSEPORT
    dashboard: str | None  # the unix socket the /admin pages are forwarded to
    log_level: str
    log_format: str


class Catalog(msgspec.Struct, tag=True, frozen=True):
    models: list[dict[str, Any]]


class Upsert(msgspec.Struct, tag=True, frozen=True):
    endpoint: Endpoint


class Drain(msgspec.Struct, tag=True, frozen=True):
    endpoint_id: str


class Remove(msgspec.Struct, tag=True, frozen=True):
    endpoint_id: str


class Asleep(msgspec.Struct, tag=True, frozen=True):
    """The endpoints the control process holds asleep (all of them: a set, not a
    change)."""

    endpoint_ids: list[str]


class Passed(msgspec.Struct, tag=True, frozen=True):
    """After a control-plane pass: why each model that requests wait for cannot be
    placed (absent: it can, or a replica starts)."""

    unplaceable: dict[str, str]


class Scraped(msgspec.Struct, frozen=True):
    """What the control process's last scrape of one endpoint found."""

    endpoint_id: str
    sample: EngineSample | None
    age: float | None  # seconds since the last successful scrape (None: never)
    error: str | None
    reported_capacity: int | None  # llama.cpp's /props total_slots


class Samples(msgspec.Struct, tag=True, frozen=True):
    """After each of the control process's scrape passes: every endpoint's state."""

    endpoints: list[Scraped]


class MetricsAsk(msgspec.Struct, tag=True, frozen=True):
    seq: int


class Reload(msgspec.Struct, tag=True, frozen=True):
    """SIGHUP reached the control process: read the TLS files again."""


class Stop(msgspec.Struct, tag=True, frozen=True):
    """Stop accepting, let what is in flight finish (router.drain_timeout), exit."""


ToWorker = (
    Hello
    | Catalog
    | Upsert
    | Drain
    | Remove
    | Asleep
    | Passed
    | Samples
    | MetricsAsk
    | Reload
    | Stop
)


# -- worker -> control process -------------------------------------------------------


class Listening(msgspec.Struct, tag=True, frozen=True):
    addresses: list[str]


class Usage(msgspec.Struct, tag=True, frozen=True):
    records: list[UsageRecord]


class ModelDemand(msgspec.Struct, frozen=True):
    inflight: int
    queued: int
    saturation: float
    serving: int
    cold_waiting: int  # requests waiting for a first replica (wake on request)


class Report(msgspec.Struct, tag=True, frozen=True):
    """A worker's state, sent every REPORT_EVERY seconds."""

    models: dict[str, ModelDemand]
    # Per endpoint: requests in flight, and seconds since an attempt last ended there
    # (None: none yet). Seconds, not times: each process has its own clock.
    endpoints: dict[str, tuple[int, float | None]]
    admission: dict[str, Any]  # AdmissionController.snapshot()


class Wake(msgspec.Struct, tag=True, frozen=True):
    """A request waits for `model`, which has no replica: start one."""

    model: str


class Woke(msgspec.Struct, tag=True, frozen=True):
    """The worker woke a sleeping endpoint (its next request did)."""

    endpoint_id: str


class Family(msgspec.Struct, frozen=True):
    """A metric family as prometheus-client collects it."""

    name: str
    documentation: str
    type: str
    unit: str
    samples: list[tuple[str, dict[str, str], float]]  # (sample name, labels, value)


class Metrics(msgspec.Struct, tag=True, frozen=True):
    seq: int
    families: list[Family]


FromWorker = Listening | Usage | Report | Wake | Woke | Metrics


# -- framing -----------------------------------------------------------------------


class WireError(Exception):
    """The peer sent something that is no frame of this protocol, or went away."""


class Channel:
    """Frames over a stream, decoded as `incoming`; one sender at a time."""

    def __init__(self, stream: trio.abc.Stream, incoming: Any) -> None:
        self.stream = stream
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(incoming)
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    async def send(self, message: msgspec.Struct) -> None:
        body = self._encoder.encode(message)
        if len(body) > MAX_FRAME:
            raise WireError(f"{type(message).__name__} of {len(body)} bytes is over a frame")
        async with self._send_lock:
            await self.stream.send_all(_LENGTH.pack(len(body)) + body)

    async def receive(self) -> Any:
        """The next message; WireError at the end of the stream or on a bad frame."""
        head = await self._read(_LENGTH.size)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_FRAME:
            raise WireError(f"a frame of {length} bytes is over the limit")
        body = await self._read(length)
        try:
            return self._decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise WireError(f"undecodable frame: {exc}") from None

    async def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            try:
                chunk = await self.stream.receive_some(max(65536, count - len(self._buffer)))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise WireError(f"the peer went away: {exc}") from None
            if not chunk:
                raise WireError("the peer closed the channel")
            self._buffer += chunk
        out = bytes(self._buffer[:count])
        del self._buffer[:count]
        return out

    async def aclose(self) -> None:
        await self.stream.aclose()
