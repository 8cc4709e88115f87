"""Fast action repeat (frames it discards are not drawn) equals the plain one, step by step, on CarRacing-v3."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from splitrl.core.action_repeat import ActionRepeat, env_class_key, registered_class_key, render_skipper_for
from splitrl.core.envs import CATCH_ID, make_env

# 100 frames is 12 repeats of 8 and 4 frames of a 13th: every episode is truncated on a frame the fast
# repeat did not draw, so the test also covers drawing the final frame on demand.
EPISODE_FRAMES = 100
REPEAT = 8


def _car_racing(continuous: bool, fast: bool) -> ActionRepeat:
    env = gym.make("CarRacing-v3", continuous=continuous, max_episode_steps=EPISODE_FRAMES)
    return ActionRepeat(env, REPEAT, skip_render=fast)


def _actions(space: gym.Space[Any], seed: int, count: int) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(count)]


@pytest.mark.parametrize(("seed", "continuous"), [(0, True), (1, False), (2, True)])
def test_fast_repeat_matches_the_plain_repeat_step_by_step(seed: int, continuous: bool) -> None:
    fast, plain = _car_racing(continuous, fast=True), _car_racing(continuous, fast=False)
    assert fast.skipper is not None and plain.skipper is None
    for episode in range(2):
        fast_obs, _ = fast.reset(seed=seed + 10 * episode)
        plain_obs, _ = plain.reset(seed=seed + 10 * episode)
        np.testing.assert_array_equal(fast_obs, plain_obs)
        steps = 0
        for action in _actions(fast.action_space, seed + episode, 100):
            fast_out, plain_out = fast.step(action), plain.step(action)
            steps += 1
            np.testing.assert_array_equal(fast_out[0], plain_out[0], err_msg=f"frame differs at step {steps}")
            assert fast_out[1:4] == plain_out[1:4], f"reward/terminated/truncated differ at step {steps}"
            if fast_out[2] or fast_out[3]:
                break
        assert fast_out[3], "each episode must reach its time limit inside the loop"
        assert steps == -(-EPISODE_FRAMES // REPEAT)
    fast.close()
    plain.close()


def test_the_skipped_frames_are_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _car_racing(continuous=False, fast=True)
    env.reset(seed=0)
    draws = []
    render = type(env.unwrapped)._render
    monkeypatch.setattr(type(env.unwrapped), "_render", lambda self, mode: draws.append(mode) or render(self, mode))
    env.step(0)
    assert draws == ["state_pixels"]  # one drawing per repeat of 8 frames
    env.close()


def test_envs_without_a_skipper_get_the_plain_repeat() -> None:
    env = gym.make(CATCH_ID)
    assert render_skipper_for(env) is None
    assert ActionRepeat(env, 4).skipper is None


def test_make_env_repeats_below_the_observation_transforms() -> None:
    env = make_env("CarRacing-v3", {"continuous": False}, 64, 4)
    assert env.observation_space.shape == (64, 64)
    frame, _ = env.reset(seed=0)
    assert frame.shape == (64, 64) and frame.dtype == np.uint8
    assert isinstance(env.unwrapped, gym.Env)
    wrappers = []
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        wrappers.append(type(layer).__name__)
        layer = layer.env
    assert wrappers.index("ActionRepeat") > wrappers.index("TransformObservation")
    env.close()


@pytest.mark.parametrize("env_id", ["CarRacing-v3", "splitrl/Catch-v0"])
def test_the_registry_names_the_class_key_an_env_will_have(env_id):
    env = gym.make(env_id)
    try:
        assert registered_class_key(env_id) == env_class_key(env)
    finally:
        env.close()
    assert registered_class_key("splitrl/NoSuchEnv-v0") is None
