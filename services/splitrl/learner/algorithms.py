"""Advantage estimation and the PPO objective, as pure functions over [B, T] tensors.

Conventions for every function here: time is the last dimension; `rewards`,
`dones` and log-probabilities have T entries, `values` has T + 1 (the last is
the bootstrap value of the observation after step T - 1). `dones[t]` means the
episode ended with action t, so nothing after t is credited to it. Truncation
is treated as termination (the final observation of a truncated episode is
not kept, as in CleanRL), a small, known bias on time-limited episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _check(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor) -> None:
    if values.shape[:-1] != rewards.shape[:-1] or values.shape[-1] != rewards.shape[-1] + 1:
        raise ValueError(f"values {tuple(values.shape)} must be rewards {tuple(rewards.shape)} plus one step")
    if dones.shape != rewards.shape:
        raise ValueError(f"dones {tuple(dones.shape)} must match rewards {tuple(rewards.shape)}")


def gae(
    rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation. Returns (advantages [.., T], returns [.., T] = advantages + values)."""
    _check(rewards, values, dones)
    not_done = 1.0 - dones.float()
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros_like(rewards[..., 0], dtype=torch.float32)
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[..., t] + gamma * values[..., t + 1] * not_done[..., t] - values[..., t]
        running = delta + gamma * lam * not_done[..., t] * running
        advantages[..., t] = running
    return advantages, advantages + values[..., :-1]


@dataclass
class VTrace:
    """V-trace targets (IMPALA, Espeholt et al. 2018, eq. 1) for one batch."""

    value_targets: torch.Tensor  # v_s, [.., T]
    pg_advantages: torch.Tensor  # rho_s * (r_s + gamma * v_{s+1} - V(x_s)), [.., T]


def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> VTrace:
    """Off-policy corrected value targets and policy-gradient advantages; no gradient flows through them."""
    _check(rewards, values, dones)
    with torch.no_grad():
        ratios = torch.exp(target_log_probs - behaviour_log_probs)
        rhos = ratios.clamp(max=rho_bar)
        cs = lam * ratios.clamp(max=c_bar)
        discounts = gamma * (1.0 - dones.float())
        deltas = rhos * (rewards + discounts * values[..., 1:] - values[..., :-1])
        corrections = torch.zeros_like(values)  # v_s - V(x_s); zero at the bootstrap
        for t in reversed(range(rewards.shape[-1])):
            corrections[..., t] = deltas[..., t] + discounts[..., t] * cs[..., t] * corrections[..., t + 1]
        targets = values + corrections
        pg_advantages = rhos * (rewards + discounts * targets[..., 1:] - values[..., :-1])
    return VTrace(targets[..., :-1], pg_advantages)


@dataclass
class PPOLoss:
    """The scalar loss to minimize and the terms it is made of (detached, for logging)."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor  # mean of (ratio - 1) - log(ratio), Schulman's low-variance estimator
    clip_fraction: torch.Tensor


def ppo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip: float = 0.2,
    value_coef: float = 0.5,
    entropy_coef: float = 0.01,
    sample_weights: torch.Tensor | None = None,
) -> PPOLoss:
    """Clipped surrogate objective (Schulman et al. 2017) + value regression - entropy bonus, averaged.

    `sample_weights` (>= 0, e.g. prioritized replay's importance weights, max-normalized to 1) scale each
    sample's policy and value terms before the mean, as in Schaul et al. 2016; None weighs every sample 1.
    """

    def mean(x: torch.Tensor) -> torch.Tensor:
        return x.mean() if sample_weights is None else (x * sample_weights).mean()

    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    policy = mean(torch.max(unclipped, clipped))
    value = 0.5 * mean((new_values - returns).pow(2))
    entropy_mean = entropy.mean()
    total = policy + value_coef * value - entropy_coef * entropy_mean
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
    return PPOLoss(total, policy.detach(), value.detach(), entropy_mean.detach(), approx_kl, clip_fraction)


def linear_anneal(start: float, steps_trained: int, anneal_steps: int | None) -> float:
    """`start` falling linearly to 0 at `anneal_steps` agent steps trained (and staying there); `start` when
    `anneal_steps` is None. The learning rate and the entropy bonus follow it (CleanRL's anneal_lr)."""
    if anneal_steps is None:
        return start
    return start * max(0.0, 1.0 - steps_trained / anneal_steps)
