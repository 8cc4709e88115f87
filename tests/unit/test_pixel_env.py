"""The Catch pixel env, make_env's image checks and conversions, and ActionRepeat."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import splitrl.core.envs as envs
from splitrl.core.action_repeat import ActionRepeat
from splitrl.core.envs import CATCH_ID, action_spec_from_space, make_env
from splitrl.core.pixel_env import BALL, PADDLE, CatchEnv
from splitrl.core.spec import ActionSpec

LEFT, STAY, RIGHT = 0, 1, 2


def positions(env: gym.Env, frame: np.ndarray) -> tuple[int, int]:
    """(ball column, paddle's leftmost column), read from the pixels."""
    cell = env.unwrapped.cell
    ball_col = int(np.argwhere(frame == BALL)[0][1]) // cell
    paddle_col = int(np.argwhere(frame[-1] == PADDLE)[0][0]) // cell
    return ball_col, paddle_col


def chase(env: gym.Env, frame: np.ndarray) -> int:
    """The always-correct policy: move the paddle toward the ball's column."""
    ball, paddle = positions(env, frame)
    if ball < paddle:
        return LEFT
    if ball >= paddle + env.unwrapped.paddle_width:
        return RIGHT
    return STAY


def flee(env: gym.Env, frame: np.ndarray) -> int:
    """Move to the wall farthest from the ball."""
    ball, _ = positions(env, frame)
    return RIGHT if ball < env.unwrapped.grid / 2 else LEFT


def play(env: gym.Env, policy, seed: int, to_action=lambda a: a) -> tuple[float, int, list[float]]:
    frame, _ = env.reset(seed=seed)
    rewards: list[float] = []
    while True:
        frame, reward, terminated, truncated, _ = env.step(to_action(policy(env, frame)))
        rewards.append(float(reward))
        assert not truncated
        if terminated:
            return sum(rewards), len(rewards), rewards


def test_catch_is_registered():
    assert envs.CATCH_ID == "splitrl/Catch-v0"
    assert CATCH_ID in gym.registry


@pytest.mark.parametrize("kwargs", [{}, {"continuous": True}], ids=["discrete", "continuous"])
def test_catch_passes_gymnasium_env_checker(kwargs):
    env = gym.make(CATCH_ID, **kwargs)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_catch_observations_are_uint8_frames():
    env = gym.make(CATCH_ID, grid=6, frame_size=48)
    frame, _ = env.reset(seed=0)
    assert frame.shape == (48, 48)
    assert frame.dtype == np.uint8
    assert env.observation_space.contains(frame)
    assert set(np.unique(frame)) == {0, PADDLE, BALL}
    assert env.render().shape == (48, 48, 3)


@pytest.mark.parametrize("grid", [3, 6, 12])
def test_episode_lasts_grid_minus_one_steps_with_reward_only_at_the_end(grid):
    env = gym.make(CATCH_ID, grid=grid)
    _, length, rewards = play(env, lambda env, frame: STAY, seed=grid)
    assert length == grid - 1
    assert rewards[:-1] == [0.0] * (grid - 2)
    assert rewards[-1] in (1.0, -1.0)


def test_chasing_the_ball_catches_it_every_episode():
    env = gym.make(CATCH_ID)
    results = [play(env, chase, seed) for seed in range(30)]
    assert {total for total, _, _ in results} == {1.0}
    assert {length for _, length, _ in results} == {11}


def test_fleeing_the_ball_misses_it_every_episode():
    env = gym.make(CATCH_ID)
    assert {play(env, flee, seed)[0] for seed in range(30)} == {-1.0}


def test_continuous_variant_maps_thirds_to_moves():
    env = gym.make(CATCH_ID, continuous=True)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    to_continuous = {LEFT: np.array([-1.0], np.float32), STAY: np.array([0.0], np.float32)}
    to_continuous[RIGHT] = np.array([1.0], np.float32)
    results = [play(env, chase, seed, to_action=to_continuous.__getitem__)[0] for seed in range(10)]
    assert results == [1.0] * 10

    frame, _ = env.reset(seed=0)
    for value, move in [(0.3, 0), (-0.3, 0), (0.34, 1), (-0.34, -1)]:
        _, before = positions(env, frame)
        frame, *_ = env.step(np.array([value], np.float32))
        after = positions(env, frame)[1]
        assert after == np.clip(before + move, 0, env.unwrapped.grid - env.unwrapped.paddle_width), value


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grid": 2},
        {"grid": 12, "frame_size": 100},
        {"grid": 12, "frame_size": 6},
        {"paddle_width": 0},
        {"grid": 6, "paddle_width": 7},
    ],
)
def test_catch_rejects_bad_constructor_args(kwargs):
    with pytest.raises(ValueError, match=r"grid|paddle_width"):
        CatchEnv(**kwargs)


# --- make_env --------------------------------------------------------------------------------------


class FrameEnv(gym.Env):
    """uint8 images of a given shape; reward = step number, terminates after `length` steps."""

    def __init__(self, shape: tuple[int, ...] = (96, 96, 1), length: int = 5) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.steps, self.calls = length, 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return np.full(self.observation_space.shape, 7, np.uint8), {}

    def step(self, action):
        self.steps += 1
        self.calls += 1
        frame = np.full(self.observation_space.shape, self.steps, np.uint8)
        return frame, float(self.steps), self.steps >= self.length, False, {}


GRAY1_ID, FOUR_CHANNELS_ID = "splitrl-test/Gray1-v0", "splitrl-test/FourChannels-v0"
if GRAY1_ID not in gym.registry:
    gym.register(id=GRAY1_ID, entry_point=lambda: FrameEnv((96, 96, 1)))
if FOUR_CHANNELS_ID not in gym.registry:
    gym.register(id=FOUR_CHANNELS_ID, entry_point=lambda: FrameEnv((96, 96, 4)))


def test_make_env_rejects_an_env_without_image_observations():
    with pytest.raises(ValueError, match=r"'CartPole-v1' has observation space .*needs uint8 images"):
        make_env("CartPole-v1", {}, 96, 1)


def test_make_env_rejects_images_with_four_channels():
    with pytest.raises(ValueError, match="4 channels"):
        make_env(FOUR_CHANNELS_ID, {}, 96, 1)


@pytest.mark.filterwarnings("ignore:builtin type .* has no __module__:DeprecationWarning")  # Box2D's SWIG
def test_make_env_turns_rgb_into_grayscale_frames():
    env = make_env("CarRacing-v3", {}, 96, 1)
    try:
        assert env.observation_space.shape == (96, 96)
        assert env.observation_space.dtype == np.uint8
        frame, _ = env.reset(seed=0)
        assert frame.shape == (96, 96)
        assert frame.dtype == np.uint8
        assert len(np.unique(frame)) > 2  # a picture, not a blank frame
        frame, *_ = env.step(np.zeros(3, np.float32))
        assert frame.shape == (96, 96)
        assert action_spec_from_space(env.action_space) == ActionSpec(
            "continuous", 3, (-1.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        )
    finally:
        env.close()


def test_make_env_drops_a_single_channel():
    env = make_env(GRAY1_ID, {}, 96, 1)
    frame, _ = env.reset(seed=0)
    assert frame.shape == (96, 96)
    assert env.observation_space.shape == (96, 96)


def test_make_env_keeps_catch_frames_unchanged():
    env = make_env(CATCH_ID, {"grid": 6}, 96, 1)
    frame, _ = env.reset(seed=3)
    reference, _ = CatchEnv(grid=6).reset(seed=3)
    assert np.array_equal(frame, reference)


def test_make_env_applies_the_action_repeat():
    env = make_env(CATCH_ID, {}, 96, 4)
    env.reset(seed=0)
    outcomes = [env.step(STAY)[2] for _ in range(3)]  # 11 steps: 4 + 4 + 3
    assert outcomes == [False, False, True]


# --- ActionRepeat ----------------------------------------------------------------------------------


def test_action_repeat_sums_rewards():
    inner = FrameEnv(length=100)
    env = ActionRepeat(inner, 3)
    env.reset(seed=0)
    frame, reward, terminated, truncated, _ = env.step(0)
    assert reward == 1 + 2 + 3
    assert int(frame[0, 0, 0]) == 3  # the last frame
    assert (terminated, truncated) == (False, False)
    assert env.step(0)[1] == 4 + 5 + 6
    assert inner.calls == 6


def test_action_repeat_stops_when_the_episode_ends():
    inner = FrameEnv(length=5)
    env = ActionRepeat(inner, 3)
    env.reset(seed=0)
    env.step(0)
    _, reward, terminated, _, _ = env.step(0)
    assert terminated
    assert reward == 4 + 5
    assert inner.calls == 5


def test_action_repeat_of_one_is_a_plain_step():
    env = ActionRepeat(FrameEnv(length=5), 1)
    env.reset(seed=0)
    assert env.step(0)[1] == 1


def test_action_repeat_rejects_zero():
    with pytest.raises(ValueError, match="got 0"):
        ActionRepeat(FrameEnv(), 0)


def test_make_env_resizes_frames_of_another_size_without_opencv():
    env = make_env("splitrl/Catch-v0", {"frame_size": 48, "grid": 12}, frame_size=96, action_repeat=1)
    frame, _ = env.reset(seed=0)
    assert frame.shape == (96, 96) and frame.dtype == np.uint8
    assert env.observation_space.contains(frame)
    # Area resize of a 4-px cell to 8 px keeps the ball's full brightness.
    assert frame.max() == 255
    env.close()
