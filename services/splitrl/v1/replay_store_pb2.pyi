from splitrl.v1 import replay_pb2 as _replay_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogRecord(_message.Message):
    __slots__ = ("insert", "sample", "priorities")
    INSERT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    insert: LoggedInsert
    sample: LoggedSample
    priorities: _replay_pb2.UpdatePrioritiesRequest
    def __init__(self, insert: _Optional[_Union[LoggedInsert, _Mapping]] = ..., sample: _Optional[_Union[LoggedSample, _Mapping]] = ..., priorities: _Optional[_Union[_replay_pb2.UpdatePrioritiesRequest, _Mapping]] = ...) -> None: ...

class LoggedInsert(_message.Message):
    __slots__ = ("table", "key", "priority", "trajectory", "writer_id", "sequence", "times_sampled")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: int
    priority: float
    trajectory: _replay_pb2.Trajectory
    writer_id: str
    sequence: int
    times_sampled: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[int] = ..., priority: _Optional[float] = ..., trajectory: _Optional[_Union[_replay_pb2.Trajectory, _Mapping]] = ..., writer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., times_sampled: _Optional[int] = ...) -> None: ...

class LoggedSample(_message.Message):
    __slots__ = ("table", "keys")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class TableState(_message.Message):
    __slots__ = ("name", "next_key", "inserts", "samples", "deletes", "evictions", "blocked_inserts", "blocked_samples", "max_priority")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEXT_KEY_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_INSERTS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    next_key: int
    inserts: int
    samples: int
    deletes: int
    evictions: int
    blocked_inserts: int
    blocked_samples: int
    max_priority: float
    def __init__(self, name: _Optional[str] = ..., next_key: _Optional[int] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., deletes: _Optional[int] = ..., evictions: _Optional[int] = ..., blocked_inserts: _Optional[int] = ..., blocked_samples: _Optional[int] = ..., max_priority: _Optional[float] = ...) -> None: ...

class WriterState(_message.Message):
    __slots__ = ("writer_id", "highest_sequence", "sequences", "keys")
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    writer_id: str
    highest_sequence: int
    sequences: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, writer_id: _Optional[str] = ..., highest_sequence: _Optional[int] = ..., sequences: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotHeader(_message.Message):
    __slots__ = ("format", "next_segment", "tables", "writers", "items")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    format: int
    next_segment: int
    tables: _containers.RepeatedCompositeFieldContainer[TableState]
    writers: _containers.RepeatedCompositeFieldContainer[WriterState]
    items: int
    def __init__(self, format: _Optional[int] = ..., next_segment: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableState, _Mapping]]] = ..., writers: _Optional[_Iterable[_Union[WriterState, _Mapping]]] = ..., items: _Optional[int] = ...) -> None: ...
