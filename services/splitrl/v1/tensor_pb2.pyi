from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_FLOAT8_E4M3FN: _ClassVar[DType]
    DTYPE_INT4: _ClassVar[DType]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZSTD: _ClassVar[Compression]
    COMPRESSION_H264: _ClassVar[Compression]
DTYPE_UNSPECIFIED: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT32: DType
DTYPE_UINT8: DType
DTYPE_INT8: DType
DTYPE_INT64: DType
DTYPE_FLOAT16: DType
DTYPE_BOOL: DType
DTYPE_FLOAT8_E4M3FN: DType
DTYPE_INT4: DType
COMPRESSION_NONE: Compression
COMPRESSION_ZSTD: Compression
COMPRESSION_H264: Compression

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "compression", "row_scale", "row_scale_bf16", "row_scale_log", "row_scale_log_base", "packet_sizes")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    ROW_SCALE_FIELD_NUMBER: _ClassVar[int]
    ROW_SCALE_BF16_FIELD_NUMBER: _ClassVar[int]
    ROW_SCALE_LOG_FIELD_NUMBER: _ClassVar[int]
    ROW_SCALE_LOG_BASE_FIELD_NUMBER: _ClassVar[int]
    PACKET_SIZES_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    compression: Compression
    row_scale: _containers.RepeatedScalarFieldContainer[float]
    row_scale_bf16: bytes
    row_scale_log: bytes
    row_scale_log_base: float
    packet_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., compression: _Optional[_Union[Compression, str]] = ..., row_scale: _Optional[_Iterable[float]] = ..., row_scale_bf16: _Optional[bytes] = ..., row_scale_log: _Optional[bytes] = ..., row_scale_log_base: _Optional[float] = ..., packet_sizes: _Optional[_Iterable[int]] = ...) -> None: ...
