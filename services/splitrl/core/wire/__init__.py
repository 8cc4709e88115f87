"""Tensor <-> bytes: the only package that touches raw tensor bytes.

A `splitrl.v1.Tensor` holds a dtype, a shape and the elements as row-major,
little-endian bytes, optionally zstd-compressed, and for quantized tensors one
scale per row (bfloat16 or one log-coded byte as splitrl sends them, or float32:
splitrl.core.scale_forms). `encode` builds one from a torch tensor or numpy array;
`encode_float` puts a float tensor on the wire with a `FloatCodec` (bf16, int8,
int4, fp8, each optionally +zstd). `decode` checks every invariant before it
trusts the bytes and raises `WireError` (a ValueError) naming the mismatch;
`decode_float` also undoes quantization. Servers turn WireError into gRPC
INVALID_ARGUMENT (see splitrl.core.rpc).

A batch of frames sent as video (COMPRESSION_H264) is framed here too
(`encode_packets`, `video_packets`: one packet per row), but only a stateful
decoder turns packets into frames: splitrl.core.video.

torch is imported only by the calls that take or return torch tensors: numpy arrays
in (`encode`) and out (`decode_array`) never load it, so the environment service,
which only sends uint8 frames and reads actions, runs without torch.

Callers use this package's names; its modules, each of one concern:
- `dtypes`: the dtype table, sizes in bytes, limits, WireError;
- `checks`: `validate` (every invariant of a message) and reading its elements and row scales;
- `tensors`: `encode`, `decode`, `decode_array`, `verify`, int4's nibble packing;
- `floats`: `encode_float`, `decode_float` (FloatCodecs: quantization with row scales);
- `packets`: `encode_packets`, `video_packets` (H.264 framing).
"""

from splitrl.core.wire.checks import row_scales, validate
from splitrl.core.wire.dtypes import (
    COMPRESSION_H264,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DEFAULT_MAX_TENSOR_BYTES,
    DTYPE_BFLOAT16,
    DTYPE_BOOL,
    DTYPE_FLOAT8_E4M3FN,
    DTYPE_FLOAT16,
    DTYPE_FLOAT32,
    DTYPE_INT4,
    DTYPE_INT8,
    DTYPE_INT64,
    DTYPE_NAMES,
    DTYPE_UINT8,
    FLOAT_CODECS,
    ZSTD_LEVEL,
    Compression,
    DType,
    Tensor,
    WireError,
    data_bytes,
    dtype_code,
    elements_in,
)
from splitrl.core.wire.floats import decode_float, encode_float
from splitrl.core.wire.packets import encode_packets, video_packets
from splitrl.core.wire.tensors import decode, decode_array, encode, num_elements, verify

__all__ = [
    "COMPRESSION_H264",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "DEFAULT_MAX_TENSOR_BYTES",
    "DTYPE_BFLOAT16",
    "DTYPE_BOOL",
    "DTYPE_FLOAT8_E4M3FN",
    "DTYPE_FLOAT16",
    "DTYPE_FLOAT32",
    "DTYPE_INT4",
    "DTYPE_INT8",
    "DTYPE_INT64",
    "DTYPE_NAMES",
    "DTYPE_UINT8",
    "FLOAT_CODECS",
    "ZSTD_LEVEL",
    "Compression",
    "DType",
    "Tensor",
    "WireError",
    "data_bytes",
    "decode",
    "decode_array",
    "decode_float",
    "dtype_code",
    "elements_in",
    "encode",
    "encode_float",
    "encode_packets",
    "num_elements",
    "row_scales",
    "validate",
    "verify",
    "video_packets",
]
