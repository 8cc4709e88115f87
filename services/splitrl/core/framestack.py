"""Per-env frame stacks, kept on the edge (split modes, stack-bf16) or in the cloud (frame codec)."""

from __future__ import annotations

import torch

#: One env's stack: its last `depth` frames, oldest first, each uint8 [H, W].
FrameRow = tuple[torch.Tensor, ...]


class FrameStacker:
    """The last `depth` frames of each of `num_envs` envs, as uint8 [num_envs, depth, H, W].

    A row that starts an episode is filled with its first frame, so a stack never mixes two episodes; before
    its first frame a row holds zeros.

    Each frame is held once and shared by every stack it belongs to (`rows`): consecutive stacks of one env
    differ by one frame, so a caller that keeps stacks (the edge's observation store) keeps each at the cost
    of one frame (9,216 B at 96 x 96) instead of `depth` (36,864 B at 4 x 96 x 96). Frames are never written
    after they are pushed.
    """

    def __init__(self, num_envs: int, depth: int, height: int, width: int) -> None:
        if min(num_envs, depth, height, width) < 1:
            raise ValueError(f"FrameStacker needs positive sizes, got {num_envs=} {depth=} {height=} {width=}")
        self.depth, self.frame_shape = depth, (height, width)
        blank = torch.zeros(self.frame_shape, dtype=torch.uint8)
        #: Each env's current stack, as shared frames.
        self.rows: list[FrameRow] = [(blank,) * depth] * num_envs

    def push(self, frames: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Add uint8 [N, H, W] frames; rows where bool [N] `episode_start` is set restart. Returns the stacks,
        a new tensor the stacker never changes."""
        if frames.shape != (len(self.rows), *self.frame_shape):
            shape = (len(self.rows), self.depth, *self.frame_shape)
            raise ValueError(f"frames of shape {tuple(frames.shape)} do not fit stacks {shape}")
        if frames.dtype != torch.uint8:
            raise ValueError(f"frames must be uint8, got {frames.dtype}")
        if episode_start.shape != (len(self.rows),):
            raise ValueError(f"episode_start must be bool [{len(self.rows)}], got shape {tuple(episode_start.shape)}")
        starts = episode_start.tolist()
        # One copy for all rows, which the stored stacks share: the caller may reuse or change `frames`.
        for env, frame in enumerate(frames.clone().unbind()):
            self.rows[env] = (frame,) * self.depth if starts[env] else (*self.rows[env][1:], frame)
        return stack_rows(self.rows)


def stack_rows(rows: list[FrameRow]) -> torch.Tensor:
    """Stacks uint8 [len(rows), depth, H, W] of rows of shared frames."""
    depth = len(rows[0])
    return torch.stack([frame for row in rows for frame in row]).unflatten(0, (len(rows), depth))
