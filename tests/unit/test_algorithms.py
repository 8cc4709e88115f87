"""GAE, V-trace and the PPO loss against hand-computed cases and a reference loop."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrl.learner.algorithms import gae, ppo_loss, vtrace


def test_gae_hand_computed_with_an_episode_end():
    # gamma 0.5, lambda 0.5; the episode ends with action 1, so step 2 starts afresh.
    rewards = torch.tensor([1.0, 2.0, 3.0])
    values = torch.tensor([0.5, 1.0, 2.0, 4.0])
    dones = torch.tensor([False, True, False])
    advantages, returns = gae(rewards, values, dones, gamma=0.5, lam=0.5)
    d2 = 3.0 + 0.5 * 4.0 - 2.0  # 3.0
    d1 = 2.0 - 1.0  # 1.0: no bootstrap past the end
    d0 = 1.0 + 0.5 * 1.0 - 0.5  # 1.0
    a1 = d1  # the recursion is cut at the end too
    a0 = d0 + 0.25 * a1
    assert advantages.tolist() == pytest.approx([a0, a1, d2])
    assert returns.tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, d2 + 2.0])


def test_gae_with_lambda_one_is_the_discounted_return_minus_value():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.3, 0.2, 0.1, 5.0]])
    advantages, returns = gae(rewards, values, torch.zeros(1, 3, dtype=torch.bool), gamma=0.9, lam=1.0)
    expected_return_0 = 1.0 + 0.9 * 0.0 + 0.81 * 2.0 + 0.729 * 5.0
    assert returns[0, 0].item() == pytest.approx(expected_return_0)
    assert advantages[0, 0].item() == pytest.approx(expected_return_0 - 0.3)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="plus one step"):
        gae(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool), 0.99, 0.95)


def vtrace_reference(mu, pi, rewards, values, dones, gamma, rho_bar, c_bar):
    """Eq. 1 of the IMPALA paper as written: nested sums and products, one batch row."""
    horizon = len(rewards)
    ratio = [math.exp(pi[t] - mu[t]) for t in range(horizon)]
    rho = [min(rho_bar, r) for r in ratio]
    c = [min(c_bar, r) for r in ratio]
    disc = [gamma * (0.0 if dones[t] else 1.0) for t in range(horizon)]
    delta = [rho[t] * (rewards[t] + disc[t] * values[t + 1] - values[t]) for t in range(horizon)]
    targets = []
    for s in range(horizon + 1):
        total = values[s]
        for t in range(s, horizon):
            weight = 1.0
            for i in range(s, t):
                weight *= disc[i] * c[i]
            total += weight * delta[t]
        targets.append(total)
    advantages = [rho[s] * (rewards[s] + disc[s] * targets[s + 1] - values[s]) for s in range(horizon)]
    return targets[:-1], advantages


@settings(max_examples=40, deadline=None)
@given(
    horizon=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    rho_bar=st.sampled_from([1.0, 0.5, 2.0]),
    c_bar=st.sampled_from([1.0, 0.7]),
)
def test_vtrace_matches_the_reference_loop(horizon, seed, rho_bar, c_bar):
    g = torch.Generator().manual_seed(seed)
    mu, pi = -torch.rand(horizon, generator=g) * 2, -torch.rand(horizon, generator=g) * 2
    rewards = torch.randn(horizon, generator=g)
    values = torch.randn(horizon + 1, generator=g)
    dones = torch.rand(horizon, generator=g) < 0.3
    result = vtrace(mu, pi, rewards, values, dones, gamma=0.9, rho_bar=rho_bar, c_bar=c_bar)
    targets, advantages = vtrace_reference(
        mu.tolist(), pi.tolist(), rewards.tolist(), values.tolist(), dones.tolist(), 0.9, rho_bar, c_bar
    )
    assert result.value_targets.tolist() == pytest.approx(targets, abs=1e-5)
    assert result.pg_advantages.tolist() == pytest.approx(advantages, abs=1e-5)


def test_vtrace_on_policy_with_lambda_one_equals_gae_returns():
    # With pi == mu and rho_bar = c_bar = 1, V-trace targets are the n-step bootstrapped returns.
    rewards = torch.tensor([1.0, -1.0, 0.5, 2.0])
    values = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    dones = torch.tensor([False, False, True, False])
    logp = torch.log(torch.tensor([0.3, 0.5, 0.2, 0.9]))
    result = vtrace(logp, logp, rewards, values, dones, gamma=0.95)
    _, returns = gae(rewards, values, dones, gamma=0.95, lam=1.0)
    assert result.value_targets.tolist() == pytest.approx(returns.tolist(), abs=1e-6)


def test_ppo_loss_hand_computed():
    old = torch.log(torch.tensor([0.5, 0.5]))
    new = torch.log(torch.tensor([0.8, 0.2]))  # ratios 1.6 and 0.4
    advantages = torch.tensor([1.0, -1.0])
    loss = ppo_loss(
        new,
        old,
        advantages,
        new_values=torch.tensor([1.0, 0.0]),
        returns=torch.tensor([0.0, 0.0]),
        entropy=torch.tensor([0.7, 0.7]),
        clip=0.2,
        value_coef=0.5,
        entropy_coef=0.01,
    )
    # Row 0: A=1, ratio 1.6 -> clipped to 1.2: max(-1.6, -1.2) = -1.2.
    # Row 1: A=-1, ratio 0.4 -> clipped to 0.8: max(0.4, 0.8) = 0.8.
    assert loss.policy.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert loss.value.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)
    assert loss.total.item() == pytest.approx(loss.policy.item() + 0.5 * 0.25 - 0.01 * 0.7)
    assert loss.clip_fraction.item() == 1.0


def test_ppo_loss_gradient_vanishes_outside_the_clip_range():
    old = torch.zeros(1)
    new = torch.tensor([0.5], requires_grad=True)  # ratio e^0.5 > 1.2 with positive advantage: clipped
    loss = ppo_loss(new, old, torch.ones(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), entropy_coef=0.0)
    loss.total.backward()
    assert new.grad is not None and new.grad.item() == 0.0


def test_ppo_loss_sample_weights_scale_each_sample():
    new = torch.tensor([-0.5, -1.0, -2.0])
    old = torch.tensor([-0.6, -0.9, -2.0])
    advantages = torch.tensor([1.0, -1.0, 0.5])
    values, returns, entropy = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0]), torch.ones(3)
    unweighted = ppo_loss(new, old, advantages, values, returns, entropy)
    ones = ppo_loss(new, old, advantages, values, returns, entropy, sample_weights=torch.ones(3))
    assert torch.allclose(unweighted.total, ones.total)
    # A zero weight removes a sample's term; the mean still divides by the batch size (Schaul et al.).
    dropped = ppo_loss(new, old, advantages, values, returns, entropy, sample_weights=torch.tensor([1.0, 1.0, 0.0]))
    first_two = ppo_loss(new[:2], old[:2], advantages[:2], values[:2], returns[:2], entropy[:2])
    assert torch.allclose(dropped.policy, first_two.policy * 2 / 3)
    assert torch.allclose(dropped.value, first_two.value * 2 / 3)
