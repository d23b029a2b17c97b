"""The agent protocol's values to protobuf and back: exact for every message type."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.config import Bytes, DeploymentProfile
from llmgw.domain.fleet import EngineInfo, Gpu, NodeInfo, ShardState
from llmgw.transport import convert
from llmgw.transport.messages import (
    AgentMessage,
    CommandResult,
    DrainShard,
    Heartbeat,
    Refused,
    Register,
    Registered,
    ServerMessage,
    ShardStatus,
    StartShard,
    StopShard,
)
from llmgw.transport.pb import agent_pb2 as pb
from tests.properties import examples

# -- strategies: each field over the whole domain its proto type carries ----------------

text = st.text(max_size=12)
uint32 = st.integers(0, 2**32 - 1)
uint64 = st.integers(0, 2**64 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
# Duration's grain is the nanosecond: a whole number of them round-trips exactly.
seconds = st.integers(0, 10**15).map(lambda ns: ns / 1e9)
finite = st.floats(allow_nan=False)  # NaN is never equal to itself, so no round trip to see
labels = st.dictionaries(text, text, max_size=3)


def tuples(elements: st.SearchStrategy[object]) -> st.SearchStrategy[tuple[object, ...]]:
    return st.lists(elements, max_size=3).map(tuple)


gpus = st.builds(
    Gpu,
    index=uint32,
    uuid=text,
    name=text,
    memory_total=uint64,
    memory_used=st.none() | uint64,
    utilization=st.none() | finite,
    ecc_errors=st.none() | uint64,
)
engines = st.builds(EngineInfo, name=text, version=st.none() | text)
nodes = st.builds(
    NodeInfo,
    node_id=text,
    hostname=text,
    address=text,
    agent_version=text,
    labels=labels,
    fabrics=tuples(text),
    gpus=tuples(gpus),
    engines=tuples(engines),
)
shard_statuses = st.builds(
    ShardStatus,
    replica_id=text,
    rank=uint32,
    epoch=uint64,
    state=st.sampled_from(ShardState),
    model=text,
    message=text,
    exit_code=st.none() | int32,
    output_tail=tuples(text),
    endpoint_url=st.none() | text,
    pid=st.none() | uint32,
    profile=text,
    node_count=st.none() | uint32,
    gpu_indices=tuples(uint32),
    port=st.none() | uint32,
    dist_port=st.none() | uint32,
)
profiles = st.builds(
    DeploymentProfile,
    name=text,
    engine=text,
    weights=text,
    tensor_parallel=uint32,
    pipeline_parallel=uint32,
    gpus_per_node=st.none() | uint32,
    min_gpu_memory=st.none() | uint64.map(Bytes),
    gpu_name=st.none() | text,
    args=tuples(text),
    env=labels,
)

agent_messages: st.SearchStrategy[AgentMessage] = st.one_of(
    st.builds(Register, node=nodes, shards=tuples(shard_statuses)),
    st.builds(Heartbeat, seq=uint64, gpus=tuples(gpus), shards=tuples(shard_statuses)),
    shard_statuses,
    st.builds(CommandResult, command_id=text, ok=st.booleans(), message=text),
)
server_messages: st.SearchStrategy[ServerMessage] = st.one_of(
    st.builds(Registered, heartbeat_interval=seconds, server_epoch=text),
    st.builds(
        StartShard,
        command_id=text,
        replica_id=text,
        rank=uint32,
        epoch=uint64,
        model=text,
        profile=profiles,
        gpu_indices=tuples(uint32),
        port=uint32,
        node_count=uint32,
        master_address=st.none() | text,
        master_port=st.none() | uint32,
        mgmt_interface=text,
    ),
    st.builds(
        StopShard, command_id=text, replica_id=text, rank=uint32, epoch=uint64, grace=seconds
    ),
    st.builds(
        DrainShard, command_id=text, replica_id=text, rank=uint32, epoch=uint64, deadline=seconds
    ),
    st.builds(Refused, reason=text),
)


# -- round trips ---------------------------------------------------------------------------


@settings(max_examples=examples(300))
@given(agent_messages)
def test_agent_messages_round_trip_through_bytes(message: AgentMessage) -> None:
    wire = convert.agent_message_to_proto(message).SerializeToString()
    assert convert.agent_message_from_proto(pb.ConnectRequest.FromString(wire)) == message


@settings(max_examples=examples(300))
@given(server_messages)
def test_server_messages_round_trip_through_bytes(message: ServerMessage) -> None:
    wire = convert.server_message_to_proto(message).SerializeToString()
    assert convert.server_message_from_proto(pb.ConnectResponse.FromString(wire)) == message


def test_every_message_type_is_covered() -> None:
    assert set(convert.AGENT_MESSAGE_TYPES) == {Register, Heartbeat, ShardStatus, CommandResult}
    assert set(convert.SERVER_MESSAGE_TYPES) == {
        Registered,
        StartShard,
        StopShard,
        DrainShard,
        Refused,
    }


@pytest.mark.parametrize(
    "cls",
    [
        Register,
        NodeInfo,
        Gpu,
        EngineInfo,
        Heartbeat,
        ShardStatus,
        CommandResult,
        Registered,
        DeploymentProfile,
        StartShard,
        StopShard,
        DrainShard,
        Refused,
    ],
)
def test_value_and_proto_fields_match_by_name(cls: type) -> None:
    proto_fields = {f.name for f in getattr(pb, cls.__name__).DESCRIPTOR.fields}
    sent = {f.name for f in attrs.fields(cls)} - convert.NOT_SENT.get(cls, frozenset())
    assert proto_fields == sent


def test_a_profiles_api_key_crosses_only_in_the_engines_environment() -> None:
    profile = DeploymentProfile("p", "vllm", "w", env={"A": "1"}, api_key="sk-1")
    message = convert.to_proto(profile)
    assert "sk-1" not in str(message)  # the reconciler moves it into env first
    assert convert.from_proto(message, DeploymentProfile) == attrs.evolve(profile, api_key=None)


def test_shard_states_match_the_proto_enum() -> None:
    names = set(pb.ShardState.keys()) - {"SHARD_STATE_UNSPECIFIED"}
    assert names == {f"SHARD_STATE_{state.name}" for state in ShardState}


# -- absent is not zero ----------------------------------------------------------------------


def test_absent_optionals_stay_absent_and_zeros_stay_present() -> None:
    unknown = convert.to_proto(Gpu(index=0, uuid="u", name="n", memory_total=1))
    assert isinstance(unknown, pb.Gpu)
    assert not unknown.HasField("utilization")
    assert not unknown.HasField("memory_used")
    assert not unknown.HasField("ecc_errors")
    idle = Gpu(index=0, uuid="u", name="n", memory_total=1, memory_used=0, utilization=0.0)
    zero = convert.to_proto(idle)
    assert isinstance(zero, pb.Gpu)
    assert zero.HasField("utilization")
    assert zero.HasField("memory_used")
    assert convert.from_proto(pb.Gpu.FromString(zero.SerializeToString()), Gpu) == idle

    exited = ShardStatus("r", 0, 1, ShardState.FAILED, exit_code=0)
    assert convert.to_proto(exited).HasField("exit_code")  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308])
def test_extreme_doubles_round_trip(value: float) -> None:
    gpu = Gpu(index=0, uuid="u", name="n", memory_total=1, utilization=value)
    assert (
        convert.from_proto(pb.Gpu.FromString(convert.to_proto(gpu).SerializeToString()), Gpu) == gpu
    )


def test_nan_stays_nan() -> None:
    gpu = Gpu(index=0, uuid="u", name="n", memory_total=1, utilization=float("nan"))
    back = convert.from_proto(convert.to_proto(gpu), Gpu)
    assert back.utilization is not None and math.isnan(back.utilization)


def test_durations_are_protobuf_durations() -> None:
    response = convert.server_message_to_proto(StopShard("c", "r", 0, 1, grace=2.5))
    assert (response.stop_shard.grace.seconds, response.stop_shard.grace.nanos) == (2, 500_000_000)
    # A peer that leaves the grace out gets the default, not zero.
    bare = pb.ConnectResponse(stop_shard=pb.StopShard(command_id="c", replica_id="r"))
    assert convert.server_message_from_proto(bare) == StopShard("c", "r", 0, 0)


# -- what cannot convert ---------------------------------------------------------------------


def test_unspecified_shard_state_is_refused() -> None:
    request = pb.ConnectRequest(shard_status=pb.ShardStatus(replica_id="r"))
    with pytest.raises(convert.ConversionError, match="ShardStatus"):
        convert.agent_message_from_proto(request)


def test_a_newer_peers_enum_value_is_refused() -> None:
    # An enum value this version does not know arrives as its number.
    wire = bytes([0x1A, 0x02, 0x20, 0x09])  # shard_status { state: 9 }
    with pytest.raises(convert.ConversionError):
        convert.agent_message_from_proto(pb.ConnectRequest.FromString(wire))


def test_empty_or_unknown_payload_is_unknown_message() -> None:
    with pytest.raises(convert.UnknownMessage):
        convert.agent_message_from_proto(pb.ConnectRequest())
    # A payload added in a newer version (field 15 here) decodes as no payload at all.
    newer = bytes([0x7A, 0x00])
    with pytest.raises(convert.UnknownMessage):
        convert.server_message_from_proto(pb.ConnectResponse.FromString(newer))


def test_values_outside_the_wire_types_are_refused() -> None:
    with pytest.raises(convert.ConversionError, match="seq"):
        convert.agent_message_to_proto(Heartbeat(seq=-1))
    with pytest.raises(convert.ConversionError, match="port"):
        profile = DeploymentProfile(name="p", engine="sim", weights="w")
        convert.server_message_to_proto(StartShard("c", "r", 0, 1, "m", profile, (0,), 2**32))


def test_a_message_of_the_wrong_direction_is_refused() -> None:
    with pytest.raises(convert.ConversionError, match="Registered"):
        convert.agent_message_to_proto(Registered(1.0, "e"))  # type: ignore[arg-type]
