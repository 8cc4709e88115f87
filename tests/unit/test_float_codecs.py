"""splitrl.core.wire float codecs and compression: error bounds, byte sizes, and refusal of bad messages."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrl.core import scale_forms, wire

DType = wire.DType
ROWS, WIDTH = 16, 256


def activations(seed: int = 0) -> torch.Tensor:
    """ReLU-like activations with rows of very different magnitudes (1e-4 to 1e2), as an encoder produces."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = torch.logspace(-4, 2, ROWS)[:, None]
    return torch.relu(torch.randn(ROWS, WIDTH, generator=generator)) * magnitudes


def closer_activations() -> torch.Tensor:
    """ROWS rows whose magnitudes lie within 10**1.75 of each other: inside the log scale form's range."""
    return activations()[-8:].repeat(2, 1)


#: How much coarser than its row's own a quantization step can be, by the form its scale crossed in: bfloat16
#: (relative 2^-9, a factor 1 + 2^-8 with margin) or a log byte (rounded up by at most 2^(1/16)).
SCALE_SLACK = {"bf16": 1 + 2**-8, "log": 2 ** (1 / 16) * (1 + 2**-20)}


@pytest.mark.parametrize("rows", [ROWS, 4], ids=["log-scales", "bf16-scales"])
@pytest.mark.parametrize("codec", wire.FLOAT_CODECS)
def test_every_codec_round_trips_within_its_precision(codec, rows):
    values = activations()[-rows:] if rows < ROWS else closer_activations()
    message = wire.encode_float(values, codec)
    decoded = wire.decode_float(message)

    assert decoded.dtype == torch.float32
    assert decoded.shape == values.shape
    # Per-row relative error bound: bf16 keeps 8 mantissa bits; int8 / int4 are within half a step of 127 / 7
    # levels of the row's max, the step being the scale as the receiver reads it; e4m3 keeps 3 mantissa bits
    # (relative 2^-4) above its subnormal range.
    slack = SCALE_SLACK["log" if message.row_scale_log else "bf16"]
    row_max = values.abs().amax(dim=1, keepdim=True)
    error = (decoded - values).abs()
    bound = {
        "bf16": values.abs() * 2**-8,
        "int8": row_max / 127 / 2 * slack,
        "int4": row_max / 7 / 2 * slack,
        "fp8": values.abs() * 2**-4 + row_max / 448 * 2**-9 * slack + row_max * (slack - 1),
    }
    precision = codec.split("+")[0]
    assert bool((error <= bound[precision] + 1e-12).all()), float((error - bound[precision]).max())


@pytest.mark.parametrize("codec", ["int8", "fp8"])
def test_quantized_codecs_send_one_byte_per_number_plus_a_scale_per_row(codec):
    message = wire.encode_float(activations(), codec)

    assert len(message.data) == ROWS * WIDTH
    message = wire.encode_float(closer_activations(), codec)
    assert len(message.row_scale_log) == ROWS and message.row_scale_log_base > 0  # one byte per row, one base
    assert not message.row_scale and not message.row_scale_bf16
    bf16 = wire.encode_float(activations(), "bf16")
    assert message.ByteSize() < 0.52 * bf16.ByteSize()


@pytest.mark.parametrize("rows", [4, 5, 6, 64])
def test_scales_cross_in_whichever_form_is_smaller(rows):
    values = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
    message = wire.encode_float(values, "int4")
    as_bf16 = wire.Tensor()
    as_bf16.CopyFrom(message)
    as_bf16.ClearField("row_scale_log")
    as_bf16.ClearField("row_scale_log_base")
    as_bf16.row_scale_bf16 = (
        torch.from_numpy(wire.row_scales(message)).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    )
    assert bool(message.row_scale_log) == (rows > scale_forms.LOG_MIN_ROWS)
    assert message.ByteSize() <= as_bf16.ByteSize()
    if rows > scale_forms.LOG_MIN_ROWS:
        assert message.ByteSize() <= as_bf16.ByteSize() - rows + 5  # one byte a row, one float32 base


def test_log_scales_round_up_within_a_16th_of_an_octave():
    floor = 3.0 / 2 ** (254 / 16)  # the smallest scale the form names below a top of 3
    exact = np.array([0.0, 3.0, 1.0, 2.5e-3, floor * 1.01, floor * 1.0001], dtype=np.float32)
    sent, fields = scale_forms.pack(exact)
    codes = np.frombuffer(fields["row_scale_log"], dtype=np.uint8)
    assert codes[0] == 0 and sent[0] == 0  # an all-zero row
    assert codes[1] == scale_forms.LOG_MAX_CODE and codes[5] == 2  # just above the floor: the next code up
    assert np.all(sent >= exact) and np.all(sent[1:] <= exact[1:] * 2 ** (1 / 16) * (1 + 1e-6))
    assert np.array_equal(scale_forms.from_log(fields["row_scale_log"], fields["row_scale_log_base"]), sent)
    _, fields = scale_forms.pack(np.full(8, 1e-40, dtype=np.float32))  # too small for a normal float32 base
    assert "row_scale_bf16" in fields


@settings(max_examples=300, deadline=None)
@given(
    top=st.floats(1e-27, 1e36).map(np.float32),  # any row above 2**-126 * 2**(254/16): a normal base
    ratios=st.lists(st.floats(2 ** -(254 / 16) * 1.001, 1.0).map(np.float32), min_size=6, max_size=40),
)
def test_fuzzed_log_scales_are_never_below_their_rows_nor_a_16th_octave_above(top, ratios):
    exact = (np.float32(top) * np.array(ratios, dtype=np.float32)).astype(np.float32)
    sent, fields = scale_forms.pack(exact)
    assert "row_scale_log" in fields  # every row within the form's range, the base a normal float32
    assert np.all(sent >= exact)  # the quantizer's clamp never has to cut a row's largest element
    assert np.all(sent <= exact.astype(np.float64) * 2 ** (1 / 16) * (1 + 1e-6))


def test_a_forged_scale_length_is_refused_before_the_scales_are_decoded():
    message = wire.encode_float(torch.ones(2, 4), "int8")
    message.ClearField("row_scale_bf16")
    message.row_scale_log, message.row_scale_log_base = bytes(8 * 1024 * 1024), 1.0  # 8 MiB of codes for 2 rows
    with pytest.raises(wire.WireError, match="row_scale_log has 8388608 entries for shape \\[2, 4\\]"):
        wire.decode_float(message)


def test_rows_beyond_the_log_range_keep_bfloat16_scales():
    # activations() spans 1e-4..1e2 between rows (1e6x): a log byte would coarsen the smallest rows' steps.
    message = wire.encode_float(activations(), "int8")
    assert message.row_scale_bf16 and not message.row_scale_log
    assert wire.encode_float(closer_activations(), "int8").row_scale_log


def test_bf16_scales_round_as_torch_rounds():
    generator = torch.Generator().manual_seed(0)
    exact = torch.cat([torch.rand(1000, generator=generator) * 10.0 ** torch.randint(-30, 30, (1000,)), torch.zeros(1)])
    exact = torch.cat([exact, (exact.view(torch.int32) | 0x8000).view(torch.float32)])  # ties and near-ties
    for chunk in exact.split(5):
        sent, _ = scale_forms.pack(chunk.numpy())
        assert np.array_equal(sent, chunk.to(torch.bfloat16).float().numpy())


def test_int4_packs_two_numbers_per_byte_low_nibble_first():
    message = wire.encode_float(activations(), "int4")
    assert message.dtype == wire.DTYPE_INT4 and len(message.data) == ROWS * WIDTH // 2
    assert message.ByteSize() < 0.27 * wire.encode_float(activations(), "bf16").ByteSize()

    odd = wire.encode_float(torch.tensor([[7.0, -7.0, 1.0]]), "int4")  # scale 1: elements 7, -7, 1
    assert odd.data == bytes([0x7 | (0x9 << 4), 0x1])  # -7 is nibble 0x9; the padding nibble is 0
    assert wire.decode_float(odd).tolist() == [[7.0, -7.0, 1.0]]


@pytest.mark.parametrize(
    ("data", "error"),
    [(bytes([0x08, 0x00]), "holds -8"), (bytes([0x11, 0x10]), "non-zero padding nibble"), (b"\x11", "needs 2")],
)
def test_corrupt_int4_tensors_are_refused(data, error):
    message = wire.Tensor(dtype=wire.DTYPE_INT4, shape=[1, 3], data=data, row_scale=[1.0])
    with pytest.raises(wire.WireError, match=error):
        wire.decode_float(message)


def test_all_zero_rows_get_scale_zero_and_decode_to_zero():
    values = torch.zeros(3, 8)
    values[1] = 2.0
    message = wire.encode_float(values, "int8")

    assert wire.row_scales(message).tolist() == [0.0, pytest.approx(2.0 / 127, rel=2**-8), 0.0]
    decoded = wire.decode_float(message)
    assert torch.equal(decoded[[0, 2]], values[[0, 2]]) and torch.allclose(decoded[1], values[1], rtol=2**-8)


def test_float32_row_scales_are_still_read():
    """A sender may put exact float32 scales in `row_scale` instead of bfloat16 ones."""
    values = torch.tensor([[1.0, -3.0], [0.5, 0.25]])
    message = wire.encode_float(values, "int8")
    message.row_scale.extend(wire.row_scales(message).tolist())
    message.row_scale_bf16 = b""
    assert torch.allclose(wire.decode_float(message), values, atol=3.0 / 254)
    message.row_scale[1] = -1.0
    with pytest.raises(wire.WireError, match="row_scale holds a negative"):
        wire.decode_float(message)


def test_zstd_is_left_out_where_it_would_not_shrink_the_data():
    """A narrow activation row: a zstd frame of 64 random int4 bytes is larger than the bytes."""
    message = wire.encode_float(torch.randn(4, 32, generator=torch.Generator().manual_seed(0)), "int4+zstd")
    assert message.compression == wire.COMPRESSION_NONE and len(message.data) == 64
    assert message.ByteSize() == wire.encode_float(torch.randn(4, 32), "int4").ByteSize()


def test_zstd_shrinks_redundant_data_and_records_its_size():
    frame = torch.zeros(1, 96, 96, dtype=torch.uint8)
    frame[0, 40:60, 40:60] = 200
    message = wire.encode(frame, compress=True)

    assert message.compression == wire.COMPRESSION_ZSTD
    assert len(message.data) < frame.numel() / 20
    assert torch.equal(wire.decode(message, expect_dtype=wire.DTYPE_UINT8, expect_shape=[None, 96, 96]), frame)


def test_empty_batches_round_trip_in_every_codec():
    for codec in wire.FLOAT_CODECS:
        assert wire.decode_float(wire.encode_float(torch.zeros(0, WIDTH), codec)).shape == (0, WIDTH)


def test_unknown_codec_and_non_finite_input_are_refused_by_the_sender():
    with pytest.raises(ValueError, match="unknown float codec 'int2'"):
        wire.encode_float(activations(), "int2")  # type: ignore[arg-type]
    with pytest.raises(wire.WireError, match="NaN or Inf"):
        wire.encode_float(torch.tensor([[1.0, math.inf]]), "int8")
    with pytest.raises(wire.WireError, match="rank >= 1"):
        wire.encode_float(torch.tensor(1.0), "fp8")


def quantized_message() -> wire.Tensor:
    """int8+zstd with bfloat16 scales (rows spanning more than the log form's range); tests may swap in the log form."""
    message = wire.encode_float(activations(), "int8+zstd")
    assert message.row_scale_bf16
    return message


def with_log_scales(message: wire.Tensor, codes: bytes | None = None, base: float | None = None) -> None:
    log = wire.encode_float(closer_activations(), "int8")
    message.ClearField("row_scale_bf16")
    message.row_scale_log = log.row_scale_log if codes is None else codes
    message.row_scale_log_base = log.row_scale_log_base if base is None else base


@pytest.mark.parametrize(
    ("corrupt", "error"),
    [
        (lambda m: setattr(m, "row_scale_bf16", m.row_scale_bf16[:-2]), "row_scale_bf16 has 15 entries"),
        (lambda m: setattr(m, "row_scale_bf16", m.row_scale_bf16[:-1]), "31 bytes; bfloat16 scales take 2 each"),
        (lambda m: setattr(m, "row_scale_bf16", b"\xc0\x7f" + m.row_scale_bf16[2:]), "negative, NaN or Inf"),
        (lambda m: setattr(m, "row_scale_bf16", b"\x80\xbf" + m.row_scale_bf16[2:]), "negative, NaN or Inf"),
        (lambda m: m.row_scale.extend([1.0] * ROWS), "carries row_scale and row_scale_bf16"),
        (lambda m: with_log_scales(m, codes=bytes(ROWS - 1)), "row_scale_log has 15 entries"),
        (lambda m: with_log_scales(m, base=0.0), "row_scale_log_base is 0.0; it must be finite and > 0"),
        (lambda m: with_log_scales(m, base=-1.0), "row_scale_log_base is -1.0"),
        (lambda m: with_log_scales(m, base=math.nan), "row_scale_log_base is nan"),
        (
            lambda m: with_log_scales(m, base=3e38, codes=bytes([255] * ROWS)),
            "row_scale_log holds a negative, NaN or Inf",
        ),
        (lambda m: setattr(m, "row_scale_log_base", 1.0), "row_scale_log_base is set without row_scale_log"),
        (lambda m: setattr(m, "row_scale_log", bytes(ROWS)), "carries row_scale_bf16 and row_scale_log"),
        (lambda m: setattr(m, "data", b"not zstd at all"), "not a zstd frame"),
        (lambda m: setattr(m, "data", m.data[:-4]), "does not decompress|decompresses to"),
        (lambda m: m.shape.__setitem__(1, WIDTH - 1), "declares 4096 bytes but the shape needs 4080"),
        (lambda m: setattr(m, "compression", 7), "unknown tensor compression 7"),
    ],
)
def test_corrupt_quantized_or_compressed_tensors_are_refused(corrupt, error):
    message = quantized_message()
    corrupt(message)
    with pytest.raises(wire.WireError, match=error):
        wire.decode_float(message)


def test_decode_float_refuses_integer_tensors_and_non_finite_values():
    with pytest.raises(wire.WireError, match="DTYPE_INT64 is not a float encoding"):
        wire.decode_float(wire.encode(torch.ones(2, 2, dtype=torch.int64)))
    with pytest.raises(wire.WireError, match="DTYPE_INT8 is not a float encoding"):
        wire.decode_float(wire.encode(torch.ones(2, 2, dtype=torch.int8)))  # int8 without scales
    with pytest.raises(wire.WireError, match="NaN or Inf"):
        wire.decode_float(wire.encode(torch.tensor([[1.0, math.nan]]), wire.DTYPE_BFLOAT16))
    with pytest.raises(wire.WireError, match="row_scale is set on a DTYPE_BFLOAT16"):
        message = wire.encode_float(activations(), "bf16")
        message.row_scale.extend([1.0] * ROWS)
        wire.decode_float(message)


def test_a_zstd_bomb_cannot_allocate_past_the_limit():
    huge = wire.encode(torch.zeros(4096, 4096, dtype=torch.uint8), compress=True)  # 16 MiB of zeros, ~500 B packed
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.decode(huge, max_bytes=1024 * 1024)


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(sorted(DType.values())),
    shape=st.lists(st.integers(-2, 40), max_size=3),
    data=st.binary(max_size=256),
    compression=st.integers(0, 3),
    scales=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=4),
    log_scales=st.binary(max_size=6),
    log_base=st.floats(allow_nan=True, allow_infinity=True, width=32),
    packet_sizes=st.lists(st.integers(0, 300), max_size=4),
)
def test_fuzzed_messages_decode_or_raise_wire_error(
    dtype, shape, data, compression, scales, log_scales, log_base, packet_sizes
):
    """Any message at all: decoding either succeeds or raises WireError, never anything else."""
    message = wire.Tensor(
        dtype=dtype,
        shape=shape,
        data=data,
        compression=compression,
        row_scale=scales,
        row_scale_log=log_scales,
        row_scale_log_base=log_base,
        packet_sizes=packet_sizes,
    )
    for decode in (wire.decode, wire.decode_float, wire.video_packets):
        with contextlib.suppress(wire.WireError):
            decode(message, max_bytes=4096)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(0, 6),
    width=st.integers(1, 16),
    codec=st.sampled_from(wire.FLOAT_CODECS),
    scale=st.floats(1e-30, 1e30),
    data=st.data(),
)
def test_fuzzed_floats_round_trip_with_bounded_error(rows, width, codec, scale, data):
    values = (
        torch.tensor(
            data.draw(st.lists(st.floats(-1, 1, width=32), min_size=rows * width, max_size=rows * width)),
            dtype=torch.float32,
        ).reshape(rows, width)
        * scale
    )
    message = wire.encode_float(values, codec)
    decoded = wire.decode_float(message)
    row_max = values.abs().amax(dim=1, keepdim=True) if rows else values
    # Half a step of the coarsest codec (int4: 7 levels of the row's max) with its scale as the receiver reads it
    # (a hair past 1/14 of the max), and e4m3's 2^-4 relative error.
    slack = SCALE_SLACK["log" if message.row_scale_log else "bf16"]
    assert bool(((decoded - values).abs() <= row_max * (0.5 / 7) * slack + 1e-30).all())


def test_int4_is_only_reached_through_encode_float_and_counts_its_elements_exactly():
    from splitrl.core.link_meter import tensor_elements

    with pytest.raises(wire.WireError, match="encode_float"):
        wire.encode(torch.ones(2, 3), wire.DTYPE_INT4)
    for count in (1, 3, 4):  # an odd count leaves half a byte of padding, which is no element
        assert tensor_elements(wire.encode_float(torch.ones(1, count), "int4")) == count
