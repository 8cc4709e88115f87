"""What one learner update trains on: a Batch of trajectory chunks as replay sampled them, and its Rows.

Rows flattens a batch's steps to one row each (the chunks' bootstrap steps left out) with the targets an update
computed for them (advantages, returns, the log-probs the PPO ratio is taken against); a minibatch is
`rows.take(index)`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from splitrl.core.trajectory import TrajectoryTensors


@dataclass
class Batch:
    """B chunks of T steps stacked: inputs [B, T+1, ...], per-step fields [B, T].

    `inputs` are what the cloud's network reads: uint8 frame stacks in cloud mode, bf16 activations (as the
    edge computed them when acting) in the split modes.
    """

    inputs: torch.Tensor
    actions: torch.Tensor
    behaviour_log_probs: torch.Tensor
    values: torch.Tensor  # [B, T+1]
    rewards: torch.Tensor
    dones: torch.Tensor
    policy_versions: torch.Tensor
    step_ids: torch.Tensor  # [B, T+1]
    encoder_versions: torch.Tensor  # [B, T+1]
    weights: torch.Tensor  # [B] importance weight of each chunk (1 unless replay is prioritized)

    @classmethod
    def stack(cls, chunks: list[TrajectoryTensors], weights: torch.Tensor | None = None) -> Batch:
        def field(name: str) -> torch.Tensor:
            return torch.stack([getattr(chunk, name) for chunk in chunks])

        return cls(
            inputs=field("observations"),
            actions=field("actions"),
            behaviour_log_probs=field("behaviour_log_probs"),
            values=field("values"),
            rewards=field("rewards"),
            dones=field("terminated") | field("truncated"),
            policy_versions=field("policy_versions"),
            step_ids=field("step_ids"),
            encoder_versions=field("encoder_versions"),
            weights=torch.ones(len(chunks)) if weights is None else weights,
        )


@dataclass
class Rows:
    """One update's steps flattened to N = B x T rows (the bootstrap step of each chunk left out); a minibatch
    is `rows.take(index)`."""

    inputs: torch.Tensor  # [N, ...] as Batch.inputs
    actions: torch.Tensor  # [N, ...]
    old_log_probs: torch.Tensor  # [N] log-probs the PPO ratio is taken against
    advantages: torch.Tensor  # [N]
    returns: torch.Tensor  # [N] value targets
    step_ids: torch.Tensor  # [N] which edge step each row is (split modes: gradients go back by id)
    encoder_versions: torch.Tensor  # [N] encoder version that computed each row's activation
    weights: torch.Tensor  # [N] importance weight of the row's chunk

    @classmethod
    def of(cls, batch: Batch, advantages: torch.Tensor, returns: torch.Tensor, old_log_probs: torch.Tensor) -> Rows:
        chunks, horizon = batch.rewards.shape
        return cls(
            inputs=batch.inputs[:, :-1].reshape(chunks * horizon, *batch.inputs.shape[2:]),
            actions=batch.actions.reshape(chunks * horizon, *batch.actions.shape[2:]),
            old_log_probs=old_log_probs.reshape(-1),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
            step_ids=batch.step_ids[:, :-1].reshape(-1),
            encoder_versions=batch.encoder_versions[:, :-1].reshape(-1),
            weights=batch.weights.repeat_interleave(horizon),
        )

    def __len__(self) -> int:
        return len(self.returns)

    def take(self, index: torch.Tensor) -> Rows:
        """The rows at `index` (int64 positions, or a bool mask over all the rows), in its order; each field a copy,
        channels-last frames still channels-last."""
        if index.dtype == torch.bool:
            if len(index) != len(self):
                raise ValueError(f"a bool mask must cover all {len(self)} rows, got one of {len(index)}")
            index = index.nonzero().squeeze(1)
        # Field by field: dataclasses.astuple deep-copies each tensor first (the whole update's frames, for every
        # minibatch).
        return Rows(*(_rows_at(getattr(self, field.name), index) for field in fields(self)))


def _rows_at(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` (int64) of `tensor` along dim 0, in `tensor`'s memory layout (channels-last frames stay so).

    Whole rows copied as blocks: `tensor[index]` copies number by number, which on a CarRacing minibatch's
    channels-last frames (megabytes) is several times slower.
    """
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)  # its bytes are row-major
    return tensor.index_select(0, index)
