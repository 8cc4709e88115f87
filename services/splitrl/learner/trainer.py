"""One PPO update over a batch of trajectory chunks, CleanRL style: advantages, then epochs of minibatches.

What a minibatch trains on depends on the mode (DESIGN.md §3):
  cloud             frame stacks from replay through encoder + head; no WAN.
  split             activations the edge recomputes for the minibatch (WAN up), gradients back (WAN down),
                    in lockstep every minibatch of every epoch: the research's naive split.
  split-accumulate  activations stored in replay, no WAN; a sampled `encoder_fraction` of each minibatch's
                    activation gradients is pushed down to the edge without waiting (the pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from splitrl.core.trajectory import TrajectoryTensors
from splitrl.learner.algorithms import gae, ppo_loss, vtrace
from splitrl.learner.settings import LearnerSettings


class EdgeTraining(Protocol):
    """The trainer's view of the `learner-encoder` link (implemented by `splitrl.learner.edges.EdgeLinks`)."""

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]: ...

    def return_gradients(self, ticket: Any, gradients: torch.Tensor) -> None: ...

    def push_gradients(
        self, step_ids: torch.Tensor, encoder_versions: torch.Tensor, gradients: torch.Tensor
    ) -> None: ...


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
    step_ids: torch.Tensor  # [B, T+1]
    encoder_versions: torch.Tensor  # [B, T+1]
    weights: torch.Tensor  # [B] importance weight of each chunk (1 unless replay is prioritized)

    @classmethod
    def stack(cls, chunks: list[TrajectoryTensors], weights: torch.Tensor | None = None) -> Batch:
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
            step_ids=field("step_ids"),
            encoder_versions=field("encoder_versions"),
            weights=torch.ones(len(chunks)) if weights is None else weights,
        )


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    steps: int
    chunk_priorities: list[float]  # mean |advantage| of each chunk, in batch order
    optimizer_steps: int  # 0 when no minibatch had a row to train on (split: no edge answered)


class Trainer:
    """Owns the trainable network (ActorCritic in cloud mode, the head in split modes) and its optimizer."""

    def __init__(self, network: nn.Module, settings: LearnerSettings, edges: EdgeTraining | None = None) -> None:
        if settings.mode != "cloud" and edges is None:
            raise ValueError(f"mode {settings.mode!r} trains the encoder through the edge: pass `edges`")
        self.network = network
        self.settings = settings
        self.edges = edges
        self.optimizer = torch.optim.Adam(network.parameters(), lr=settings.learning_rate, eps=1e-5)
        #: Minibatch shuffling and encoder-row draws; the learner checkpoints its state.
        self.generator = torch.Generator().manual_seed(settings.seed)

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
            "step_ids": batch.step_ids[:, :-1].reshape(-1),
            "encoder_versions": batch.encoder_versions[:, :-1].reshape(-1),
            "weights": batch.weights.repeat_interleave(horizon),
        }
        size = chunks * horizon
        minibatch = max(1, size // s.minibatches)
        totals = torch.zeros(5)
        count = 0
        for _ in range(s.epochs):
            order = torch.randperm(size, generator=self.generator)
            for start in range(0, size, minibatch):
                terms = self._minibatch(flat, order[start : start + minibatch])
                if terms is not None:
                    totals += terms
                    count += 1
        policy, value, entropy, approx_kl, clip_fraction = (totals / max(count, 1)).tolist()
        priorities = advantages.abs().mean(dim=1).tolist()
        return UpdateStats(
            policy,
            value,
            entropy,
            approx_kl,
            clip_fraction,
            steps=size,
            chunk_priorities=priorities,
            optimizer_steps=count,
        )

    def _minibatch(self, flat: dict[str, torch.Tensor], index: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step on rows `index`; returns its loss terms, or None if no row could be trained."""
        s = self.settings
        inputs = flat["observations"][index]
        ticket, leaf = None, None
        if s.mode == "split":
            assert self.edges is not None
            fetched, present, ticket = self.edges.fetch_activations(flat["step_ids"][index])
            leaf = fetched.requires_grad_()  # rows the edge lacked stay 0 here and get a 0 gradient
            index, inputs = index[present], leaf[present]
            if len(index) == 0:
                return None
        elif s.mode == "split-accumulate":
            leaf = inputs = inputs.float().requires_grad_()  # a leaf: its .grad is what the edge's encoder needs
        mb_advantages = flat["advantages"][index]
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std(unbiased=False) + 1e-8)
        distribution, new_values = self.network(inputs)
        loss = ppo_loss(
            distribution.log_prob(flat["actions"][index]),
            flat["old_log_probs"][index],
            mb_advantages,
            new_values,
            flat["returns"][index],
            distribution.entropy(),
            clip=s.clip,
            value_coef=s.value_coef,
            entropy_coef=s.entropy_coef,
            sample_weights=None if s.importance_beta == 0 else flat["weights"][index],
        )
        self.optimizer.zero_grad()
        loss.total.backward()
        nn.utils.clip_grad_norm_(self.network.parameters(), s.max_grad_norm)
        self.optimizer.step()
        if s.mode == "split":
            assert self.edges is not None and leaf is not None and leaf.grad is not None
            self.edges.return_gradients(ticket, leaf.grad)
        elif s.mode == "split-accumulate":
            assert self.edges is not None and leaf is not None and leaf.grad is not None
            chosen = torch.rand(len(index), generator=self.generator) < s.encoder_fraction
            if bool(chosen.any()):
                rows = index[chosen]
                self.edges.push_gradients(flat["step_ids"][rows], flat["encoder_versions"][rows], leaf.grad[chosen])
        return torch.stack([loss.policy, loss.value, loss.entropy, loss.approx_kl, loss.clip_fraction]).detach()

    @torch.no_grad()
    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(advantages, value targets, log-probs the PPO ratio is taken against), each [B, T].

        GAE: the ratio is against the behaviour policy. V-trace: its advantages already carry the
        truncated importance weight, so the ratio is against the current policy before this update
        (as in APPO); using the behaviour policy there would correct twice.
        """
        s = self.settings
        rewards = batch.rewards * s.reward_scale
        if s.correction == "gae":
            advantages, returns = gae(rewards, batch.values, batch.dones, s.gamma, s.gae_lambda)
            return advantages, returns, batch.behaviour_log_probs
        chunks, horizon = batch.rewards.shape
        observations = batch.observations.reshape(chunks * (horizon + 1), *batch.observations.shape[2:])
        distribution, values = self.network(observations)
        values = values.reshape(chunks, horizon + 1)
        actions = torch.cat([batch.actions, batch.actions[:, -1:]], dim=1)  # pad: the bootstrap row has no action
        target_log_probs = distribution.log_prob(actions.reshape(chunks * (horizon + 1), *batch.actions.shape[2:]))
        target_log_probs = target_log_probs.reshape(chunks, horizon + 1)[:, :-1]
        result = vtrace(
            batch.behaviour_log_probs, target_log_probs, rewards, values, batch.dones, s.gamma, lam=s.gae_lambda
        )
        return result.pg_advantages, result.value_targets, target_log_probs
