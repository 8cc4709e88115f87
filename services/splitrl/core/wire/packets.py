"""A batch of frames as video: one H.264 packet per row, framed in one Tensor. Only a stateful decoder turns
packets into frames (splitrl.core.video)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from splitrl.core.wire.checks import validate
from splitrl.core.wire.dtypes import (
    COMPRESSION_H264,
    DEFAULT_MAX_TENSOR_BYTES,
    DTYPE_UINT8,
    Tensor,
    WireError,
)


def encode_packets(packets: Sequence[bytes], shape: Sequence[int]) -> Tensor:
    """A batch of frames as video: one H.264 packet per row of uint8 `shape` [N, H, W] (see splitrl.core.video)."""
    if len(shape) != 3 or len(packets) != shape[0]:
        raise WireError(f"video needs one packet per row of an [N, H, W] shape; got {len(packets)} for {list(shape)}")
    return Tensor(
        dtype=DTYPE_UINT8,
        shape=list(shape),
        data=b"".join(packets),
        compression=COMPRESSION_H264,
        packet_sizes=[len(packet) for packet in packets],
    )


def video_packets(
    message: Tensor, *, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES, expect_shape: Sequence[int | None] | None = None
) -> list[bytes]:
    """Validate a COMPRESSION_H264 tensor (see `validate`) and split its data into one packet per row."""
    if message.compression != COMPRESSION_H264:
        raise WireError(f"expected an H.264 video tensor, got compression {message.compression}")
    validate(message, max_bytes=max_bytes, expect_dtype=DTYPE_UINT8, expect_shape=expect_shape)
    offsets = np.cumsum([0, *message.packet_sizes]).tolist()
    return [message.data[start:end] for start, end in itertools.pairwise(offsets)]
