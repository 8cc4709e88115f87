"""The smallest well-formed trajectory chunk, for tests that store chunks rather than train on them."""

from __future__ import annotations

import torch

from splitrl.core.trajectory import TrajectoryTensors
from splitrl.v1 import replay_pb2


def tiny_chunk(steps: int = 2, *, marker: int = 0, features: int = 4) -> replay_pb2.Trajectory:
    """A `steps`-step chunk whose observations are uint8 [steps + 1, features], every byte `marker` % 256
    (so a stored chunk can be told from another); everything else is zero, step ids count from 0."""
    return TrajectoryTensors(
        observations=torch.full((steps + 1, features), marker % 256, dtype=torch.uint8),
        actions=torch.zeros(steps, dtype=torch.int64),
        behaviour_log_probs=torch.zeros(steps),
        values=torch.zeros(steps + 1),
        rewards=torch.zeros(steps),
        terminated=torch.zeros(steps, dtype=torch.bool),
        truncated=torch.zeros(steps, dtype=torch.bool),
        policy_versions=torch.zeros(steps, dtype=torch.int64),
        step_ids=torch.arange(steps + 1),
        encoder_versions=torch.zeros(steps + 1, dtype=torch.int64),
    ).to_proto()
