"""splitrl/CarRacingThrottle-v0: a discrete action table over CarRacing's continuous controls."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from splitrl.core.action_repeat import registered_class_key
from splitrl.core.car_actions import DEFAULT_ACTIONS, ENV_ID
from splitrl.core.envs import PYGAME_EXTRAS_UNUSED_BY, action_spec_of, make_env


def test_each_index_drives_exactly_as_its_row_of_continuous_controls() -> None:
    """Same tracks, physics, rewards, pictures and time limit as CarRacing-v3 driven with the table's rows."""
    table = gym.make(ENV_ID, max_episode_steps=120)
    continuous = gym.make("CarRacing-v3", continuous=True, max_episode_steps=120)
    indices = np.random.default_rng(0).integers(0, len(DEFAULT_ACTIONS), size=200)
    table_obs, _ = table.reset(seed=3)
    continuous_obs, _ = continuous.reset(seed=3)
    np.testing.assert_array_equal(table_obs, continuous_obs)
    for step, index in enumerate(indices):
        table_out = table.step(int(index))
        continuous_out = continuous.step(np.array(DEFAULT_ACTIONS[index], dtype=np.float32))
        np.testing.assert_array_equal(table_out[0], continuous_out[0], err_msg=f"frame differs at step {step}")
        assert table_out[1:4] == continuous_out[1:4], f"reward/terminated/truncated differ at step {step}"
        if table_out[2] or table_out[3]:
            break
    assert table_out[3] and step == 119, "the episode ends at the time limit given, as CarRacing-v3's would"
    assert gym.spec(ENV_ID).max_episode_steps == gym.spec("CarRacing-v3").max_episode_steps == 1000
    table.close()
    continuous.close()


def test_the_default_table_steers_throttles_and_brakes_in_every_combination() -> None:
    assert len(DEFAULT_ACTIONS) == len(set(DEFAULT_ACTIONS)) == 12
    assert {steer for steer, _, _ in DEFAULT_ACTIONS} == {-1.0, 0.0, 1.0}
    assert {(gas, brake) for _, gas, brake in DEFAULT_ACTIONS} == {(1.0, 0.2), (1.0, 0.0), (0.0, 0.2), (0.0, 0.0)}
    assert (0.0, 0.0, 0.0) in DEFAULT_ACTIONS and (0.0, 1.0, 0.0) in DEFAULT_ACTIONS


def test_the_stack_sees_a_discrete_env_that_takes_the_fast_paths() -> None:
    assert action_spec_of(ENV_ID, {}).kind == "discrete"
    assert action_spec_of(ENV_ID, {}).size == len(DEFAULT_ACTIONS)
    assert action_spec_of(ENV_ID, {"actions": [[0, 1, 0], [1, 0, 0], [-1, 0, 0]]}).size == 3
    assert registered_class_key(ENV_ID) in PYGAME_EXTRAS_UNUSED_BY
    env = make_env(ENV_ID, {}, 96, 4)
    assert env.get_wrapper_attr("skipper") is not None  # the fast repeat: only the kept frame is drawn
    frame, _ = env.reset(seed=0)
    assert frame.shape == (96, 96) and frame.dtype == np.uint8
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"continuous": False}, "continuous=False"),
        ({"actions": [[0, 0, 0]]}, "at least 2"),
        ({"actions": [[0, 0], [1, 1]]}, "[[0, 0], [1, 1]]"),
        ({"actions": [[0, 0, 0], [0, 1.5, 0]]}, "action 1 [0, 1.5, 0]"),
        ({"actions": "fast"}, "'fast'"),
    ],
)
def test_a_bad_table_is_refused_quoting_it(kwargs: dict[str, object], quoted: str) -> None:
    with pytest.raises(ValueError, match="CarRacingThrottle") as refused:
        gym.make(ENV_ID, **kwargs)
    assert quoted in str(refused.value)


def test_an_index_outside_the_table_is_refused() -> None:
    env = gym.make(ENV_ID, disable_env_checker=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"0\.\.11, got 12"):
        env.step(12)
    env.close()
