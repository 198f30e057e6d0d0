import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_SCHEDULED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_COMPLETED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELED: _ClassVar[JobState]
    JOB_STATE_PREEMPTED: _ClassVar[JobState]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_SCHEDULED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELED: JobState
JOB_STATE_PREEMPTED: JobState
PRIORITY_UNSPECIFIED: Priority
PRIORITY_LOW: Priority
PRIORITY_NORMAL: Priority
PRIORITY_HIGH: Priority
PRIORITY_CRITICAL: Priority

class SubmitJobRequest(_message.Message):
    __slots__ = ("idempotency_key", "command", "use_shell", "name", "project", "env", "working_dir", "container_image", "gpu_count", "node_count", "min_gpu_memory_mib", "gpu_model", "topology", "priority", "preemptible", "estimated_duration_s", "max_runtime_s", "max_retries", "hold", "pool", "mig_profile", "mps_percent", "mps_memory_mib", "ray", "cpus", "host_memory_mib", "reservation", "dependency")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    USE_SHELL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    MPS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MPS_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    RAY_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCY_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    command: _containers.RepeatedScalarFieldContainer[str]
    use_shell: bool
    name: str
    project: str
    env: _containers.ScalarMap[str, str]
    working_dir: str
    container_image: str
    gpu_count: int
    node_count: int
    min_gpu_memory_mib: int
    gpu_model: str
    topology: str
    priority: Priority
    preemptible: bool
    estimated_duration_s: int
    max_runtime_s: int
    max_retries: int
    hold: bool
    pool: str
    mig_profile: str
    mps_percent: int
    mps_memory_mib: int
    ray: bool
    cpus: int
    host_memory_mib: int
    reservation: int
    dependency: str
    def __init__(self, idempotency_key: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., use_shell: _Optional[bool] = ..., name: _Optional[str] = ..., project: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., container_image: _Optional[str] = ..., gpu_count: _Optional[int] = ..., node_count: _Optional[int] = ..., min_gpu_memory_mib: _Optional[int] = ..., gpu_model: _Optional[str] = ..., topology: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., preemptible: _Optional[bool] = ..., estimated_duration_s: _Optional[int] = ..., max_runtime_s: _Optional[int] = ..., max_retries: _Optional[int] = ..., hold: _Optional[bool] = ..., pool: _Optional[str] = ..., mig_profile: _Optional[str] = ..., mps_percent: _Optional[int] = ..., mps_memory_mib: _Optional[int] = ..., ray: _Optional[bool] = ..., cpus: _Optional[int] = ..., host_memory_mib: _Optional[int] = ..., reservation: _Optional[int] = ..., dependency: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "owner", "project", "node")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[JobState]
    owner: str
    project: str
    node: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[JobState, str]]] = ..., owner: _Optional[str] = ..., project: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("id", "kill")
    ID_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    id: int
    kill: bool
    def __init__(self, id: _Optional[int] = ..., kill: _Optional[bool] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job", "canceling")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CANCELING_FIELD_NUMBER: _ClassVar[int]
    job: Job
    canceling: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., canceling: _Optional[bool] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("id", "after_event_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    after_event_id: int
    def __init__(self, id: _Optional[int] = ..., after_event_id: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("event_id", "job_id", "event_type", "state", "previous_state", "time", "actor", "message")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    job_id: int
    event_type: str
    state: JobState
    previous_state: JobState
    time: _timestamp_pb2.Timestamp
    actor: str
    message: str
    def __init__(self, event_id: _Optional[int] = ..., job_id: _Optional[int] = ..., event_type: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., previous_state: _Optional[_Union[JobState, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("gpu_uuid", "gpu_index", "node", "attempt")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    gpu_index: int
    node: str
    attempt: int
    def __init__(self, gpu_uuid: _Optional[str] = ..., gpu_index: _Optional[int] = ..., node: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "name", "owner", "project", "state", "priority", "command", "command_hidden", "use_shell", "env", "working_dir", "container_image", "gpu_count", "node_count", "min_gpu_memory_mib", "gpu_model", "topology", "pool", "preemptible", "estimated_duration_s", "max_runtime_s", "max_retries", "attempt", "failures", "submitted_at", "scheduled_at", "started_at", "finished_at", "exit_code", "message", "pending_code", "pending_reason", "queue_position", "estimated_start_at", "allocations", "mig_profile", "mps_percent", "reservation", "idempotency_key")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    COMMAND_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    USE_SHELL_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_CODE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_AT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    MPS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    owner: str
    project: str
    state: JobState
    priority: Priority
    command: _containers.RepeatedScalarFieldContainer[str]
    command_hidden: bool
    use_shell: bool
    env: _containers.ScalarMap[str, str]
    working_dir: str
    container_image: str
    gpu_count: int
    node_count: int
    min_gpu_memory_mib: int
    gpu_model: str
    topology: str
    pool: str
    preemptible: bool
    estimated_duration_s: int
    max_runtime_s: int
    max_retries: int
    attempt: int
    failures: int
    submitted_at: _timestamp_pb2.Timestamp
    scheduled_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    exit_code: int
    message: str
    pending_code: str
    pending_reason: str
    queue_position: int
    estimated_start_at: _timestamp_pb2.Timestamp
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    mig_profile: str
    mps_percent: int
    reservation: int
    idempotency_key: str
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., project: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., priority: _Optional[_Union[Priority, str]] = ..., command: _Optional[_Iterable[str]] = ..., command_hidden: _Optional[bool] = ..., use_shell: _Optional[bool] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., container_image: _Optional[str] = ..., gpu_count: _Optional[int] = ..., node_count: _Optional[int] = ..., min_gpu_memory_mib: _Optional[int] = ..., gpu_model: _Optional[str] = ..., topology: _Optional[str] = ..., pool: _Optional[str] = ..., preemptible: _Optional[bool] = ..., estimated_duration_s: _Optional[int] = ..., max_runtime_s: _Optional[int] = ..., max_retries: _Optional[int] = ..., attempt: _Optional[int] = ..., failures: _Optional[int] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., pending_code: _Optional[str] = ..., pending_reason: _Optional[str] = ..., queue_position: _Optional[int] = ..., estimated_start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., mig_profile: _Optional[str] = ..., mps_percent: _Optional[int] = ..., reservation: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...
