"""How big an agent's messages may be: the one home of the bounds (docs/transport.md,
"Trusting agents").

An agent's Register, Heartbeat, ShardStatus and CommandResult are what a node says,
and a node is not trusted to be sane: without bounds one Register of 60,000 GPUs and
3 MB of labels was kept in the inventory (and cost the asyncio thread 8 s to decode).
Each bound is far above what a real node sends (the agent's own limits are named
where they apply) and low enough that a node's record stays small.

:func:`problem` checks a message, as protocol values (:mod:`llmgw.transport.messages`)
or as the protobuf message they mirror (the field names are the same), so the gRPC
transport refuses an oversized message before it spends time converting it and the
controller refuses it whatever the transport.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator, Mapping, Sequence

import attrs

if typing.TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["MAX_MESSAGE_BYTES", "problem"]

#: One message on the wire (the gRPC server's max receive length). grpc's default,
#: stated: a Register with every bound below filled is far smaller.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: GPUs of one node (8 per server is usual; 7 MIG slices of 8 GPUs are 56).
MAX_GPUS = 128
#: Labels of one node; keys as Kubernetes allows (a 253-character prefix and a name).
MAX_LABELS = 64
MAX_LABEL_KEY = 317
MAX_LABEL_VALUE = 1024
#: Fabrics and engines a node names.
MAX_FABRICS = 32
MAX_ENGINES = 32
#: Shards in one report (a Register or a Heartbeat): far more than GPUs, since shards
#: that ended are reported until the server has seen them.
MAX_SHARDS = 512
#: Output lines with a failed shard (the agent keeps 200, each cut at 1,000 characters:
#: llmgw.agent.supervisor) and the length of one.
MAX_TAIL_LINES = 256
MAX_TAIL_LINE = 4096
#: Ports in one shard report (busy_ports).
MAX_PORTS = 64
#: A name or identifier: node id, host name, address, version, GPU uuid and name,
#: fabric, engine, replica id, model, profile, command id (host names are 253 at most).
MAX_NAME = 256
#: Free text: a shard's or a command's message.
MAX_TEXT = 8192
#: A URL (an engine's endpoint_url).
MAX_URL = 2048

#: Lost nodes the inventory keeps (llmgw.control.inventory): beyond, the longest lost
#: are forgotten, so node ids made up by agents that came and went cost no memory for
#: good. A real fleet loses far fewer at once; an operator forgets them anyway.
MAX_LOST_NODES = 1024

# Bounds by "Message.field", the names shared by the protobuf messages and the values.
_COUNTS: dict[str, int] = {
    "NodeInfo.gpus": MAX_GPUS,
    "NodeInfo.labels": MAX_LABELS,
    "NodeInfo.fabrics": MAX_FABRICS,
    "NodeInfo.engines": MAX_ENGINES,
    "Register.shards": MAX_SHARDS,
    "Heartbeat.gpus": MAX_GPUS,
    "Heartbeat.shards": MAX_SHARDS,
    "ShardStatus.output_tail": MAX_TAIL_LINES,
    "ShardStatus.gpu_indices": MAX_GPUS,
    "ShardStatus.busy_ports": MAX_PORTS,
}
_LENGTHS: dict[str, int] = {
    "NodeInfo.labels": MAX_LABEL_VALUE,  # a value; keys are MAX_LABEL_KEY
    "ShardStatus.message": MAX_TEXT,
    "ShardStatus.output_tail": MAX_TAIL_LINE,
    "ShardStatus.endpoint_url": MAX_URL,
    "CommandResult.message": MAX_TEXT,
}
# A repeated field missing from _COUNTS (a new one) gets this many.
_DEFAULT_COUNT = 64


def problem(message: object) -> str | None:
    """What in `message` is over a bound (the first thing found), or None."""
    for found in _problems(message):
        return found
    return None


def _fields(value: object) -> tuple[str, list[tuple[str, object]]] | None:
    """A message's name and its (field, value) pairs; None for a scalar."""
    # Protobuf only when it is loaded (a value cannot be a message otherwise): the control
    # plane imports this module, and `import llmgw` does not load protobuf.
    protobuf = sys.modules.get("google.protobuf.message")
    if protobuf is not None and isinstance(value, protobuf.Message):
        message = typing.cast("Message", value)
        # Only the fields set: ListFields leaves out what is at its default.
        return message.DESCRIPTOR.name, [(f.name, v) for f, v in message.ListFields()]
    cls = type(value)
    if attrs.has(cls):
        return cls.__name__, [(f.name, getattr(value, f.name)) for f in attrs.fields(cls)]
    return None


def _problems(value: object) -> Iterator[str]:
    described = _fields(value)
    if described is None:
        return
    name, fields = described
    for field, item in fields:
        where = f"{name}.{field}"
        limit = _LENGTHS.get(where, MAX_NAME)
        if isinstance(item, str):
            yield from _too_long(where, item, limit)
        elif isinstance(item, Mapping):
            yield from _too_many(where, len(item), _COUNTS.get(where, _DEFAULT_COUNT))
            for key, entry in item.items():
                yield from _too_long(f"{where} key", str(key), MAX_LABEL_KEY)
                if isinstance(entry, str):
                    yield from _too_long(f"{where}[{str(key)[:40]!r}]", entry, limit)
                else:
                    yield from _problems(entry)
        elif isinstance(item, Sequence) and not isinstance(item, bytes):
            yield from _too_many(where, len(item), _COUNTS.get(where, _DEFAULT_COUNT))
            for entry in item:
                if isinstance(entry, str):
                    yield from _too_long(f"{where} entry", entry, limit)
                else:
                    yield from _problems(entry)
        else:
            yield from _problems(item)  # a nested message (a scalar yields nothing)


def _too_many(where: str, count: int, limit: int) -> Iterator[str]:
    if count > limit:
        yield f"{where}: {count} entries, more than the {limit} allowed"


def _too_long(where: str, text: str, limit: int) -> Iterator[str]:
    if len(text) > limit:
        yield f"{where}: {len(text)} characters, more than the {limit} allowed"
