"""A tensor as its elements' bytes: `encode` (torch or numpy in), `decode` (torch out), `decode_array` (numpy
out, no torch), `verify` (read everything, build nothing). Also int4's nibble packing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import zstandard

from splitrl.core.wire.checks import element_bytes, validate
from splitrl.core.wire.dtypes import (
    BY_NUMPY,
    BY_TORCH,
    COMPRESSION_ZSTD,
    DEFAULT_MAX_TENSOR_BYTES,
    DTYPE_INT4,
    DTYPE_NAMES,
    DTYPES,
    ZSTD_LEVEL,
    DType,
    Tensor,
    WireError,
    data_bytes,
    dtype_info,
)

if TYPE_CHECKING:
    import torch


def encode(value: torch.Tensor | np.ndarray, dtype: int | None = None, *, compress: bool = False) -> Tensor:
    """Encode a tensor; with `dtype`, convert to that wire dtype first (e.g. float32 -> bfloat16).

    `compress` packs the bytes as one zstd frame (level ZSTD_LEVEL) that records its content size.
    """
    if dtype == DTYPE_INT4:
        raise WireError("int4 has no torch dtype to convert to; quantize with encode_float(value, 'int4')")
    if isinstance(value, np.ndarray) and (dtype is None or dtype_info(dtype).numpy is not None):
        return _encode_array(value, dtype, compress)
    return _encode_tensor(_from_numpy(value) if isinstance(value, np.ndarray) else value, dtype, compress)


def _encode_array(array: np.ndarray, dtype: int | None, compress: bool) -> Tensor:
    """encode's numpy path (no torch): native byte order, row-major."""
    if dtype is not None:
        array = array.astype(dtype_info(dtype).numpy)
    native_dtype = array.dtype.newbyteorder("=")
    code = BY_NUMPY.get(native_dtype)
    if code is None:
        raise WireError(f"cannot encode numpy dtype {array.dtype}; supported: {sorted(DTYPE_NAMES)}")
    native = np.ascontiguousarray(array, dtype=native_dtype)  # 1-d for a 0-d array: the shape is array's
    return tensor_message(code, array.shape, native.tobytes(), compress)


def _encode_tensor(tensor: torch.Tensor, dtype: int | None, compress: bool) -> Tensor:
    import torch

    tensor = tensor.detach().cpu()
    if dtype is not None:
        tensor = tensor.to(dtype_info(dtype).torch_dtype)
    code = BY_TORCH.get(str(tensor.dtype).removeprefix("torch."))
    if code is None:
        raise WireError(f"cannot encode torch dtype {tensor.dtype}; supported: {sorted(DTYPE_NAMES)}")
    tensor = tensor.contiguous()
    # numpy has no bfloat16 or float8: reinterpret them as same-size integers to reach the raw bytes.
    raw = tensor
    if tensor.dtype in (torch.bfloat16, torch.float16):
        raw = tensor.view(torch.int16)
    elif tensor.dtype == torch.float8_e4m3fn:
        raw = tensor.view(torch.uint8)
    return tensor_message(code, tensor.shape, raw.numpy().tobytes(), compress)


def tensor_message(dtype: int, shape: Sequence[int], data: bytes, compress: bool) -> Tensor:
    """`compress`: zstd, unless the frame would not be smaller than `data` (a zstd frame costs ~9 bytes of its
    own, more than it saves on the tens of bytes of a narrow activation row)."""
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data) if compress else data
    if len(packed) >= len(data):
        return Tensor(dtype=dtype, shape=list(shape), data=data)  # type: ignore[arg-type]
    return Tensor(
        dtype=dtype,  # type: ignore[arg-type]
        shape=list(shape),
        data=packed,
        compression=COMPRESSION_ZSTD,
    )


def pack_int4(values: torch.Tensor) -> bytes:
    """int8 values in [-7, 7] -> two's-complement nibbles, element 2k low and 2k+1 high in byte k."""
    nibbles = values.reshape(-1).numpy().astype(np.uint8) & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()


def _unpack_int4(data: bytes, count: int) -> np.ndarray:
    """The inverse of pack_int4: `count` int8 elements; WireError for -8 or a set padding nibble."""
    packed = np.frombuffer(data, dtype=np.uint8)
    nibbles = np.empty(packed.size * 2, dtype=np.uint8)
    nibbles[0::2], nibbles[1::2] = packed & 0x0F, packed >> 4
    if nibbles.size > count and nibbles[count:].any():
        raise WireError("int4 tensor has a non-zero padding nibble after its last element")
    values = nibbles[:count].astype(np.int8)
    if (values == 8).any():
        raise WireError("int4 tensor holds -8; elements must be in [-7, 7]")
    values[values > 8] -= 16
    return values


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A torch view of any numpy array: native byte order, writable, and its shape kept (0-d too)."""
    import torch

    shape = array.shape
    native = np.ascontiguousarray(array)
    if not native.dtype.isnative:
        native = native.astype(native.dtype.newbyteorder("="))
    if not native.flags.writeable:
        native = native.copy()
    try:
        return torch.from_numpy(native).reshape(shape)
    except TypeError as error:
        raise WireError(f"cannot encode numpy dtype {array.dtype}: {error}") from None


def decode(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_dtype: int | None = None,
    expect_shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Validate (see `validate`) and return a fresh, writable torch tensor of the message's dtype.

    A quantized tensor comes back as its int8 / float8 elements; `decode_float` applies the scales.
    """
    import torch

    validate(message, max_bytes=max_bytes, expect_dtype=expect_dtype, expect_shape=expect_shape)
    info = DTYPES[message.dtype]
    if info.numpy is not None:
        return torch.from_numpy(_array(message))
    shape = tuple(message.shape)
    data = element_bytes(message, data_bytes(message.dtype, math.prod(shape)))
    if not data:
        return torch.empty(shape, dtype=info.torch_dtype)
    # bytearray makes the one copy that gives torch a writable buffer it owns.
    return torch.frombuffer(bytearray(data), dtype=info.torch_dtype).reshape(shape)


def verify(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_dtype: int | None = None,
    expect_shape: Sequence[int | None] | None = None,
) -> None:
    """`validate`, and read the elements as `decode` would (zstd decompressed, bools checked), building
    nothing: what decodes later cannot fail. For any dtype, bfloat16 included, without torch."""
    validate(message, max_bytes=max_bytes, expect_dtype=expect_dtype, expect_shape=expect_shape)
    element_bytes(message, data_bytes(message.dtype, math.prod(message.shape)))


def decode_array(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_dtype: int | None = None,
    expect_shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """`decode` without torch: a fresh, writable numpy array. WireError for bfloat16 and float8, which numpy
    cannot hold (`decode` can)."""
    validate(message, max_bytes=max_bytes, expect_dtype=expect_dtype, expect_shape=expect_shape)
    if DTYPES[message.dtype].numpy is None:
        raise WireError(f"{DType.Name(message.dtype)} has no numpy dtype; decode it to a torch tensor")
    return _array(message)


def _array(message: Tensor) -> np.ndarray:
    """The elements of a validated message whose dtype numpy holds."""
    info = DTYPES[message.dtype]
    shape = tuple(message.shape)
    data = element_bytes(message, data_bytes(message.dtype, math.prod(shape)))
    if message.dtype == DTYPE_INT4:
        return _unpack_int4(data, math.prod(shape)).reshape(shape)
    # bytearray makes the one copy that gives numpy a writable buffer it owns.
    return np.frombuffer(bytearray(data), dtype=info.numpy).reshape(shape)


def num_elements(message: Tensor) -> int:
    """Number of elements a Tensor message declares ("numbers", the research's unit)."""
    return math.prod(message.shape)
