"""A float tensor on the wire with a FloatCodec: bf16 as it is; int8, int4 and fp8 scaled per row, the scales
carried in one of splitrl.core.scale_forms' byte forms; each optionally +zstd."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from splitrl.core import scale_forms
from splitrl.core.config import FloatCodec
from splitrl.core.wire.checks import SCALE_FIELDS, row_scales
from splitrl.core.wire.dtypes import (
    CODEC_DTYPES,
    DEFAULT_MAX_TENSOR_BYTES,
    DTYPE_BFLOAT16,
    DTYPE_FLOAT8_E4M3FN,
    DTYPE_INT4,
    DTYPE_INT8,
    FLOAT_CODECS,
    FLOAT_DTYPES,
    QUANTIZED_LIMIT,
    DType,
    Tensor,
    WireError,
    dtype_info,
)
from splitrl.core.wire.tensors import decode, encode, pack_int4, tensor_message

if TYPE_CHECKING:
    import torch


def encode_float(value: torch.Tensor, codec: FloatCodec) -> Tensor:
    """Put a float tensor of rank >= 1 on the wire with `codec` (one of FLOAT_CODECS).

    bf16 rounds to bfloat16. int8, int4 and fp8 scale each row (outermost dimension) so its largest
    magnitude becomes 127 (int8, rounded), 7 (int4, rounded; packed two per byte) or 448 (float8
    e4m3), and send the scales in bfloat16 (`row_scale_bf16`) or, for more than a few rows, in one byte each
    (`row_scale_log`; splitrl.core.scale_forms). Each element is quantized against its row's scale as the
    receiver reads it, so rounding the scale costs no accuracy beyond the quantization's; an all-zero row
    gets scale 0.
    "+zstd" compresses the elements where that makes them smaller. NaN or Inf cannot be quantized: WireError.
    """
    import torch

    precision, _, packing = codec.partition("+")
    if precision not in CODEC_DTYPES or packing not in ("", "zstd"):
        raise ValueError(f"unknown float codec {codec!r}; expected one of {list(FLOAT_CODECS)}")
    compress = packing == "zstd"
    dtype = CODEC_DTYPES[precision]
    if dtype == DTYPE_BFLOAT16:
        return encode(value, dtype, compress=compress)
    if value.dim() == 0:
        raise WireError(f"codec {codec!r} scales per row and needs a tensor of rank >= 1, got a scalar")
    rows = value.detach().cpu().float().reshape(value.shape[0], math.prod(value.shape[1:]))
    if not bool(torch.isfinite(rows).all()):
        raise WireError(f"cannot quantize a tensor holding NaN or Inf with codec {codec!r}")
    limit = QUANTIZED_LIMIT[dtype]
    exact = rows.abs().amax(dim=1) / limit if rows.numel() else torch.zeros(rows.shape[0])
    sent, scale_fields = scale_forms.pack(exact.numpy())
    scale = torch.from_numpy(sent)
    scaled = rows / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
    if dtype == DTYPE_FLOAT8_E4M3FN:
        quantized = scaled.clamp(-limit, limit).to(torch.float8_e4m3fn)
    else:
        quantized = scaled.round().clamp(-limit, limit).to(torch.int8)
    if dtype == DTYPE_INT4:
        message = tensor_message(dtype, value.shape, pack_int4(quantized), compress)
    else:
        message = encode(quantized.reshape(value.shape), compress=compress)
    for field, value in scale_fields.items():
        setattr(message, field, value)
    return message


def decode_float(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_shape: Sequence[int | None] | None = None,
    max_magnitude: float | None = None,
) -> torch.Tensor:
    """Decode a float tensor sent with any FloatCodec (or plain float16/float32) as float32.

    Quantized elements are multiplied by their row's scale. Raises WireError for a tensor that is
    not a float encoding (e.g. int8 without row_scale), that holds NaN or Inf, or that holds a value
    beyond `max_magnitude` (finite but absurd, e.g. bf16 2**121: it would overflow a loss downstream).
    """
    dtype_info(message.dtype)  # an unknown dtype is reported as such
    # int8 and int4 are float encodings only with their scales (an empty batch has none to carry).
    scaled_int = message.dtype in (DTYPE_INT8, DTYPE_INT4) and (
        any(getattr(message, field) for field in SCALE_FIELDS) or message.shape[:1] == [0]  # present, not decoded
    )
    if message.dtype not in FLOAT_DTYPES and not scaled_int:
        raise WireError(
            f"tensor dtype {DType.Name(message.dtype)} is not a float encoding "
            "(bf16, fp16, fp32, or int8/int4/fp8 with row_scale)"
        )
    import torch

    values = decode(message, max_bytes=max_bytes, expect_shape=expect_shape).float()
    if (scales := row_scales(message)) is not None:
        scale = torch.from_numpy(scales.copy())
        values = (values.reshape(len(scale), -1) * scale[:, None]).reshape(values.shape)
    if not bool(torch.isfinite(values).all()):
        raise WireError("tensor holds NaN or Inf")
    if max_magnitude is not None and values.numel() and (largest := float(values.abs().max())) > max_magnitude:
        raise WireError(f"tensor holds |value| {largest:.4g}, beyond this link's bound {max_magnitude:.4g}")
    return values
