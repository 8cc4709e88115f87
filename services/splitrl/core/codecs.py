"""What `encoder-inference` carries, per mode (DESIGN.md §3), and how each side checks it.

The codec is fixed per stream and announced in the stream's metadata
(`splitrl-codec`), so inference can refuse a stream it cannot interpret.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from splitrl.core.config import Mode, ObservationCodec
from splitrl.core.metrics import Payload
from splitrl.core.wire import DType

StreamCodec = Literal["activation", "frame", "stack-bf16"]
CODEC_METADATA_KEY = "splitrl-codec"
EDGE_ID_METADATA_KEY = "splitrl-edge-id"


def stream_codec(mode: Mode, codec: ObservationCodec) -> StreamCodec:
    """The codec an edge in `mode` uses: activations in split modes, the chosen observation codec in cloud."""
    return codec if mode == "cloud" else "activation"


def payload_of(codec: StreamCodec) -> Payload:
    """The `payload` label of an ActRequest carrying `codec`."""
    return "activation" if codec == "activation" else "observation"


def expected_observation(
    codec: StreamCodec, num_envs: int | None, frame_stack: int, frame_size: int, width: int
) -> tuple[int, Sequence[int | None]]:
    """(dtype, shape) an ActRequest's `observations` must have; None in the shape matches any size."""
    if codec == "activation":
        return DType.DTYPE_BFLOAT16, (num_envs, width)
    if codec == "frame":
        return DType.DTYPE_UINT8, (num_envs, frame_size, frame_size)
    return DType.DTYPE_BFLOAT16, (num_envs, frame_stack, frame_size, frame_size)
