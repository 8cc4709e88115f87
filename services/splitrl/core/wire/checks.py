"""Every invariant of a Tensor message, checked before its bytes are trusted (`validate`), and the reading of
its elements and row scales. numpy only, no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import zstandard

from splitrl.core import scale_forms
from splitrl.core.wire.dtypes import (
    COMPRESSION_H264,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    DEFAULT_MAX_TENSOR_BYTES,
    DTYPE_BOOL,
    DTYPE_UINT8,
    QUANTIZED_LIMIT,
    VIDEO_PACKET_SLACK_BYTES,
    DType,
    Tensor,
    WireError,
    data_bytes,
    dtype_info,
)


def validate(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_dtype: int | None = None,
    expect_shape: Sequence[int | None] | None = None,
) -> None:
    """Check a Tensor's invariants without copying; raise WireError naming the first violation.

    `expect_shape` entries of None match any size; its length must match the rank.
    """
    info = dtype_info(message.dtype)
    if expect_dtype is not None and message.dtype != expect_dtype:
        raise WireError(f"tensor dtype is {DType.Name(message.dtype)}, expected {DType.Name(expect_dtype)}")
    shape = list(message.shape)
    if any(dim < 0 for dim in shape):
        raise WireError(f"tensor shape {shape} has a negative dimension")
    if expect_shape is not None and (
        len(shape) != len(expect_shape)
        or any(want is not None and got != want for got, want in zip(shape, expect_shape, strict=True))
    ):
        wanted = ["*" if dim is None else dim for dim in expect_shape]
        raise WireError(f"tensor shape {shape} does not match expected {wanted}")
    expected_bytes = data_bytes(message.dtype, math.prod(shape))
    if expected_bytes > max_bytes:
        raise WireError(f"tensor of shape {shape} needs {expected_bytes} bytes, over the limit of {max_bytes}")
    _check_row_scale(message, shape)
    if message.packet_sizes and message.compression != COMPRESSION_H264:
        raise WireError("packet_sizes is set on a tensor that is not H.264 video")
    if message.compression == COMPRESSION_ZSTD:
        _check_zstd_header(message.data, expected_bytes)
    elif message.compression == COMPRESSION_H264:
        _check_video(message, shape)
    elif message.compression != COMPRESSION_NONE:
        raise WireError(f"unknown tensor compression {message.compression}; expected NONE, ZSTD or H264")
    elif len(message.data) != expected_bytes:
        raise WireError(
            f"tensor data is {len(message.data)} bytes but shape {shape} x {info.bits} bits "
            f"({DType.Name(message.dtype)}) needs {expected_bytes}"
        )
    if message.dtype == DTYPE_BOOL and message.compression == COMPRESSION_NONE:
        _check_bool(message.data)


#: The fields that can carry a quantized tensor's row scales (splitrl.core.scale_forms): one at most.
SCALE_FIELDS = ("row_scale", "row_scale_bf16", "row_scale_log")


def _check_row_scale(message: Tensor, shape: list[int]) -> None:
    present = [field for field in SCALE_FIELDS if getattr(message, field)]
    if len(present) > 1:
        raise WireError(f"tensor carries {' and '.join(present)}; send one")
    if message.row_scale_log_base and not message.row_scale_log:
        raise WireError("row_scale_log_base is set without row_scale_log")
    if not present:
        return
    field = present[0]
    if message.dtype not in QUANTIZED_LIMIT:
        raise WireError(f"{field} is set on a {DType.Name(message.dtype)} tensor; only INT8, INT4 and FLOAT8 take it")
    if len(message.row_scale_bf16) % 2:
        raise WireError(f"row_scale_bf16 is {len(message.row_scale_bf16)} bytes; bfloat16 scales take 2 each")
    entries = len(message.row_scale) or len(message.row_scale_bf16) // 2 or len(message.row_scale_log)
    if not shape or entries != shape[0]:  # before decoding them: a forged length allocates nothing
        raise WireError(f"{field} has {entries} entries for shape {shape}; expected one per row")
    base = message.row_scale_log_base
    if field == "row_scale_log" and not (math.isfinite(base) and base > 0):
        raise WireError(f"row_scale_log_base is {base}; it must be finite and > 0")
    scales = row_scales(message)
    assert scales is not None
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise WireError(f"{field} holds a negative, NaN or Inf scale")


def row_scales(message: Tensor) -> np.ndarray | None:
    """A quantized tensor's per-row scales as float32 (from whichever form it carries, without torch), or None
    if it carries none. Unvalidated: `validate` checks them."""
    if message.row_scale:
        return np.asarray(message.row_scale, dtype=np.float32)
    if message.row_scale_bf16:
        return scale_forms.from_bf16(message.row_scale_bf16)
    if message.row_scale_log:
        return scale_forms.from_log(message.row_scale_log, message.row_scale_log_base)
    return None


def _check_video(message: Tensor, shape: list[int]) -> None:
    """An H.264 batch: uint8 [N, H, W], one non-empty packet per row of bounded size, adding up to the data."""
    if message.dtype != DTYPE_UINT8 or len(shape) != 3:
        raise WireError(f"H.264 video must be uint8 [N, H, W], got {DType.Name(message.dtype)} {shape}")
    if len(message.packet_sizes) != shape[0]:
        raise WireError(f"H.264 video has {len(message.packet_sizes)} packet sizes for {shape[0]} rows")
    limit = 2 * shape[1] * shape[2] + VIDEO_PACKET_SLACK_BYTES
    if any(not 0 < size <= limit for size in message.packet_sizes):
        raise WireError(f"H.264 packet sizes must be in [1, {limit}] bytes for {shape[1]}x{shape[2]} frames")
    if sum(message.packet_sizes) != len(message.data):
        raise WireError(
            f"H.264 packet sizes add up to {sum(message.packet_sizes)} bytes but data holds {len(message.data)}"
        )


def _check_zstd_header(data: bytes, expected_bytes: int) -> None:
    """Cheap checks on a zstd frame before anything is decompressed: it parses and declares the right size."""
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as error:
        raise WireError(f"tensor data is not a zstd frame: {error}") from None
    if declared not in (-1, expected_bytes):  # -1: size not recorded; decompression is bounded instead
        raise WireError(f"zstd frame declares {declared} bytes but the shape needs {expected_bytes}")


def _check_bool(data: bytes) -> None:
    if data and max(data) > 1:
        raise WireError(f"bool tensor holds byte value {max(data)}; only 0 and 1 are valid")


def element_bytes(message: Tensor, expected_bytes: int) -> bytes:
    """The element bytes of a validated message, decompressed; exactly `expected_bytes` long."""
    if message.compression == COMPRESSION_NONE:
        return message.data
    if message.compression == COMPRESSION_H264:
        raise WireError("an H.264 video tensor decodes only in its stream's video decoder (splitrl.core.video)")
    try:
        # max_output_size bounds the allocation when the frame does not record its size.
        data = zstandard.ZstdDecompressor().decompress(message.data, max_output_size=max(expected_bytes, 1))
    except zstandard.ZstdError as error:
        raise WireError(f"tensor data does not decompress: {error}") from None
    if len(data) != expected_bytes:
        raise WireError(f"tensor data decompresses to {len(data)} bytes but the shape needs {expected_bytes}")
    if message.dtype == DTYPE_BOOL:
        _check_bool(data)
    return data
