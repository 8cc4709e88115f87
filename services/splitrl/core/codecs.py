"""What `encoder-inference` carries, per mode (docs/design.md §3), and how each side checks it.

Actions come back the same way in every mode: see `action_wire`.

The codec is fixed per stream and announced in the stream's metadata
(`splitrl-codec`), so inference can refuse a stream it cannot interpret.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Literal

from splitrl.core import wire
from splitrl.core.config import Mode, ObservationCodec
from splitrl.core.metrics import Payload
from splitrl.core.spec import ActionSpec

StreamKind = Literal["activation", "frame", "video", "stack-bf16"]
CODEC_METADATA_KEY = "splitrl-codec"
EDGE_ID_METADATA_KEY = "splitrl-edge-id"
#: Names one environment stream (random per stream, SEED RL's run id): inference keeps per-stream state
#: (frame stacks, trajectories in progress) for one run id only, so nothing spans a reconnect.
RUN_ID_METADATA_KEY = "splitrl-run-id"


def new_run_id() -> str:
    """A fresh random run id (16 hex digits) for a new stream."""
    return secrets.token_hex(8)


def stream_kind(mode: Mode, codec: ObservationCodec) -> StreamKind:
    """What an edge in `mode` streams: activations in split modes, frames, video or frame stacks in cloud.

    Compression and quantization are not part of it: every Tensor describes its own (splitrl.core.wire),
    so inference accepts `frame` and `frame+zstd` alike, and any activation codec. Video is a stream of
    its own: its frames decode only in that stream's decoders (splitrl.core.video).
    """
    if mode != "cloud":
        return "activation"
    if codec == "h264":
        return "video"
    return "stack-bf16" if codec == "stack-bf16" else "frame"


def payload_of(codec: StreamKind) -> Payload:
    """The `payload` label of an ActRequest carrying `codec`."""
    return "activation" if codec == "activation" else "observation"


def expected_observation(
    codec: StreamKind, num_envs: int | None, frame_stack: int, frame_size: int, width: int
) -> tuple[int | None, Sequence[int | None]]:
    """(dtype, shape) an ActRequest's `observations` must have; None in the shape matches any size.

    Activations may come in any float codec (dtype None: see wire.decode_float).
    """
    if codec == "activation":
        return None, (num_envs, width)
    if codec in ("frame", "video"):
        return wire.DTYPE_UINT8, (num_envs, frame_size, frame_size)
    return wire.DTYPE_BFLOAT16, (num_envs, frame_stack, frame_size, frame_size)


def action_wire(spec: ActionSpec, num_envs: int) -> tuple[int, tuple[int, ...]]:
    """(dtype, shape) of the actions a reply carries for `num_envs` envs acting in `spec`.

    Discrete actions cross as uint8 when there are at most 256 choices (1 byte per env instead of int64's 8:
    at tens of WAN bytes per step that is a tenth of a split's rollout), int64 beyond; continuous as float32.
    """
    if spec.kind == "continuous":
        return wire.DTYPE_FLOAT32, (num_envs, spec.size)
    return (wire.DTYPE_UINT8 if spec.size <= 256 else wire.DTYPE_INT64), (num_envs,)
