"""One PPO update over a batch of trajectory chunks, CleanRL style: advantages, then epochs of minibatches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from splitrl.core.trajectory import TrajectoryTensors
from splitrl.learner.algorithms import gae, ppo_loss, vtrace
from splitrl.learner.settings import LearnerSettings


@dataclass
class Batch:
    """B chunks of T steps stacked: observations [B, T+1, ...], per-step fields [B, T]."""

    observations: torch.Tensor
    actions: torch.Tensor
    behaviour_log_probs: torch.Tensor
    values: torch.Tensor  # [B, T+1]
    rewards: torch.Tensor
    dones: torch.Tensor
    policy_versions: torch.Tensor

    @classmethod
    def stack(cls, chunks: list[TrajectoryTensors]) -> Batch:
        def field(name: str) -> torch.Tensor:
            return torch.stack([getattr(chunk, name) for chunk in chunks])

        return cls(
            observations=field("observations"),
            actions=field("actions"),
            behaviour_log_probs=field("behaviour_log_probs"),
            values=field("values"),
            rewards=field("rewards"),
            dones=field("terminated") | field("truncated"),
            policy_versions=field("policy_versions"),
        )


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    steps: int


class Trainer:
    """Owns the trainable network (ActorCritic in cloud mode, the head in split modes) and its optimizer."""

    def __init__(self, network: nn.Module, settings: LearnerSettings) -> None:
        self.network = network
        self.settings = settings
        self.optimizer = torch.optim.Adam(network.parameters(), lr=settings.learning_rate, eps=1e-5)
        self._generator = torch.Generator().manual_seed(settings.seed)

    def update(self, batch: Batch) -> UpdateStats:
        s = self.settings
        chunks, horizon = batch.rewards.shape
        flat_observations = batch.observations[:, :-1].reshape(chunks * horizon, *batch.observations.shape[2:])
        advantages, returns, old_log_probs = self._advantages(batch)

        flat = {
            "observations": flat_observations,
            "actions": batch.actions.reshape(chunks * horizon, *batch.actions.shape[2:]),
            "old_log_probs": old_log_probs.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
        }
        size = chunks * horizon
        minibatch = max(1, size // s.minibatches)
        totals = torch.zeros(5)
        count = 0
        for _ in range(s.epochs):
            order = torch.randperm(size, generator=self._generator)
            for start in range(0, size, minibatch):
                index = order[start : start + minibatch]
                mb_advantages = flat["advantages"][index]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std(unbiased=False) + 1e-8)
                distribution, new_values = self.network(flat["observations"][index])
                new_log_probs = distribution.log_prob(flat["actions"][index])
                loss = ppo_loss(
                    new_log_probs,
                    flat["old_log_probs"][index],
                    mb_advantages,
                    new_values,
                    flat["returns"][index],
                    distribution.entropy(),
                    clip=s.clip,
                    value_coef=s.value_coef,
                    entropy_coef=s.entropy_coef,
                )
                self.optimizer.zero_grad()
                loss.total.backward()
                nn.utils.clip_grad_norm_(self.network.parameters(), s.max_grad_norm)
                self.optimizer.step()
                totals += torch.stack([loss.policy, loss.value, loss.entropy, loss.approx_kl, loss.clip_fraction])
                count += 1
        policy, value, entropy, approx_kl, clip_fraction = (totals / count).tolist()
        return UpdateStats(policy, value, entropy, approx_kl, clip_fraction, steps=size)

    @torch.no_grad()
    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(advantages, value targets, log-probs the PPO ratio is taken against), each [B, T].

        GAE: the ratio is against the behaviour policy. V-trace: its advantages already carry the
        truncated importance weight, so the ratio is against the current policy before this update
        (as in APPO); using the behaviour policy there would correct twice.
        """
        s = self.settings
        if s.correction == "gae":
            advantages, returns = gae(batch.rewards, batch.values, batch.dones, s.gamma, s.gae_lambda)
            return advantages, returns, batch.behaviour_log_probs
        chunks, horizon = batch.rewards.shape
        observations = batch.observations.reshape(chunks * (horizon + 1), *batch.observations.shape[2:])
        distribution, values = self.network(observations)
        values = values.reshape(chunks, horizon + 1)
        actions = torch.cat([batch.actions, batch.actions[:, -1:]], dim=1)  # pad: the bootstrap row has no action
        target_log_probs = distribution.log_prob(actions.reshape(chunks * (horizon + 1), *batch.actions.shape[2:]))
        target_log_probs = target_log_probs.reshape(chunks, horizon + 1)[:, :-1]
        result = vtrace(
            batch.behaviour_log_probs, target_log_probs, batch.rewards, values, batch.dones, s.gamma, lam=s.gae_lambda
        )
        return result.pg_advantages, result.value_targets, target_log_probs
