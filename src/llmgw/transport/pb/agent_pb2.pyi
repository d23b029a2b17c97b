import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_STATE_UNSPECIFIED: _ClassVar[ShardState]
    SHARD_STATE_STARTING: _ClassVar[ShardState]
    SHARD_STATE_READY: _ClassVar[ShardState]
    SHARD_STATE_DRAINING: _ClassVar[ShardState]
    SHARD_STATE_STOPPED: _ClassVar[ShardState]
    SHARD_STATE_FAILED: _ClassVar[ShardState]
SHARD_STATE_UNSPECIFIED: ShardState
SHARD_STATE_STARTING: ShardState
SHARD_STATE_READY: ShardState
SHARD_STATE_DRAINING: ShardState
SHARD_STATE_STOPPED: ShardState
SHARD_STATE_FAILED: ShardState

class ConnectRequest(_message.Message):
    __slots__ = ("register", "heartbeat", "shard_status", "command_result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    shard_status: ShardStatus
    command_result: CommandResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shard_status: _Optional[_Union[ShardStatus, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node", "shards")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "hostname", "address", "agent_version", "labels", "fabrics", "gpus", "engines")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FABRICS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    address: str
    agent_version: str
    labels: _containers.ScalarMap[str, str]
    fabrics: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., address: _Optional[str] = ..., agent_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., fabrics: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_total", "memory_used", "utilization", "ecc_errors")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    ECC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    utilization: float
    ecc_errors: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_used: _Optional[int] = ..., utilization: _Optional[float] = ..., ecc_errors: _Optional[int] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "gpus", "shards")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    def __init__(self, seq: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("replica_id", "rank", "epoch", "state", "model", "message", "exit_code", "output_tail", "endpoint_url", "pid", "profile", "node_count", "gpu_indices", "port", "dist_port", "capacity", "busy_ports")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_URL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    DIST_PORT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BUSY_PORTS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    rank: int
    epoch: int
    state: ShardState
    model: str
    message: str
    exit_code: int
    output_tail: _containers.RepeatedScalarFieldContainer[str]
    endpoint_url: str
    pid: int
    profile: str
    node_count: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    port: int
    dist_port: int
    capacity: int
    busy_ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., epoch: _Optional[int] = ..., state: _Optional[_Union[ShardState, str]] = ..., model: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., output_tail: _Optional[_Iterable[str]] = ..., endpoint_url: _Optional[str] = ..., pid: _Optional[int] = ..., profile: _Optional[str] = ..., node_count: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., port: _Optional[int] = ..., dist_port: _Optional[int] = ..., capacity: _Optional[int] = ..., busy_ports: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ok: bool
    message: str
    def __init__(self, command_id: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("registered", "start_shard", "stop_shard", "drain_shard", "refused")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    START_SHARD_FIELD_NUMBER: _ClassVar[int]
    STOP_SHARD_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SHARD_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    start_shard: StartShard
    stop_shard: StopShard
    drain_shard: DrainShard
    refused: Refused
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., start_shard: _Optional[_Union[StartShard, _Mapping]] = ..., stop_shard: _Optional[_Union[StopShard, _Mapping]] = ..., drain_shard: _Optional[_Union[DrainShard, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("reason", "leader")
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    reason: str
    leader: str
    def __init__(self, reason: _Optional[str] = ..., leader: _Optional[str] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("heartbeat_interval", "server_epoch", "leader_token")
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SERVER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    server_epoch: str
    leader_token: int
    def __init__(self, heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., server_epoch: _Optional[str] = ..., leader_token: _Optional[int] = ...) -> None: ...

class DeploymentProfile(_message.Message):
    __slots__ = ("name", "engine", "weights", "tensor_parallel", "pipeline_parallel", "gpus_per_node", "min_gpu_memory", "gpu_name", "args", "env", "sleep_after")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SLEEP_AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    engine: str
    weights: str
    tensor_parallel: int
    pipeline_parallel: int
    gpus_per_node: int
    min_gpu_memory: int
    gpu_name: str
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    sleep_after: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., engine: _Optional[str] = ..., weights: _Optional[str] = ..., tensor_parallel: _Optional[int] = ..., pipeline_parallel: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., min_gpu_memory: _Optional[int] = ..., gpu_name: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., sleep_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StartShard(_message.Message):
    __slots__ = ("command_id", "replica_id", "rank", "epoch", "model", "profile", "gpu_indices", "port", "node_count", "master_address", "master_port", "mgmt_interface")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    MGMT_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    replica_id: str
    rank: int
    epoch: int
    model: str
    profile: DeploymentProfile
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    port: int
    node_count: int
    master_address: str
    master_port: int
    mgmt_interface: str
    def __init__(self, command_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., epoch: _Optional[int] = ..., model: _Optional[str] = ..., profile: _Optional[_Union[DeploymentProfile, _Mapping]] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., port: _Optional[int] = ..., node_count: _Optional[int] = ..., master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., mgmt_interface: _Optional[str] = ...) -> None: ...

class StopShard(_message.Message):
    __slots__ = ("command_id", "replica_id", "rank", "epoch", "grace")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    replica_id: str
    rank: int
    epoch: int
    grace: _duration_pb2.Duration
    def __init__(self, command_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., epoch: _Optional[int] = ..., grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainShard(_message.Message):
    __slots__ = ("command_id", "replica_id", "rank", "epoch", "deadline")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    replica_id: str
    rank: int
    epoch: int
    deadline: _duration_pb2.Duration
    def __init__(self, command_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., rank: _Optional[int] = ..., epoch: _Optional[int] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
