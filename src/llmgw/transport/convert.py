"""The agent protocol's Python values (:mod:`llmgw.transport.messages`) to and from
protobuf (``proto/llmgw/agent/v1/agent.proto``).

The two schemas mirror each other field for field, by name, so the mapping is
structural rather than written out per field:

    value --cattrs unstructure--> dict --json_format.ParseDict--> protobuf
    protobuf --json_format.MessageToDict--> dict --cattrs structure--> value

Only what the proto3 JSON mapping spells differently from a plain unstructured
value is adapted, in one place each:

* enums: ``ShardState.READY`` is ``"SHARD_STATE_READY"`` (the buf enum-prefix rule);
  the ``_UNSPECIFIED`` zero is refused, since a peer that never set it said nothing;
* durations: seconds as a float are ``google.protobuf.Duration``; found by walking
  the message descriptor, so a new Duration field needs no code here. A duration
  round-trips exactly when it is a whole number of nanoseconds (Duration's grain);
* optional fields: None is "absent" both ways (ParseDict clears a field set to
  None; MessageToDict leaves unset ``optional`` fields out, so the attrs default,
  None, applies);
* non-finite floats are the strings ``"Infinity"``, ``"-Infinity"``, ``"NaN"``;
* tuples are sent as lists, which ParseDict insists on.

Mismatches between the schemas fail loudly: ParseDict rejects a field the proto
lacks and the converter forbids a key the attrs class lacks, and a union member
without a oneof field is an import-time error.
"""

from __future__ import annotations

import enum
import functools
import math
import re
import typing
from collections.abc import Callable
from typing import Any

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from llmgw.domain.catalog import DeploymentProfile
from llmgw.transport.messages import AgentMessage, ServerMessage
from llmgw.transport.pb import agent_pb2 as pb

__all__ = [
    "ConversionError",
    "UnknownMessage",
    "agent_message_from_proto",
    "agent_message_to_proto",
    "from_proto",
    "server_message_from_proto",
    "server_message_to_proto",
    "to_proto",
]

T = typing.TypeVar("T")

_DURATION = "google.protobuf.Duration"
_PAYLOAD = "payload"


class ConversionError(ValueError):
    """A value that has no protobuf form, or a protobuf message that is no valid value."""


class UnknownMessage(ConversionError):
    """A stream message with no payload this version knows: empty, or a newer peer's.

    Transports may skip these instead of failing the stream (forward compatibility)."""


# -- enums -----------------------------------------------------------------------


def _enum_prefix(cls: type[enum.Enum]) -> str:
    # ShardState -> "SHARD_STATE_": buf's ENUM_VALUE_PREFIX rule names the values so.
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper() + "_"


def _unstructure_enum(value: enum.Enum) -> str:
    return _enum_prefix(type(value)) + value.name


def _structure_enum(data: object, cls: type[enum.Enum]) -> enum.Enum:
    prefix = _enum_prefix(cls)
    if isinstance(data, str) and data.startswith(prefix):
        member = cls.__members__.get(data.removeprefix(prefix))
        if member is not None:
            return member
    # An int here is a value newer than this code; UNSPECIFIED is a peer that set nothing.
    raise ValueError(f"{data!r} is no {cls.__name__}")


# -- floats -----------------------------------------------------------------------


def _unstructure_float(value: float) -> float | str:
    # The JSON mapping spells the non-finite doubles as strings; ParseDict insists.
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


# -- durations ---------------------------------------------------------------------


def _seconds_to_json(seconds: object) -> object:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        # Nine decimals are Duration's grain; the JSON form keeps the decimal exact.
        return f"{seconds:.9f}s"
    return seconds  # ParseDict reports anything else against its field


def _seconds_from_json(text: object) -> object:
    if isinstance(text, str) and text.endswith("s"):
        return float(text[:-1])
    return text


@functools.cache
def _has_duration(descriptor: Descriptor) -> bool:
    return any(
        f.message_type is not None
        and (f.message_type.full_name == _DURATION or _has_duration(f.message_type))
        for f in descriptor.fields
    )


def _map_durations(
    data: dict[str, Any], descriptor: Descriptor, fn: Callable[[object], object]
) -> None:
    """Apply `fn` in place to every Duration field's JSON value under `data`."""
    for field in descriptor.fields:
        kind = field.message_type
        value = data.get(field.name)
        if (
            kind is None
            or value is None
            or not (kind.full_name == _DURATION or _has_duration(kind))
        ):
            continue
        if kind.GetOptions().map_entry:
            value_kind = kind.fields_by_name["value"].message_type
            if value_kind is not None:
                items = value.items() if isinstance(value, dict) else ()
                for key, item in items:
                    if value_kind.full_name == _DURATION:
                        value[key] = fn(item)
                    elif isinstance(item, dict):
                        _map_durations(item, value_kind, fn)
        elif field.is_repeated:
            if isinstance(value, list):
                if kind.full_name == _DURATION:
                    data[field.name] = [fn(item) for item in value]
                else:
                    for item in value:
                        if isinstance(item, dict):
                            _map_durations(item, kind, fn)
        elif kind.full_name == _DURATION:
            data[field.name] = fn(value)
        elif isinstance(value, dict):
            _map_durations(value, kind, fn)


# -- the converter -------------------------------------------------------------------

# The agent protocol's own converter, not the configuration's or the views': it maps
# values field by field onto protobuf messages (durations as google.protobuf.Duration,
# a profile's api_key never sent), and what it structures comes from a peer's protobuf
# decoder, not from a person: its errors are one line for the log, not keys to fix.
# forbid_extra_keys: a proto field the attrs class lacks is a schema mismatch, not noise
# (a newer peer's unknown fields never reach here: the protobuf decoder drops them).
_converter = cattrs.Converter(unstruct_collection_overrides={tuple: list}, forbid_extra_keys=True)
_converter.register_unstructure_hook_func(
    lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _unstructure_enum
)
_converter.register_unstructure_hook(float, _unstructure_float)
#: Fields of values that never cross the agent link. A profile's api_key: the reconciler
#: has put it into the engine's environment (the proto's `env`), all the agent needs.
NOT_SENT: dict[type, frozenset[str]] = {DeploymentProfile: frozenset({"api_key"})}
_converter.register_unstructure_hook(
    DeploymentProfile,
    make_dict_unstructure_fn(DeploymentProfile, _converter, api_key=override(omit=True)),
)
_converter.register_structure_hook(
    DeploymentProfile,
    make_dict_structure_fn(DeploymentProfile, _converter, api_key=override(omit=True)),
)
_converter.register_structure_hook_func(
    lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _structure_enum
)


def _descriptor(message: Message | type[Message]) -> Descriptor:
    # The stubs type DESCRIPTOR as the pure-Python or the upb class; both behave the same.
    return typing.cast(Descriptor, message.DESCRIPTOR)


def _print(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        # Fields without presence are printed at their zero so a required attrs field
        # (memory_total, ok, ...) holding 0 or "" is not mistaken for a missing one.
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )


def _proto_class(cls: type) -> type[Message]:
    proto_cls = getattr(pb, cls.__name__, None)
    if not (isinstance(proto_cls, type) and issubclass(proto_cls, Message)):
        raise TypeError(f"{cls.__name__} has no message of that name in agent.proto")
    return proto_cls


def _to_json(value: object) -> dict[str, Any]:
    data = _converter.unstructure(value)
    if not isinstance(data, dict):
        raise ConversionError(f"{type(value).__name__} is not a protocol value")
    _map_durations(data, _descriptor(_proto_class(type(value))), _seconds_to_json)
    return data


def _from_json(data: dict[str, Any], cls: type[T], descriptor: Descriptor) -> T:
    _map_durations(data, descriptor, _seconds_from_json)
    try:
        return _converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise ConversionError(_describe(exc, cls)) from exc


def _describe(exc: Exception, cls: type) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        return f"invalid {cls.__name__}: " + "; ".join(cattrs.transform_error(exc))
    return f"invalid {cls.__name__}: {exc}"


def _parse(data: dict[str, Any], message: Message) -> None:
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise ConversionError(str(exc)) from exc


def to_proto(value: object) -> Message:
    """Any protocol value (a message or a part of one, e.g. a `Gpu`) as protobuf."""
    message = _proto_class(type(value))()
    _parse(_to_json(value), message)
    return message


def from_proto(message: Message, cls: type[T]) -> T:
    """The value of type `cls` a protobuf message of the same name holds."""
    if _descriptor(message).name != cls.__name__:
        raise TypeError(f"a {_descriptor(message).name} does not hold a {cls.__name__}")
    data = _print(message)
    return _from_json(data, cls, _descriptor(message))


# -- the stream envelopes ----------------------------------------------------------------


def _payload_fields(envelope: type[Message], union: object) -> dict[type, str]:
    """Each union member's oneof field in `envelope`, matched by message name."""
    oneof = _descriptor(envelope).oneofs_by_name[_PAYLOAD]
    by_name = {f.message_type.name: f.name for f in oneof.fields if f.message_type is not None}
    fields = {}
    for cls in typing.get_args(union):
        if cls.__name__ not in by_name:
            raise TypeError(f"{envelope.__name__}.{_PAYLOAD} has no field for {cls.__name__}")
        fields[cls] = by_name.pop(cls.__name__)
    if by_name:
        raise TypeError(
            f"{envelope.__name__}.{_PAYLOAD} fields without a value type: {sorted(by_name)}"
        )
    return fields


_AGENT_FIELDS = _payload_fields(pb.ConnectRequest, AgentMessage)
_SERVER_FIELDS = _payload_fields(pb.ConnectResponse, ServerMessage)
_AGENT_CLASSES = {name: cls for cls, name in _AGENT_FIELDS.items()}
_SERVER_CLASSES = {name: cls for cls, name in _SERVER_FIELDS.items()}


def _wrap(value: object, fields: dict[type, str], envelope: Message) -> None:
    field = fields.get(type(value))
    if field is None:
        raise ConversionError(f"{type(value).__name__} cannot be sent this way")
    _parse({field: _to_json(value)}, envelope)


def _unwrap(envelope: Message, classes: dict[str, type[T]]) -> T:
    field = envelope.WhichOneof(_PAYLOAD)
    if field is None or field not in classes:
        raise UnknownMessage(f"{_descriptor(envelope).name} with no known payload")
    inner = getattr(envelope, field)
    return _from_json(_print(inner), classes[field], _descriptor(inner))


def agent_message_to_proto(message: AgentMessage) -> pb.ConnectRequest:
    request = pb.ConnectRequest()
    _wrap(message, _AGENT_FIELDS, request)
    return request


def agent_message_from_proto(request: pb.ConnectRequest) -> AgentMessage:
    message: AgentMessage = _unwrap(request, _AGENT_CLASSES)
    return message


def server_message_to_proto(message: ServerMessage) -> pb.ConnectResponse:
    response = pb.ConnectResponse()
    _wrap(message, _SERVER_FIELDS, response)
    return response


def server_message_from_proto(response: pb.ConnectResponse) -> ServerMessage:
    message: ServerMessage = _unwrap(response, _SERVER_CLASSES)
    return message


# The classes the envelopes carry, for tests and transports that check types.
AGENT_MESSAGE_TYPES: tuple[type, ...] = tuple(_AGENT_FIELDS)
SERVER_MESSAGE_TYPES: tuple[type, ...] = tuple(_SERVER_FIELDS)
