"""Trajectory chunks: the unit inference writes to replay and the learner trains on.

`TrajectoryTensors` is the in-memory form; `to_proto` / `from_proto` convert
through the wire module. Invariants (checked by `from_proto`, and by `check`,
which replay uses to refuse a bad chunk without decoding it into tensors or
importing torch): T >= 1 steps; observations, values, step_ids and
encoder_versions have T + 1 rows (the last is the bootstrap); every other field
has T rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.v1 import replay_pb2

if TYPE_CHECKING:
    import torch

DType = wire.DType

#: Wire dtype of each field (observations vary with the mode and are checked separately).
_FIELD_DTYPES: dict[str, int | None] = {
    "observations": None,
    "actions": None,
    "behaviour_log_probs": DType.DTYPE_FLOAT32,
    "values": DType.DTYPE_FLOAT32,
    "rewards": DType.DTYPE_FLOAT32,
    "terminated": DType.DTYPE_BOOL,
    "truncated": DType.DTYPE_BOOL,
    "policy_versions": DType.DTYPE_INT64,
    "step_ids": DType.DTYPE_INT64,
    "encoder_versions": DType.DTYPE_INT64,
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
        return replay_pb2.Trajectory(**{f.name: wire.encode(getattr(self, f.name)) for f in fields(self)})


def from_proto(message: replay_pb2.Trajectory, *, max_length: int = 4096) -> TrajectoryTensors:
    """Decode and check a Trajectory; WireError / BadRequest names the first broken invariant."""
    return TrajectoryTensors(**_checked(message, max_length, wire.decode))


def check(message: replay_pb2.Trajectory, *, max_length: int = 4096) -> None:
    """`from_proto`'s checks, every field's bytes read (zstd decompressed) but no tensor built: no torch."""
    _checked(message, max_length, wire.verify)


def _checked(message: replay_pb2.Trajectory, max_length: int, read: Callable[..., Any]) -> dict[str, Any]:
    """Every field read by `read` (wire.decode or wire.verify), then the row invariants on their shapes."""
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
    _check_rows(shapes, max_length)
    return fields_read


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
