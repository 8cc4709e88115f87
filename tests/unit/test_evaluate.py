"""What `splitrl eval` counts per episode besides its return: whether the time limit cut it, and against what
score gymnasium's registry calls the env solved."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from splitrl.core.envs import CATCH_ID
from splitrl.run.evaluate import _reward_threshold, play_episode


class _StayActor:
    version = 0

    def start_episode(self) -> None:
        pass

    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        return 1


def test_an_episode_the_time_limit_cuts_is_told_from_one_that_ends() -> None:
    ended = gym.make(CATCH_ID, grid=6)  # the ball lands after grid - 1 steps: the episode terminates
    assert play_episode(ended, _StayActor(), seed=0, deterministic=True, recorder=None)[1:] == (5, False)
    cut = gym.make(CATCH_ID, grid=6, max_episode_steps=3)
    episode_return, steps, out_of_time = play_episode(cut, _StayActor(), seed=0, deterministic=True, recorder=None)
    assert (episode_return, steps, out_of_time) == (0.0, 3, True)


def test_the_reward_threshold_is_the_registrys() -> None:
    assert _reward_threshold("CarRacing-v3") == 900.0
    assert _reward_threshold("splitrl/CarRacingThrottle-v0") == 900.0
    assert _reward_threshold(CATCH_ID) is None


class _SamplingActor:
    """Draws uniformly among Catch's three actions with torch's generator, as a sampling policy does."""

    version = 0

    def __init__(self) -> None:
        self.actions: list[int] = []

    def start_episode(self) -> None:
        pass

    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        self.actions.append(int(torch.multinomial(torch.ones(3), 1)))
        return self.actions[-1]


def test_a_sampling_policy_draws_the_same_actions_on_the_same_episode() -> None:
    env = gym.make(CATCH_ID, grid=12)
    first, again, other = _SamplingActor(), _SamplingActor(), _SamplingActor()
    play_episode(env, first, seed=7, deterministic=False, recorder=None)
    torch.rand(5)  # whatever ran in between
    play_episode(env, again, seed=7, deterministic=False, recorder=None)
    play_episode(env, other, seed=8, deterministic=False, recorder=None)
    assert first.actions == again.actions and len(first.actions) == 11
    assert other.actions != first.actions
