"""Tensor <-> bytes: the only module that touches raw tensor bytes.

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
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

import numpy as np
import zstandard

from splitrl.core import scale_forms
from splitrl.core.config import FloatCodec
from splitrl.v1 import tensor_pb2

if TYPE_CHECKING:
    import torch

Tensor = tensor_pb2.Tensor
DType = tensor_pb2.DType
Compression = tensor_pb2.Compression

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
class _DTypeInfo:
    torch_name: str  # the torch dtype decode returns; INT4 comes back unpacked, one int8 per element
    bits: int  # per element on the wire
    numpy: np.dtype[Any] | None = None  # the numpy dtype decode_array returns; None: numpy has none

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.torch_name)  # type: ignore[no-any-return]


_DTYPES: dict[int, _DTypeInfo] = {
    DType.DTYPE_BFLOAT16: _DTypeInfo("bfloat16", 16),
    DType.DTYPE_FLOAT32: _DTypeInfo("float32", 32, np.dtype(np.float32)),
    DType.DTYPE_UINT8: _DTypeInfo("uint8", 8, np.dtype(np.uint8)),
    DType.DTYPE_INT8: _DTypeInfo("int8", 8, np.dtype(np.int8)),
    DType.DTYPE_INT64: _DTypeInfo("int64", 64, np.dtype(np.int64)),
    DType.DTYPE_FLOAT16: _DTypeInfo("float16", 16, np.dtype(np.float16)),
    DType.DTYPE_BOOL: _DTypeInfo("bool", 8, np.dtype(np.bool_)),
    DType.DTYPE_FLOAT8_E4M3FN: _DTypeInfo("float8_e4m3fn", 8),
    DType.DTYPE_INT4: _DTypeInfo("int8", 4, np.dtype(np.int8)),
}
#: Quantized dtypes and the largest magnitude a row is scaled to (int8 and int4 are symmetric: -128 and -8 unused).
_QUANTIZED_LIMIT: dict[int, float] = {
    DType.DTYPE_INT8: 127.0,
    DType.DTYPE_INT4: 7.0,
    DType.DTYPE_FLOAT8_E4M3FN: 448.0,
}
_FLOAT_DTYPES = frozenset({DType.DTYPE_BFLOAT16, DType.DTYPE_FLOAT16, DType.DTYPE_FLOAT32, DType.DTYPE_FLOAT8_E4M3FN})
_CODEC_DTYPES = {
    "bf16": DType.DTYPE_BFLOAT16,
    "int8": DType.DTYPE_INT8,
    "int4": DType.DTYPE_INT4,
    "fp8": DType.DTYPE_FLOAT8_E4M3FN,
}
#: The wire dtype of each torch dtype name and numpy dtype `encode` takes (INT4 has neither: encode_float packs it).
_BY_TORCH: dict[str, int] = {info.torch_name: code for code, info in _DTYPES.items() if code != DType.DTYPE_INT4}
_BY_NUMPY: dict[np.dtype[Any], int] = {
    info.numpy: code for code, info in _DTYPES.items() if info.numpy is not None and code != DType.DTYPE_INT4
}
#: Largest H.264 packet accepted for one frame of P pixels: 2 P + 1 KiB (a lossless keyframe of noise stays below).
_VIDEO_PACKET_SLACK_BYTES = 1024

#: Wire dtype names as used in configuration ("bfloat16", "uint8", ...).
DTYPE_NAMES: dict[str, int] = {DType.Name(code).removeprefix("DTYPE_").lower(): code for code in _DTYPES}


def dtype_code(name: str) -> int:
    """The wire DType for a configuration name such as "bfloat16"; ValueError if unknown."""
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_NAMES)}") from None


def data_bytes(dtype: int, elements: int) -> int:
    """Bytes that `elements` elements of a wire DType occupy, uncompressed (INT4: half a byte each, rounded up)."""
    return (elements * _info(dtype).bits + 7) // 8


def elements_in(dtype: int, nbytes: int) -> int:
    """Most elements of a wire DType that `nbytes` uncompressed bytes can hold."""
    return nbytes * 8 // _info(dtype).bits


def _info(dtype: int) -> _DTypeInfo:
    info = _DTYPES.get(dtype)
    if info is None:
        name = DType.Name(dtype) if dtype in DType.values() else str(dtype)
        raise WireError(f"unsupported tensor dtype {name}; expected one of {sorted(DTYPE_NAMES)}")
    return info


def encode(value: torch.Tensor | np.ndarray, dtype: int | None = None, *, compress: bool = False) -> Tensor:
    """Encode a tensor; with `dtype`, convert to that wire dtype first (e.g. float32 -> bfloat16).

    `compress` packs the bytes as one zstd frame (level ZSTD_LEVEL) that records its content size.
    """
    if dtype == DType.DTYPE_INT4:
        raise WireError("int4 has no torch dtype to convert to; quantize with encode_float(value, 'int4')")
    if isinstance(value, np.ndarray) and (dtype is None or _info(dtype).numpy is not None):
        return _encode_array(value, dtype, compress)
    return _encode_tensor(_from_numpy(value) if isinstance(value, np.ndarray) else value, dtype, compress)


def _encode_array(array: np.ndarray, dtype: int | None, compress: bool) -> Tensor:
    """encode's numpy path (no torch): native byte order, row-major."""
    if dtype is not None:
        array = array.astype(_info(dtype).numpy)
    native_dtype = array.dtype.newbyteorder("=")
    code = _BY_NUMPY.get(native_dtype)
    if code is None:
        raise WireError(f"cannot encode numpy dtype {array.dtype}; supported: {sorted(DTYPE_NAMES)}")
    native = np.ascontiguousarray(array, dtype=native_dtype)  # 1-d for a 0-d array: the shape is array's
    return _message(code, array.shape, native.tobytes(), compress)


def _encode_tensor(tensor: torch.Tensor, dtype: int | None, compress: bool) -> Tensor:
    import torch

    tensor = tensor.detach().cpu()
    if dtype is not None:
        tensor = tensor.to(_info(dtype).torch_dtype)
    code = _BY_TORCH.get(str(tensor.dtype).removeprefix("torch."))
    if code is None:
        raise WireError(f"cannot encode torch dtype {tensor.dtype}; supported: {sorted(DTYPE_NAMES)}")
    tensor = tensor.contiguous()
    # numpy has no bfloat16 or float8: reinterpret them as same-size integers to reach the raw bytes.
    raw = tensor
    if tensor.dtype in (torch.bfloat16, torch.float16):
        raw = tensor.view(torch.int16)
    elif tensor.dtype == torch.float8_e4m3fn:
        raw = tensor.view(torch.uint8)
    return _message(code, tensor.shape, raw.numpy().tobytes(), compress)


def _message(dtype: int, shape: Sequence[int], data: bytes, compress: bool) -> Tensor:
    """`compress`: zstd, unless the frame would not be smaller than `data` (a zstd frame costs ~9 bytes of its
    own, more than it saves on the tens of bytes of a narrow activation row)."""
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data) if compress else data
    if len(packed) >= len(data):
        return Tensor(dtype=dtype, shape=list(shape), data=data)  # type: ignore[arg-type]
    return Tensor(
        dtype=dtype,  # type: ignore[arg-type]
        shape=list(shape),
        data=packed,
        compression=Compression.COMPRESSION_ZSTD,
    )


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
    if precision not in _CODEC_DTYPES or packing not in ("", "zstd"):
        raise ValueError(f"unknown float codec {codec!r}; expected one of {list(FLOAT_CODECS)}")
    compress = packing == "zstd"
    dtype = _CODEC_DTYPES[precision]
    if dtype == DType.DTYPE_BFLOAT16:
        return encode(value, dtype, compress=compress)
    if value.dim() == 0:
        raise WireError(f"codec {codec!r} scales per row and needs a tensor of rank >= 1, got a scalar")
    rows = value.detach().cpu().float().reshape(value.shape[0], math.prod(value.shape[1:]))
    if not bool(torch.isfinite(rows).all()):
        raise WireError(f"cannot quantize a tensor holding NaN or Inf with codec {codec!r}")
    limit = _QUANTIZED_LIMIT[dtype]
    exact = rows.abs().amax(dim=1) / limit if rows.numel() else torch.zeros(rows.shape[0])
    sent, scale_fields = scale_forms.pack(exact.numpy())
    scale = torch.from_numpy(sent)
    scaled = rows / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
    if dtype == DType.DTYPE_FLOAT8_E4M3FN:
        quantized = scaled.clamp(-limit, limit).to(torch.float8_e4m3fn)
    else:
        quantized = scaled.round().clamp(-limit, limit).to(torch.int8)
    if dtype == DType.DTYPE_INT4:
        message = _message(dtype, value.shape, _pack_int4(quantized), compress)
    else:
        message = encode(quantized.reshape(value.shape), compress=compress)
    for field, value in scale_fields.items():
        setattr(message, field, value)
    return message


def _pack_int4(values: torch.Tensor) -> bytes:
    """int8 values in [-7, 7] -> two's-complement nibbles, element 2k low and 2k+1 high in byte k."""
    nibbles = values.reshape(-1).numpy().astype(np.uint8) & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()


def _unpack_int4(data: bytes, count: int) -> np.ndarray:
    """The inverse of _pack_int4: `count` int8 elements; WireError for -8 or a set padding nibble."""
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


def encode_packets(packets: Sequence[bytes], shape: Sequence[int]) -> Tensor:
    """A batch of frames as video: one H.264 packet per row of uint8 `shape` [N, H, W] (see splitrl.core.video)."""
    if len(shape) != 3 or len(packets) != shape[0]:
        raise WireError(f"video needs one packet per row of an [N, H, W] shape; got {len(packets)} for {list(shape)}")
    return Tensor(
        dtype=DType.DTYPE_UINT8,
        shape=list(shape),
        data=b"".join(packets),
        compression=Compression.COMPRESSION_H264,
        packet_sizes=[len(packet) for packet in packets],
    )


def video_packets(
    message: Tensor, *, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES, expect_shape: Sequence[int | None] | None = None
) -> list[bytes]:
    """Validate a COMPRESSION_H264 tensor (see `validate`) and split its data into one packet per row."""
    if message.compression != Compression.COMPRESSION_H264:
        raise WireError(f"expected an H.264 video tensor, got compression {message.compression}")
    validate(message, max_bytes=max_bytes, expect_dtype=DType.DTYPE_UINT8, expect_shape=expect_shape)
    offsets = np.cumsum([0, *message.packet_sizes]).tolist()
    return [message.data[start:end] for start, end in itertools.pairwise(offsets)]


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
    expected_bytes = data_bytes(message.dtype, math.prod(shape))
    if expected_bytes > max_bytes:
        raise WireError(f"tensor of shape {shape} needs {expected_bytes} bytes, over the limit of {max_bytes}")
    _check_row_scale(message, shape)
    if message.packet_sizes and message.compression != Compression.COMPRESSION_H264:
        raise WireError("packet_sizes is set on a tensor that is not H.264 video")
    if message.compression == Compression.COMPRESSION_ZSTD:
        _check_zstd_header(message.data, expected_bytes)
    elif message.compression == Compression.COMPRESSION_H264:
        _check_video(message, shape)
    elif message.compression != Compression.COMPRESSION_NONE:
        raise WireError(f"unknown tensor compression {message.compression}; expected NONE, ZSTD or H264")
    elif len(message.data) != expected_bytes:
        raise WireError(
            f"tensor data is {len(message.data)} bytes but shape {shape} x {info.bits} bits "
            f"({DType.Name(message.dtype)}) needs {expected_bytes}"
        )
    if message.dtype == DType.DTYPE_BOOL and message.compression == Compression.COMPRESSION_NONE:
        _check_bool(message.data)


#: The fields that can carry a quantized tensor's row scales (splitrl.core.scale_forms): one at most.
_SCALE_FIELDS = ("row_scale", "row_scale_bf16", "row_scale_log")


def _check_row_scale(message: Tensor, shape: list[int]) -> None:
    present = [field for field in _SCALE_FIELDS if getattr(message, field)]
    if len(present) > 1:
        raise WireError(f"tensor carries {' and '.join(present)}; send one")
    if message.row_scale_log_base and not message.row_scale_log:
        raise WireError("row_scale_log_base is set without row_scale_log")
    if not present:
        return
    field = present[0]
    if message.dtype not in _QUANTIZED_LIMIT:
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
    if message.dtype != DType.DTYPE_UINT8 or len(shape) != 3:
        raise WireError(f"H.264 video must be uint8 [N, H, W], got {DType.Name(message.dtype)} {shape}")
    if len(message.packet_sizes) != shape[0]:
        raise WireError(f"H.264 video has {len(message.packet_sizes)} packet sizes for {shape[0]} rows")
    limit = 2 * shape[1] * shape[2] + _VIDEO_PACKET_SLACK_BYTES
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


def _elements(message: Tensor, expected_bytes: int) -> bytes:
    """The element bytes of a validated message, decompressed; exactly `expected_bytes` long."""
    if message.compression == Compression.COMPRESSION_NONE:
        return message.data
    if message.compression == Compression.COMPRESSION_H264:
        raise WireError("an H.264 video tensor decodes only in its stream's video decoder (splitrl.core.video)")
    try:
        # max_output_size bounds the allocation when the frame does not record its size.
        data = zstandard.ZstdDecompressor().decompress(message.data, max_output_size=max(expected_bytes, 1))
    except zstandard.ZstdError as error:
        raise WireError(f"tensor data does not decompress: {error}") from None
    if len(data) != expected_bytes:
        raise WireError(f"tensor data decompresses to {len(data)} bytes but the shape needs {expected_bytes}")
    if message.dtype == DType.DTYPE_BOOL:
        _check_bool(data)
    return data


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
    info = _DTYPES[message.dtype]
    if info.numpy is not None:
        return torch.from_numpy(_array(message))
    shape = tuple(message.shape)
    data = _elements(message, data_bytes(message.dtype, math.prod(shape)))
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
    _elements(message, data_bytes(message.dtype, math.prod(message.shape)))


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
    if _DTYPES[message.dtype].numpy is None:
        raise WireError(f"{DType.Name(message.dtype)} has no numpy dtype; decode it to a torch tensor")
    return _array(message)


def _array(message: Tensor) -> np.ndarray:
    """The elements of a validated message whose dtype numpy holds."""
    info = _DTYPES[message.dtype]
    shape = tuple(message.shape)
    data = _elements(message, data_bytes(message.dtype, math.prod(shape)))
    if message.dtype == DType.DTYPE_INT4:
        return _unpack_int4(data, math.prod(shape)).reshape(shape)
    # bytearray makes the one copy that gives numpy a writable buffer it owns.
    return np.frombuffer(bytearray(data), dtype=info.numpy).reshape(shape)


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
    _info(message.dtype)  # an unknown dtype is reported as such
    # int8 and int4 are float encodings only with their scales (an empty batch has none to carry).
    scaled_int = message.dtype in (DType.DTYPE_INT8, DType.DTYPE_INT4) and (
        any(getattr(message, field) for field in _SCALE_FIELDS) or message.shape[:1] == [0]  # present, not decoded
    )
    if message.dtype not in _FLOAT_DTYPES and not scaled_int:
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


def num_elements(message: Tensor) -> int:
    """Number of elements a Tensor message declares ("numbers", the research's unit)."""
    return math.prod(message.shape)
