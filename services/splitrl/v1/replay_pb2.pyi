from splitrl.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Trajectory(_message.Message):
    __slots__ = ("observations", "actions", "behaviour_log_probs", "values", "rewards", "terminated", "truncated", "policy_versions", "step_ids", "encoder_versions", "observation_index")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    STEP_IDS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_INDEX_FIELD_NUMBER: _ClassVar[int]
    observations: _tensor_pb2.Tensor
    actions: _tensor_pb2.Tensor
    behaviour_log_probs: _tensor_pb2.Tensor
    values: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    terminated: _tensor_pb2.Tensor
    truncated: _tensor_pb2.Tensor
    policy_versions: _tensor_pb2.Tensor
    step_ids: _tensor_pb2.Tensor
    encoder_versions: _tensor_pb2.Tensor
    observation_index: _tensor_pb2.Tensor
    def __init__(self, observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., behaviour_log_probs: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., terminated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., truncated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., policy_versions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., step_ids: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., encoder_versions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., observation_index: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class InsertRequest(_message.Message):
    __slots__ = ("table", "sequence", "trajectory", "priority", "writer_id")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    table: str
    sequence: int
    trajectory: Trajectory
    priority: float
    writer_id: str
    def __init__(self, table: _Optional[str] = ..., sequence: _Optional[int] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., priority: _Optional[float] = ..., writer_id: _Optional[str] = ...) -> None: ...

class InsertResponse(_message.Message):
    __slots__ = ("sequence", "key", "duplicate")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    key: int
    duplicate: bool
    def __init__(self, sequence: _Optional[int] = ..., key: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("table", "num_items")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_ITEMS_FIELD_NUMBER: _ClassVar[int]
    table: str
    num_items: int
    def __init__(self, table: _Optional[str] = ..., num_items: _Optional[int] = ...) -> None: ...

class SampledItem(_message.Message):
    __slots__ = ("key", "trajectory", "probability", "times_sampled", "table_size", "priority")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    key: int
    trajectory: Trajectory
    probability: float
    times_sampled: int
    table_size: int
    priority: float
    def __init__(self, key: _Optional[int] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., probability: _Optional[float] = ..., times_sampled: _Optional[int] = ..., table_size: _Optional[int] = ..., priority: _Optional[float] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SampledItem]
    def __init__(self, items: _Optional[_Iterable[_Union[SampledItem, _Mapping]]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "size", "max_size", "inserts", "samples", "selector", "max_times_sampled", "priority_exponent", "rate_limiter", "evictions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITER_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    max_size: int
    inserts: int
    samples: int
    selector: str
    max_times_sampled: int
    priority_exponent: float
    rate_limiter: RateLimiterInfo
    evictions: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., max_size: _Optional[int] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., selector: _Optional[str] = ..., max_times_sampled: _Optional[int] = ..., priority_exponent: _Optional[float] = ..., rate_limiter: _Optional[_Union[RateLimiterInfo, _Mapping]] = ..., evictions: _Optional[int] = ...) -> None: ...

class RateLimiterInfo(_message.Message):
    __slots__ = ("min_size_to_sample", "samples_per_insert", "min_diff", "max_diff", "diff", "blocked_inserts", "blocked_samples", "deletes")
    MIN_SIZE_TO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_INSERT_FIELD_NUMBER: _ClassVar[int]
    MIN_DIFF_FIELD_NUMBER: _ClassVar[int]
    MAX_DIFF_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_INSERTS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    min_size_to_sample: int
    samples_per_insert: float
    min_diff: float
    max_diff: float
    diff: float
    blocked_inserts: int
    blocked_samples: int
    deletes: int
    def __init__(self, min_size_to_sample: _Optional[int] = ..., samples_per_insert: _Optional[float] = ..., min_diff: _Optional[float] = ..., max_diff: _Optional[float] = ..., diff: _Optional[float] = ..., blocked_inserts: _Optional[int] = ..., blocked_samples: _Optional[int] = ..., deletes: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ...) -> None: ...

class KeyPriority(_message.Message):
    __slots__ = ("key", "priority")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    key: int
    priority: float
    def __init__(self, key: _Optional[int] = ..., priority: _Optional[float] = ...) -> None: ...

class UpdatePrioritiesRequest(_message.Message):
    __slots__ = ("table", "updates")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    table: str
    updates: _containers.RepeatedCompositeFieldContainer[KeyPriority]
    def __init__(self, table: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[KeyPriority, _Mapping]]] = ...) -> None: ...

class UpdatePrioritiesResponse(_message.Message):
    __slots__ = ("updated", "unknown_keys")
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_KEYS_FIELD_NUMBER: _ClassVar[int]
    updated: int
    unknown_keys: int
    def __init__(self, updated: _Optional[int] = ..., unknown_keys: _Optional[int] = ...) -> None: ...
