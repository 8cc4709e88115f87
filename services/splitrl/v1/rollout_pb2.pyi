from splitrl.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnvStep(_message.Message):
    __slots__ = ("sequence", "frames", "rewards", "terminated", "truncated")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    frames: _tensor_pb2.Tensor
    rewards: _containers.RepeatedScalarFieldContainer[float]
    terminated: _containers.RepeatedScalarFieldContainer[bool]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, sequence: _Optional[int] = ..., frames: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Iterable[float]] = ..., terminated: _Optional[_Iterable[bool]] = ..., truncated: _Optional[_Iterable[bool]] = ...) -> None: ...

class EnvAction(_message.Message):
    __slots__ = ("sequence", "actions", "policy_version")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    actions: _tensor_pb2.Tensor
    policy_version: int
    def __init__(self, sequence: _Optional[int] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ActRequest(_message.Message):
    __slots__ = ("observations", "rewards", "reward_codes", "new_rewards", "terminated", "truncated", "encoder_version", "first_step_id", "step_id_advance")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_CODES_FIELD_NUMBER: _ClassVar[int]
    NEW_REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ENCODER_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_ADVANCE_FIELD_NUMBER: _ClassVar[int]
    observations: _tensor_pb2.Tensor
    rewards: _containers.RepeatedScalarFieldContainer[float]
    reward_codes: bytes
    new_rewards: _containers.RepeatedScalarFieldContainer[float]
    terminated: _containers.RepeatedScalarFieldContainer[bool]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    encoder_version: int
    first_step_id: int
    step_id_advance: int
    def __init__(self, observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Iterable[float]] = ..., reward_codes: _Optional[bytes] = ..., new_rewards: _Optional[_Iterable[float]] = ..., terminated: _Optional[_Iterable[bool]] = ..., truncated: _Optional[_Iterable[bool]] = ..., encoder_version: _Optional[int] = ..., first_step_id: _Optional[int] = ..., step_id_advance: _Optional[int] = ...) -> None: ...

class ActResponse(_message.Message):
    __slots__ = ("actions", "policy_version")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    actions: _tensor_pb2.Tensor
    policy_version: int
    def __init__(self, actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...
