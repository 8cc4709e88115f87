"""Per-env frame stacks, kept on the edge (split modes, stack-bf16) or in the cloud (frame codec)."""

from __future__ import annotations

import torch


class FrameStacker:
    """The last `depth` frames of each of `num_envs` envs, as uint8 [num_envs, depth, H, W].

    A row that starts an episode is filled with copies of its first frame, so a
    stack never mixes two episodes.
    """

    def __init__(self, num_envs: int, depth: int, height: int, width: int) -> None:
        if min(num_envs, depth, height, width) < 1:
            raise ValueError(f"FrameStacker needs positive sizes, got {num_envs=} {depth=} {height=} {width=}")
        self.stacks = torch.zeros((num_envs, depth, height, width), dtype=torch.uint8)

    def push(self, frames: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Add uint8 [N, H, W] frames; rows where bool [N] `episode_start` is set restart. Returns the stacks."""
        if frames.shape != (self.stacks.shape[0], *self.stacks.shape[2:]):
            raise ValueError(f"frames of shape {tuple(frames.shape)} do not fit stacks {tuple(self.stacks.shape)}")
        self.stacks = torch.roll(self.stacks, shifts=-1, dims=1)
        self.stacks[:, -1] = frames
        if bool(episode_start.any()):
            self.stacks[episode_start] = frames[episode_start].unsqueeze(1).expand(-1, self.stacks.shape[1], -1, -1)
        return self.stacks
