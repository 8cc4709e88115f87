"""Cutting one stream's steps into per-env trajectory chunks of `unroll_length` steps.

A step's reward and episode-end flags arrive with the *next* request of the
stream, so a step is complete one request later; a chunk is cut once it has
T complete steps and the following observation (its bootstrap row) has been
acted on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splitrl.core.trajectory import TrajectoryTensors
from splitrl.inference.policy import Decisions


@dataclass
class _Step:
    """One vector step as acted on; every tensor has the stream's N envs as its first dimension."""

    observations: torch.Tensor
    decisions: Decisions
    step_ids: torch.Tensor  # int64 [N]
    encoder_version: int
    rewards: torch.Tensor | None = None  # float32 [N], filled by the next request
    terminated: torch.Tensor | None = None
    truncated: torch.Tensor | None = None


class TrajectoryCutter:
    """Accumulates one stream's vector steps and returns per-env chunks once T steps are complete."""

    def __init__(self, unroll_length: int) -> None:
        if unroll_length < 1:
            raise ValueError(f"unroll_length must be >= 1, got {unroll_length}")
        self.unroll_length = unroll_length
        self._steps: list[_Step] = []

    @property
    def pending_steps(self) -> int:
        """Vector steps held towards the next chunk (0 only before the first step: a cut keeps its bootstrap step)."""
        return len(self._steps)

    def add(
        self,
        observations: torch.Tensor,
        decisions: Decisions,
        step_ids: torch.Tensor,
        encoder_version: int,
        previous_rewards: torch.Tensor,
        previous_terminated: torch.Tensor,
        previous_truncated: torch.Tensor,
    ) -> list[TrajectoryTensors]:
        """Record a step acted on (by `decisions.policy_version`); `previous_*` complete the step before it.

        Returns the chunks this step finished (as their bootstrap row), possibly none.
        """
        if self._steps:
            last = self._steps[-1]
            last.rewards, last.terminated, last.truncated = previous_rewards, previous_terminated, previous_truncated
        step = _Step(observations, decisions, step_ids, encoder_version)
        chunks: list[TrajectoryTensors] = []
        if len(self._steps) == self.unroll_length:
            chunks = self._cut(bootstrap=step)
            self._steps = []
        self._steps.append(step)
        return chunks

    def _cut(self, bootstrap: _Step) -> list[TrajectoryTensors]:
        steps = self._steps
        n = bootstrap.observations.shape[0]
        with_bootstrap = [*steps, bootstrap]
        observations = torch.stack([s.observations for s in with_bootstrap], dim=1)  # [N, T+1, ...]
        actions = torch.stack([s.decisions.actions for s in steps], dim=1)
        log_probs = torch.stack([s.decisions.log_probs for s in steps], dim=1)
        values = torch.stack([s.decisions.values for s in with_bootstrap], dim=1)
        rewards = torch.stack([s.rewards for s in steps], dim=1)  # type: ignore[misc]
        terminated = torch.stack([s.terminated for s in steps], dim=1)  # type: ignore[misc]
        truncated = torch.stack([s.truncated for s in steps], dim=1)  # type: ignore[misc]
        versions = torch.tensor([s.decisions.policy_version for s in steps], dtype=torch.int64)
        step_ids = torch.stack([s.step_ids for s in with_bootstrap], dim=1)
        encoder_versions = torch.tensor([s.encoder_version for s in with_bootstrap], dtype=torch.int64)
        return [
            TrajectoryTensors(
                observations=observations[i],
                actions=actions[i],
                behaviour_log_probs=log_probs[i],
                values=values[i],
                rewards=rewards[i],
                terminated=terminated[i],
                truncated=truncated[i],
                policy_versions=versions,
                step_ids=step_ids[i],
                encoder_versions=encoder_versions,
            )
            for i in range(n)
        ]
