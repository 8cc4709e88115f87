"""Tensor <-> bytes: the only module that touches raw tensor bytes.

A `splitrl.v1.Tensor` holds a dtype, a shape and the elements as row-major,
little-endian bytes. `encode` builds one from a torch tensor or numpy array;
`decode` checks every invariant before it trusts the bytes and raises
`WireError` (a ValueError) naming the mismatch. Servers turn WireError into
gRPC INVALID_ARGUMENT (see splitrl.core.rpc).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from splitrl.v1 import tensor_pb2

Tensor = tensor_pb2.Tensor
DType = tensor_pb2.DType

#: Default upper bound on one tensor's data, in bytes (64 MiB). gRPC's own
#: message limit is set separately (splitrl.core.rpc); this bound stops a
#: forged shape from making a decoder allocate more than a message can hold.
DEFAULT_MAX_TENSOR_BYTES = 64 * 1024 * 1024

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("splitrl.core.wire assumes a little-endian host")


class WireError(ValueError):
    """A Tensor message that violates the wire format; the message says which rule."""


@dataclass(frozen=True)
class _DTypeInfo:
    torch_dtype: torch.dtype
    itemsize: int  # bytes per element


_DTYPES: dict[int, _DTypeInfo] = {
    DType.DTYPE_BFLOAT16: _DTypeInfo(torch.bfloat16, 2),
    DType.DTYPE_FLOAT32: _DTypeInfo(torch.float32, 4),
    DType.DTYPE_UINT8: _DTypeInfo(torch.uint8, 1),
    DType.DTYPE_INT8: _DTypeInfo(torch.int8, 1),
    DType.DTYPE_INT64: _DTypeInfo(torch.int64, 8),
    DType.DTYPE_FLOAT16: _DTypeInfo(torch.float16, 2),
    DType.DTYPE_BOOL: _DTypeInfo(torch.bool, 1),
}
_BY_TORCH: dict[torch.dtype, int] = {info.torch_dtype: code for code, info in _DTYPES.items()}

#: Wire dtype names as used in configuration ("bfloat16", "uint8", ...).
DTYPE_NAMES: dict[str, int] = {DType.Name(code).removeprefix("DTYPE_").lower(): code for code in _DTYPES}


def dtype_code(name: str) -> int:
    """The wire DType for a configuration name such as "bfloat16"; ValueError if unknown."""
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_NAMES)}") from None


def itemsize(dtype: int) -> int:
    """Bytes per element of a wire DType."""
    return _info(dtype).itemsize


def _info(dtype: int) -> _DTypeInfo:
    info = _DTYPES.get(dtype)
    if info is None:
        name = DType.Name(dtype) if dtype in DType.values() else str(dtype)
        raise WireError(f"unsupported tensor dtype {name}; expected one of {sorted(DTYPE_NAMES)}")
    return info


def encode(value: torch.Tensor | np.ndarray, dtype: int | None = None) -> Tensor:
    """Encode a tensor; with `dtype`, convert to that wire dtype first (e.g. float32 -> bfloat16)."""
    tensor = _from_numpy(value) if isinstance(value, np.ndarray) else value
    tensor = tensor.detach().cpu()
    if dtype is not None:
        tensor = tensor.to(_info(dtype).torch_dtype)
    code = _BY_TORCH.get(tensor.dtype)
    if code is None:
        raise WireError(f"cannot encode torch dtype {tensor.dtype}; supported: {sorted(DTYPE_NAMES)}")
    tensor = tensor.contiguous()
    # numpy has no bfloat16: reinterpret 2-byte types as int16 to reach the raw bytes.
    raw = tensor.view(torch.int16) if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
    return Tensor(dtype=code, shape=list(tensor.shape), data=raw.numpy().tobytes())  # type: ignore[arg-type]


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A torch view of any numpy array: native byte order, writable, and its shape kept (0-d too)."""
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
    info = _info(message.dtype)
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
    expected_bytes = math.prod(shape) * info.itemsize
    if expected_bytes > max_bytes:
        raise WireError(f"tensor of shape {shape} needs {expected_bytes} bytes, over the limit of {max_bytes}")
    if len(message.data) != expected_bytes:
        raise WireError(
            f"tensor data is {len(message.data)} bytes but shape {shape} x {info.itemsize} bytes "
            f"({DType.Name(message.dtype)}) needs {expected_bytes}"
        )
    if message.dtype == DType.DTYPE_BOOL and message.data and max(message.data) > 1:
        raise WireError(f"bool tensor holds byte value {max(message.data)}; only 0 and 1 are valid")


def decode(
    message: Tensor,
    *,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
    expect_dtype: int | None = None,
    expect_shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Validate (see `validate`) and return a fresh, writable torch tensor of the message's dtype."""
    validate(message, max_bytes=max_bytes, expect_dtype=expect_dtype, expect_shape=expect_shape)
    info = _DTYPES[message.dtype]
    shape = tuple(message.shape)
    if not message.data:
        return torch.empty(shape, dtype=info.torch_dtype)
    # bytearray makes the one copy that gives torch a writable buffer it owns.
    flat = torch.frombuffer(bytearray(message.data), dtype=info.torch_dtype)
    return flat.reshape(shape)


def num_elements(message: Tensor) -> int:
    """Number of elements a Tensor message declares ("numbers", the research's unit)."""
    return math.prod(message.shape)
