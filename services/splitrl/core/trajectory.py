"""Trajectory chunks: the unit inference writes to replay and the learner trains on.

`TrajectoryTensors` is the in-memory form; `to_proto` / `from_proto` convert
through the wire module. Invariants (checked by `from_proto`, and by `check`,
which replay uses to refuse a bad chunk without decoding it into tensors or
importing torch): T >= 1 steps; observations (the stacks the index rebuilds,
where there is one), values, step_ids and encoder_versions have T + 1 rows (the
last is the bootstrap); every other field has T rows.

Frame stacks travel as the frames they are made of (`unique_frames`): each step of an episode shares all but
one frame with the step before it, so a chunk of T steps at stack depth D in which no episode starts carries
T + D frames and an `observation_index` [T+1, D] instead of (T + 1) x D frames (each episode start adds D - 1
more); `from_proto` builds the stacks back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.v1 import replay_pb2

if TYPE_CHECKING:
    import torch

#: Wire dtype of each field (observations vary with the mode and are checked separately).
_FIELD_DTYPES: dict[str, int | None] = {
    "observations": None,
    "actions": None,
    "behaviour_log_probs": wire.DTYPE_FLOAT32,
    "values": wire.DTYPE_FLOAT32,
    "rewards": wire.DTYPE_FLOAT32,
    "terminated": wire.DTYPE_BOOL,
    "truncated": wire.DTYPE_BOOL,
    "policy_versions": wire.DTYPE_INT64,
    "step_ids": wire.DTYPE_INT64,
    "encoder_versions": wire.DTYPE_INT64,
}
_BOOTSTRAP_FIELDS = frozenset({"observations", "values", "step_ids", "encoder_versions"})


@dataclass
class TrajectoryTensors:
    """One env's T steps; see the module docstring for the row counts."""

    observations: torch.Tensor  # uint8 [T+1, stack, S, S] (cloud) or bfloat16 [T+1, width] (split)
    actions: torch.Tensor  # int64 [T] or float32 [T, A]
    behaviour_log_probs: torch.Tensor  # float32 [T]
    values: torch.Tensor  # float32 [T+1]
    rewards: torch.Tensor  # float32 [T]
    terminated: torch.Tensor  # bool [T]
    truncated: torch.Tensor  # bool [T]
    policy_versions: torch.Tensor  # int64 [T]
    step_ids: torch.Tensor  # int64 [T+1]
    encoder_versions: torch.Tensor  # int64 [T+1]

    @property
    def length(self) -> int:
        """T, the number of steps (actions) in the chunk."""
        return int(self.actions.shape[0])

    def to_proto(self) -> replay_pb2.Trajectory:
        """The chunk on the wire; uint8 frame stacks [T+1, D, H, W] with D > 1 as their distinct frames and an
        observation_index (`unique_frames`), everything else as it is."""
        message = replay_pb2.Trajectory(
            **{f.name: wire.encode(getattr(self, f.name)) for f in fields(self) if f.name != "observations"}
        )
        import torch  # here, not at the top: replay imports this module and must not load torch

        stacks = self.observations
        if stacks.dtype == torch.uint8 and stacks.dim() == 4 and stacks.shape[1] > 1 and stacks.numel():
            frames, index = unique_frames(stacks.detach().cpu().contiguous())
            message.observations.CopyFrom(wire.encode(frames))
            message.observation_index.CopyFrom(wire.encode(index))
        else:
            message.observations.CopyFrom(wire.encode(stacks))
        return message


def unique_frames(stacks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Frame stacks [R, D, H, W] (contiguous, on the CPU, R >= 1) as frames [K, H, W] and an int64 index
    [R, D] with stacks == frames[index].

    A row whose first D - 1 frames equal the previous row's last D - 1 (the next step of the same episode)
    adds only its newest frame; any other row (the first, an episode's first) adds all D. So K = R + D - 1
    when no episode starts inside the chunk. Rows are compared by value, so the index is right whatever the
    stacker did at a reset.
    """
    import torch

    rows, depth = stacks.shape[:2]
    pixels = stacks.reshape(rows, depth, math.prod(stacks.shape[2:]))
    if pixels.shape[-1] % 8 == 0 and pixels.storage_offset() % 8 == 0:  # 8 bytes at a time: ~4x faster
        pixels = pixels.view(torch.int64)
    continues = (pixels[1:, :-1] == pixels[:-1, 1:]).flatten(1).all(dim=1).tolist()
    kept = list(range(depth))  # positions in stacks.reshape(rows * depth, H, W) of the frames sent
    index = [list(range(depth))]
    for row, shifted in enumerate(continues, start=1):
        if shifted:
            index.append([*index[-1][1:], len(kept)])
            kept.append(row * depth + depth - 1)
        else:
            index.append(list(range(len(kept), len(kept) + depth)))
            kept.extend(range(row * depth, (row + 1) * depth))
    frames = stacks.reshape(rows * depth, *stacks.shape[2:]).index_select(0, torch.tensor(kept))
    return frames, torch.tensor(index, dtype=torch.int64)


def from_proto(message: replay_pb2.Trajectory, *, max_length: int = 4096) -> TrajectoryTensors:
    """Decode and check a Trajectory; WireError / BadRequest names the first broken invariant."""
    read, index = _checked(message, max_length, wire.decode)
    if index is not None:
        import torch

        frames = read["observations"]
        stacked = frames.index_select(0, torch.from_numpy(index).reshape(-1))
        read["observations"] = stacked.view(*index.shape, *frames.shape[1:])
    return TrajectoryTensors(**read)


def check(message: replay_pb2.Trajectory, *, max_length: int = 4096) -> None:
    """`from_proto`'s checks, every field's bytes read (zstd decompressed) but no tensor built: no torch."""
    _checked(message, max_length, wire.verify)


def _checked(
    message: replay_pb2.Trajectory, max_length: int, read: Callable[..., Any]
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Every field read by `read` (wire.decode or wire.verify), then the row invariants on their shapes (the
    stacks' shape where observations are frames); returns the fields and the observation index, if any."""
    fields_read: dict[str, Any] = {}
    shapes: dict[str, Sequence[int]] = {}
    for name, dtype in _FIELD_DTYPES.items():
        if not message.HasField(name):
            raise BadRequest(f"Trajectory.{name} is missing")
        try:
            fields_read[name] = read(getattr(message, name), expect_dtype=dtype)
        except wire.WireError as error:
            raise wire.WireError(f"Trajectory.{name}: {error}") from None
        shapes[name] = list(getattr(message, name).shape)
    index = None
    if message.HasField("observation_index"):
        index = _observation_index(message)
        shapes["observations"] = [*index.shape, *message.observations.shape[1:]]
    _check_rows(shapes, max_length)
    return fields_read, index


def _observation_index(message: replay_pb2.Trajectory) -> np.ndarray:
    """The index [R, D] into frames [K, H, W] of uint8, every value in [0, K), checked to rebuild at most as
    many bytes as one observations tensor may carry (a small index cannot ask for a huge rebuild)."""
    frames = message.observations
    if frames.dtype != wire.DTYPE_UINT8 or len(frames.shape) != 3 or frames.shape[0] < 1:
        raise BadRequest(
            f"Trajectory.observations with an observation_index must be uint8 frames [K, H, W], K >= 1; got "
            f"{wire.DType.Name(frames.dtype)} {list(frames.shape)}"
        )
    try:
        index = wire.decode_array(message.observation_index, expect_dtype=wire.DTYPE_INT64)
    except wire.WireError as error:
        raise wire.WireError(f"Trajectory.observation_index: {error}") from None
    if index.ndim != 2 or index.shape[1] < 1:
        raise BadRequest(f"Trajectory.observation_index has shape {list(index.shape)}; expected [T+1, D], D >= 1")
    rebuilt = index.size * frames.shape[1] * frames.shape[2]
    if rebuilt > wire.DEFAULT_MAX_TENSOR_BYTES:
        raise BadRequest(
            f"Trajectory.observation_index {list(index.shape)} over {list(frames.shape)} frames rebuilds "
            f"{rebuilt} bytes; at most {wire.DEFAULT_MAX_TENSOR_BYTES}"
        )
    if index.size and (index.min() < 0 or index.max() >= frames.shape[0]):
        raise BadRequest(
            f"Trajectory.observation_index holds {int(index.min())}..{int(index.max())}; frames are "
            f"0..{frames.shape[0] - 1}"
        )
    return index


def _check_rows(shapes: dict[str, Sequence[int]], max_length: int) -> None:
    length = shapes["actions"][0] if shapes["actions"] else 0
    if not 1 <= length <= max_length:
        raise BadRequest(f"Trajectory has {length} steps; expected 1..{max_length}")
    for name, shape in shapes.items():
        rows = length + 1 if name in _BOOTSTRAP_FIELDS else length
        if len(shape) == 0 or shape[0] != rows:
            raise BadRequest(f"Trajectory.{name} has shape {list(shape)}; expected {rows} rows")
        if name not in ("observations", "actions") and len(shape) != 1:
            raise BadRequest(f"Trajectory.{name} has shape {list(shape)}; expected [{rows}]")
    if len(shapes["actions"]) > 2 or len(shapes["observations"]) < 2:
        raise BadRequest(
            f"Trajectory actions {list(shapes['actions'])} must be [T] or [T, A] and observations "
            f"{list(shapes['observations'])} at least [T+1, D]"
        )
