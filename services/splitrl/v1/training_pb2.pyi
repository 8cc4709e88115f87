from splitrl.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EdgeMessage(_message.Message):
    __slots__ = ("hello", "activations", "applied")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    hello: EdgeHello
    activations: Activations
    applied: GradientsApplied
    def __init__(self, hello: _Optional[_Union[EdgeHello, _Mapping]] = ..., activations: _Optional[_Union[Activations, _Mapping]] = ..., applied: _Optional[_Union[GradientsApplied, _Mapping]] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("activation_request", "gradients")
    ACTIVATION_REQUEST_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    activation_request: ActivationRequest
    gradients: EncoderGradients
    def __init__(self, activation_request: _Optional[_Union[ActivationRequest, _Mapping]] = ..., gradients: _Optional[_Union[EncoderGradients, _Mapping]] = ...) -> None: ...

class EdgeHello(_message.Message):
    __slots__ = ("step_id_prefix", "encoder_version", "edge_id", "width")
    STEP_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ENCODER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    step_id_prefix: int
    encoder_version: int
    edge_id: str
    width: int
    def __init__(self, step_id_prefix: _Optional[int] = ..., encoder_version: _Optional[int] = ..., edge_id: _Optional[str] = ..., width: _Optional[int] = ...) -> None: ...

class StepIds(_message.Message):
    __slots__ = ("first", "deltas")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    first: int
    deltas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, first: _Optional[int] = ..., deltas: _Optional[_Iterable[int]] = ...) -> None: ...

class ActivationRequest(_message.Message):
    __slots__ = ("request_id", "steps")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    steps: StepIds
    def __init__(self, request_id: _Optional[int] = ..., steps: _Optional[_Union[StepIds, _Mapping]] = ...) -> None: ...

class Activations(_message.Message):
    __slots__ = ("request_id", "activations", "missing_step_ids", "encoder_version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    MISSING_STEP_IDS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    activations: _tensor_pb2.Tensor
    missing_step_ids: _containers.RepeatedScalarFieldContainer[int]
    encoder_version: int
    def __init__(self, request_id: _Optional[int] = ..., activations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., missing_step_ids: _Optional[_Iterable[int]] = ..., encoder_version: _Optional[int] = ...) -> None: ...

class EncoderGradients(_message.Message):
    __slots__ = ("request_id", "gradients", "steps", "learning_rate_scale")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_SCALE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    gradients: _tensor_pb2.Tensor
    steps: StepIds
    learning_rate_scale: float
    def __init__(self, request_id: _Optional[int] = ..., gradients: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., steps: _Optional[_Union[StepIds, _Mapping]] = ..., learning_rate_scale: _Optional[float] = ...) -> None: ...

class GradientsApplied(_message.Message):
    __slots__ = ("request_id", "encoder_version", "unknown_step_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODER_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_STEP_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    encoder_version: int
    unknown_step_ids: int
    def __init__(self, request_id: _Optional[int] = ..., encoder_version: _Optional[int] = ..., unknown_step_ids: _Optional[int] = ...) -> None: ...
