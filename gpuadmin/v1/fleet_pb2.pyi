import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListNodesRequest(_message.Message):
    __slots__ = ("state", "pool")
    STATE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    state: str
    pool: str
    def __init__(self, state: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("hostname", "state", "state_reason", "state_changed_at", "reachable", "model", "pool", "gpu_count", "driver_version")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    state: str
    state_reason: str
    state_changed_at: _timestamp_pb2.Timestamp
    reachable: bool
    model: str
    pool: str
    gpu_count: int
    driver_version: str
    def __init__(self, hostname: _Optional[str] = ..., state: _Optional[str] = ..., state_reason: _Optional[str] = ..., state_changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reachable: _Optional[bool] = ..., model: _Optional[str] = ..., pool: _Optional[str] = ..., gpu_count: _Optional[int] = ..., driver_version: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class ListGpusRequest(_message.Message):
    __slots__ = ("node", "state", "pool", "model")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    node: str
    state: str
    pool: str
    model: str
    def __init__(self, node: _Optional[str] = ..., state: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("uuid", "node", "index", "name", "memory_total_mib", "state", "state_reason", "state_changed_at", "missing", "pool", "mig_enabled")
    UUID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_MIB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    node: str
    index: int
    name: str
    memory_total_mib: int
    state: str
    state_reason: str
    state_changed_at: _timestamp_pb2.Timestamp
    missing: bool
    pool: str
    mig_enabled: bool
    def __init__(self, uuid: _Optional[str] = ..., node: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total_mib: _Optional[int] = ..., state: _Optional[str] = ..., state_reason: _Optional[str] = ..., state_changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., missing: _Optional[bool] = ..., pool: _Optional[str] = ..., mig_enabled: _Optional[bool] = ...) -> None: ...

class ListGpusResponse(_message.Message):
    __slots__ = ("gpus", "last_event_id")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    last_event_id: int
    def __init__(self, gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., last_event_id: _Optional[int] = ...) -> None: ...

class WatchGpusRequest(_message.Message):
    __slots__ = ("after_event_id", "node")
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    after_event_id: int
    node: str
    def __init__(self, after_event_id: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class GpuEvent(_message.Message):
    __slots__ = ("event_id", "gpu_uuid", "node", "state", "previous_state", "time", "actor", "message")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    gpu_uuid: str
    node: str
    state: str
    previous_state: str
    time: _timestamp_pb2.Timestamp
    actor: str
    message: str
    def __init__(self, event_id: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., previous_state: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
