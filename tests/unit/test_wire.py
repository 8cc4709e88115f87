"""splitrl.core.wire: exact round trips, the byte layout, and every validation error."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from splitrl.core import wire

DType = wire.DType
MAX_ELEMENTS = 64

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int64": torch.int64,
    "float16": torch.float16,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
}
#: An integer dtype of the same size, to compare bit patterns (NaN payloads included).
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=8).filter(
    lambda shape: math.prod(shape) <= MAX_ELEMENTS
)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(BITS[tensor.element_size()])


@st.composite
def tensors(draw: st.DrawFn, dtype: torch.dtype) -> torch.Tensor:
    """Any tensor of `dtype` up to MAX_ELEMENTS: every bit pattern for numbers, 0/1 for bool."""
    shape = draw(shapes)
    count = math.prod(shape)
    if dtype == torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=torch.bool).reshape(
            shape
        )
    size = torch.empty((), dtype=dtype).element_size()
    raw = draw(st.binary(min_size=count * size, max_size=count * size))
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def test_dtype_names_cover_every_supported_dtype():
    assert set(wire.DTYPE_NAMES) == {*TORCH_DTYPES, "int4"}  # int4 has no torch dtype: encode_float packs it


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_torch_round_trip_is_bit_exact(name, data):
    tensor = data.draw(tensors(TORCH_DTYPES[name]))
    message = wire.encode(tensor)

    assert message.dtype == wire.dtype_code(name)
    assert list(message.shape) == list(tensor.shape)
    decoded = wire.decode(message)
    assert decoded.dtype == tensor.dtype
    assert decoded.shape == tensor.shape
    assert torch.equal(bits(decoded), bits(tensor))


NUMPY_DTYPES = ["float32", "uint8", "int8", "int64", "float16", "bool"]


@pytest.mark.parametrize("name", NUMPY_DTYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_numpy_round_trip_is_bit_exact(name, data):
    # Scalars (0-d arrays) are covered by test_numpy_scalar_keeps_its_empty_shape.
    shape = data.draw(
        hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=8).filter(lambda s: math.prod(s) <= MAX_ELEMENTS)
    )
    array = data.draw(hnp.arrays(np.dtype(name), shape))
    decoded = wire.decode(wire.encode(array))

    assert decoded.shape == array.shape
    assert decoded.dtype == TORCH_DTYPES[name]
    expected = torch.from_numpy(array.copy())
    assert torch.equal(bits(decoded), bits(expected))


def test_numpy_scalar_keeps_its_empty_shape():
    message = wire.encode(np.array(3.5, dtype=np.float32))
    assert list(message.shape) == []
    assert wire.decode(message).shape == ()


def test_torch_scalar_keeps_its_empty_shape():
    message = wire.encode(torch.tensor(3.5))
    assert list(message.shape) == []
    decoded = wire.decode(message)
    assert decoded.shape == ()
    assert decoded.item() == 3.5


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False), max_size=MAX_ELEMENTS))
def test_encode_to_bfloat16_matches_torch_conversion(values):
    tensor = torch.tensor(values, dtype=torch.float32)
    message = wire.encode(tensor, dtype=wire.DTYPE_BFLOAT16)

    assert message.dtype == wire.DTYPE_BFLOAT16
    assert torch.equal(bits(wire.decode(message)), bits(tensor.to(torch.bfloat16)))


def test_non_contiguous_inputs_are_encoded_in_row_major_order():
    tensor = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()
    array = np.arange(12, dtype=np.int64).reshape(3, 4).T

    assert torch.equal(wire.decode(wire.encode(tensor)), tensor)
    assert torch.equal(wire.decode(wire.encode(array)), torch.from_numpy(array.copy()))


def test_encode_detaches_tensors_that_require_grad():
    tensor = torch.ones(3, requires_grad=True) * 2
    assert torch.equal(wire.decode(wire.encode(tensor)), torch.full((3,), 2.0))


def test_encode_rejects_an_unsupported_dtype():
    with pytest.raises(wire.WireError, match="float64"):
        wire.encode(torch.zeros(2, dtype=torch.float64))


# --- byte layout ---------------------------------------------------------------------------------


def test_float32_data_is_little_endian_row_major():
    tensor = torch.tensor([[1.0, -2.5, 3.25], [1e-7, 65504.0, -0.0]])
    assert wire.encode(tensor).data == np.asarray(tensor.numpy(), "<f4").tobytes()


def test_bfloat16_one_is_0x3f80_little_endian():
    assert wire.encode(torch.tensor([1.0]), dtype=wire.DTYPE_BFLOAT16).data == b"\x80\x3f"


def test_int64_is_eight_little_endian_bytes():
    assert wire.encode(torch.tensor([1, -1], dtype=torch.int64)).data == b"\x01" + b"\x00" * 7 + b"\xff" * 8


# --- validation ----------------------------------------------------------------------------------


def float32_message(shape: list[int], data_bytes: int) -> wire.Tensor:
    return wire.Tensor(dtype=wire.DTYPE_FLOAT32, shape=shape, data=b"\x00" * data_bytes)


def test_unspecified_dtype_is_rejected():
    with pytest.raises(wire.WireError, match="DTYPE_UNSPECIFIED"):
        wire.decode(wire.Tensor(dtype=DType.DTYPE_UNSPECIFIED, shape=[1], data=b"\x00"))


def test_unknown_numeric_dtype_is_rejected():
    with pytest.raises(wire.WireError, match="unsupported tensor dtype 99"):
        wire.decode(wire.Tensor(dtype=99, shape=[1], data=b"\x00"))


def test_negative_dimension_is_rejected():
    with pytest.raises(wire.WireError, match=r"shape \[2, -1\] has a negative dimension"):
        wire.decode(float32_message([2, -1], 0))


@pytest.mark.parametrize("data_bytes", [8, 16], ids=["too-short", "too-long"])
def test_data_length_mismatch_names_both_lengths(data_bytes):
    with pytest.raises(wire.WireError) as excinfo:
        wire.decode(float32_message([3], data_bytes))
    message = str(excinfo.value)
    assert f"{data_bytes} bytes" in message
    assert "needs 12" in message


def test_tensor_over_max_bytes_is_rejected_and_at_the_bound_accepted():
    message = wire.Tensor(dtype=wire.DTYPE_UINT8, shape=[10, 10], data=bytes(100))
    assert wire.decode(message, max_bytes=100).shape == (10, 10)
    with pytest.raises(wire.WireError, match="needs 100 bytes, over the limit of 99"):
        wire.decode(message, max_bytes=99)


def test_forged_huge_shape_fails_on_the_bound_without_allocating():
    forged = float32_message([2**31, 2**31], 4)
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.decode(forged)
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.validate(forged)


def test_expect_dtype_mismatch_names_both_dtypes():
    message = wire.encode(torch.zeros(2))
    with pytest.raises(wire.WireError, match="DTYPE_FLOAT32, expected DTYPE_UINT8"):
        wire.decode(message, expect_dtype=wire.DTYPE_UINT8)
    assert wire.decode(message, expect_dtype=wire.DTYPE_FLOAT32).shape == (2,)


@pytest.mark.parametrize("expected", [[2, 3, 1], [2], [2, 4], [3, 3]], ids=["rank+1", "rank-1", "size", "first-dim"])
def test_expect_shape_mismatch_is_rejected(expected):
    message = wire.encode(torch.zeros(2, 3))
    with pytest.raises(wire.WireError, match=r"shape \[2, 3\] does not match expected"):
        wire.decode(message, expect_shape=expected)


def test_expect_shape_accepts_none_as_a_wildcard():
    message = wire.encode(torch.zeros(2, 3))
    assert wire.decode(message, expect_shape=[None, 3]).shape == (2, 3)
    assert wire.decode(message, expect_shape=[None, None]).shape == (2, 3)
    with pytest.raises(wire.WireError, match=r"expected \['\*', 4\]"):
        wire.decode(message, expect_shape=[None, 4])


def test_bool_bytes_other_than_zero_or_one_are_rejected():
    with pytest.raises(wire.WireError):
        wire.decode(wire.Tensor(dtype=wire.DTYPE_BOOL, shape=[3], data=bytes([0, 1, 2])))


def test_decode_returns_a_writable_copy():
    message = wire.encode(torch.arange(4, dtype=torch.float32))
    original = bytes(message.data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoded = wire.decode(message)
        decoded[0] = 42.0
        decoded.add_(1)
    assert decoded.tolist() == [43.0, 2.0, 3.0, 4.0]
    assert message.data == original


def test_decode_of_an_empty_tensor_keeps_its_shape():
    decoded = wire.decode(wire.Tensor(dtype=wire.DTYPE_INT64, shape=[0, 5], data=b""))
    assert decoded.shape == (0, 5)
    assert decoded.dtype == torch.int64


def test_num_elements():
    assert wire.num_elements(wire.Tensor(shape=[2, 3, 4])) == 24
    assert wire.num_elements(wire.Tensor(shape=[])) == 1
    assert wire.num_elements(wire.Tensor(shape=[0, 5])) == 0


def test_data_bytes_and_elements_in():
    names = ("bfloat16", "float32", "int64", "bool", "int4")
    assert [wire.data_bytes(wire.dtype_code(name), 3) for name in names] == [6, 12, 24, 3, 2]
    assert [wire.elements_in(wire.dtype_code(name), 8) for name in names] == [4, 2, 1, 8, 16]


def test_dtype_code_by_name():
    assert wire.dtype_code("bfloat16") == wire.DTYPE_BFLOAT16
    assert wire.dtype_code("uint8") == wire.DTYPE_UINT8


def test_dtype_code_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="unknown dtype 'float64'"):
        wire.dtype_code("float64")


@pytest.mark.parametrize("name", NUMPY_DTYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), compress=st.booleans())
def test_numpy_in_and_out_never_needs_torch_and_matches_the_torch_path(name, data, compress):
    """decode_array(encode(array)) is the array; the message is byte-identical to the one torch's path makes."""
    array = data.draw(hnp.arrays(np.dtype(name), data.draw(shapes)))
    message = wire.encode(array, compress=compress)
    assert message == wire.encode(torch.from_numpy(array.copy()), compress=compress)
    decoded = wire.decode_array(message)
    assert decoded.dtype == array.dtype and decoded.shape == array.shape and decoded.flags.writeable
    assert decoded.tobytes() == np.ascontiguousarray(array).tobytes()


def test_big_endian_and_strided_numpy_arrays_are_sent_little_endian_row_major():
    array = np.arange(12, dtype=">f4").reshape(3, 4).T
    assert wire.decode_array(wire.encode(array)).tolist() == array.tolist()


def test_decode_array_refuses_what_numpy_cannot_hold_and_validates_like_decode():
    for dtype in (wire.DTYPE_BFLOAT16, wire.DTYPE_FLOAT8_E4M3FN):
        message = wire.encode(torch.zeros(2), dtype)
        with pytest.raises(wire.WireError, match="has no numpy dtype"):
            wire.decode_array(message)
    truncated = wire.Tensor(dtype=wire.DTYPE_INT64, shape=[2], data=b"\x00" * 9)
    with pytest.raises(wire.WireError, match="needs 16"):
        wire.decode_array(truncated)
    quantized = wire.encode_float(torch.tensor([[0.5, -1.0, 0.25]]), "int4")
    assert wire.decode_array(quantized).tolist() == wire.decode(quantized).tolist()
    assert wire.decode_array(quantized)[0, 1] == -7  # the row's largest magnitude


def test_numpy_dtypes_the_wire_has_no_code_for_are_refused_by_name():
    with pytest.raises(wire.WireError, match="cannot encode numpy dtype float64"):
        wire.encode(np.zeros(3))
    with pytest.raises(wire.WireError, match="cannot encode numpy dtype <U1"):
        wire.encode(np.array(["a"]))
