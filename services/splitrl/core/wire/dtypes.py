"""The wire's dtypes: bits per element, the torch and numpy dtypes each decodes to, which are quantized and
which are floats; sizes in bytes; the limits every decoder enforces; WireError. numpy only, no torch."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

import numpy as np

from splitrl.core.config import FloatCodec
from splitrl.v1 import tensor_pb2

if TYPE_CHECKING:
    import torch

Tensor = tensor_pb2.Tensor
DType = tensor_pb2.DType
Compression = tensor_pb2.Compression

# The enums' values as plain ints, which is how splitrl names them. Reading one through its enum
# (DType.DTYPE_UINT8) goes through protobuf's EnumTypeWrapper.__getattr__, about 50 times the cost of reading
# an int, and validating one message made five. The enums stay for their names (DType.Name).
DTYPE_BFLOAT16 = tensor_pb2.DTYPE_BFLOAT16
DTYPE_FLOAT32 = tensor_pb2.DTYPE_FLOAT32
DTYPE_UINT8 = tensor_pb2.DTYPE_UINT8
DTYPE_INT8 = tensor_pb2.DTYPE_INT8
DTYPE_INT64 = tensor_pb2.DTYPE_INT64
DTYPE_FLOAT16 = tensor_pb2.DTYPE_FLOAT16
DTYPE_BOOL = tensor_pb2.DTYPE_BOOL
DTYPE_FLOAT8_E4M3FN = tensor_pb2.DTYPE_FLOAT8_E4M3FN
DTYPE_INT4 = tensor_pb2.DTYPE_INT4
COMPRESSION_NONE = tensor_pb2.COMPRESSION_NONE
COMPRESSION_ZSTD = tensor_pb2.COMPRESSION_ZSTD
COMPRESSION_H264 = tensor_pb2.COMPRESSION_H264


FLOAT_CODECS: tuple[str, ...] = get_args(FloatCodec)
#: zstd level for every compressed tensor: level 3 is zstd's default speed/ratio balance.
ZSTD_LEVEL = 3

#: Default upper bound on one tensor's data, in bytes (64 MiB). gRPC's own
#: message limit is set separately (splitrl.core.rpc); this bound stops a
#: forged shape from making a decoder allocate more than a message can hold.
DEFAULT_MAX_TENSOR_BYTES = 64 * 1024 * 1024

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("splitrl.core.wire assumes a little-endian host")


class WireError(ValueError):
    """A Tensor message that violates the wire format; the message says which rule."""


@dataclass(frozen=True)
class DTypeInfo:
    torch_name: str  # the torch dtype decode returns; INT4 comes back unpacked, one int8 per element
    bits: int  # per element on the wire
    numpy: np.dtype[Any] | None = None  # the numpy dtype decode_array returns; None: numpy has none

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.torch_name)  # type: ignore[no-any-return]


DTYPES: dict[int, DTypeInfo] = {
    DTYPE_BFLOAT16: DTypeInfo("bfloat16", 16),
    DTYPE_FLOAT32: DTypeInfo("float32", 32, np.dtype(np.float32)),
    DTYPE_UINT8: DTypeInfo("uint8", 8, np.dtype(np.uint8)),
    DTYPE_INT8: DTypeInfo("int8", 8, np.dtype(np.int8)),
    DTYPE_INT64: DTypeInfo("int64", 64, np.dtype(np.int64)),
    DTYPE_FLOAT16: DTypeInfo("float16", 16, np.dtype(np.float16)),
    DTYPE_BOOL: DTypeInfo("bool", 8, np.dtype(np.bool_)),
    DTYPE_FLOAT8_E4M3FN: DTypeInfo("float8_e4m3fn", 8),
    DTYPE_INT4: DTypeInfo("int8", 4, np.dtype(np.int8)),
}
#: Quantized dtypes and the largest magnitude a row is scaled to (int8 and int4 are symmetric: -128 and -8 unused).
QUANTIZED_LIMIT: dict[int, float] = {
    DTYPE_INT8: 127.0,
    DTYPE_INT4: 7.0,
    DTYPE_FLOAT8_E4M3FN: 448.0,
}
FLOAT_DTYPES = frozenset({DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT32, DTYPE_FLOAT8_E4M3FN})
CODEC_DTYPES = {
    "bf16": DTYPE_BFLOAT16,
    "int8": DTYPE_INT8,
    "int4": DTYPE_INT4,
    "fp8": DTYPE_FLOAT8_E4M3FN,
}
#: The wire dtype of each torch dtype name and numpy dtype `encode` takes (INT4 has neither: encode_float packs it).
BY_TORCH: dict[str, int] = {info.torch_name: code for code, info in DTYPES.items() if code != DTYPE_INT4}
BY_NUMPY: dict[np.dtype[Any], int] = {
    info.numpy: code for code, info in DTYPES.items() if info.numpy is not None and code != DTYPE_INT4
}
#: Largest H.264 packet accepted for one frame of P pixels: 2 P + 1 KiB (a lossless keyframe of noise stays below).
VIDEO_PACKET_SLACK_BYTES = 1024

#: Wire dtype names as used in configuration ("bfloat16", "uint8", ...).
DTYPE_NAMES: dict[str, int] = {DType.Name(code).removeprefix("DTYPE_").lower(): code for code in DTYPES}


def dtype_code(name: str) -> int:
    """The wire DType for a configuration name such as "bfloat16"; ValueError if unknown."""
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_NAMES)}") from None


def data_bytes(dtype: int, elements: int) -> int:
    """Bytes that `elements` elements of a wire DType occupy, uncompressed (INT4: half a byte each, rounded up)."""
    return (elements * dtype_info(dtype).bits + 7) // 8


def elements_in(dtype: int, nbytes: int) -> int:
    """Most elements of a wire DType that `nbytes` uncompressed bytes can hold."""
    return nbytes * 8 // dtype_info(dtype).bits


def dtype_info(dtype: int) -> DTypeInfo:
    info = DTYPES.get(dtype)
    if info is None:
        name = DType.Name(dtype) if dtype in DType.values() else str(dtype)
        raise WireError(f"unsupported tensor dtype {name}; expected one of {sorted(DTYPE_NAMES)}")
    return info
