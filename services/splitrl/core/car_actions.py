"""CarRacing with discrete actions that use the whole throttle: `splitrl/CarRacingThrottle-v0`.

gymnasium's discrete CarRacing (`continuous=False`) has five actions, and its "gas" presses the throttle to 0.2
of its travel, never while steering. A car that only ever has a fifth of its engine accelerates slowly (about
half the speed of full throttle after 100 frames from a standstill) and coasts through every turn. That caps
the score: an episode is cut at 1,000 frames and pays 1000/N per tile and -0.1 per frame, so 900 ("solved")
needs about every tile within those 1,000 frames, and the discrete recipe's policies run out of frames first.

This env is the same CarRacing (continuous controls underneath, same physics, rewards, tracks and pictures) with
a discrete action table over those controls. The default table is every combination of steering full left,
straight or full right, no throttle or full throttle, and no brake or a light brake (0.2): 12 actions. A
categorical policy keeps what made the discrete recipe learn; the car gets the engine a continuous agent has.
Another table comes in as env_kwargs: {"actions": [[steer, gas, brake], ...]} (steer -1 full left to +1 full
right, gas and brake 0 to 1, as CarRacing's continuous action).

With it a policy samples better but its most likely action drives worse (it sets its speed by mixing throttle
and coasting, which argmax cannot do), so configs/carracing.yaml keeps the discrete env (docs/results/learning.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "splitrl/CarRacingThrottle-v0"

#: (steer, gas, brake) of each discrete action: steer {-1, 0, 1} x gas {1, 0} x brake {0.2, 0}. No partial throttle:
#: given gymnasium's 0.2 beside full throttle, a policy keeps to the 0.2 it starts with and leaves full throttle unused.
DEFAULT_ACTIONS: tuple[tuple[float, float, float], ...] = tuple(
    (steer, gas, brake) for steer in (-1.0, 0.0, 1.0) for gas in (1.0, 0.0) for brake in (0.2, 0.0)
)


class CarRacingThrottle(gym.ActionWrapper[Any, Any, np.ndarray]):
    """A continuous CarRacing-v3 driven by the index of a row of `actions` (Discrete(len(actions)))."""

    def __init__(self, actions: Sequence[Sequence[float]] = DEFAULT_ACTIONS, **car_racing_kwargs: Any) -> None:
        continuous = car_racing_kwargs.pop("continuous", True)
        if continuous is not True:
            raise ValueError(f"{ENV_ID} drives CarRacing's continuous controls; got continuous={continuous!r}")
        from gymnasium.envs.box2d.car_racing import CarRacing  # imports Box2D: only once an env is made

        super().__init__(CarRacing(continuous=True, **car_racing_kwargs))
        self.table = _checked_table(actions, self.env.action_space)
        self.action_space = gym.spaces.Discrete(len(self.table))

    def action(self, action: Any) -> np.ndarray:
        if not self.action_space.contains(action):
            raise ValueError(f"{ENV_ID} takes an action index in 0..{len(self.table) - 1}, got {action!r}")
        return self.table[int(action)].copy()


def _checked_table(actions: Sequence[Sequence[float]], controls: gym.spaces.Space[Any]) -> np.ndarray:
    """`actions` as float32 [N, 3] rows inside CarRacing's control box; ValueError quoting what is not."""
    try:
        table = np.asarray(actions, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{ENV_ID} actions must be [steer, gas, brake] rows, got {actions!r}: {error}") from None
    assert isinstance(controls, gym.spaces.Box)
    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] != controls.shape[0]:
        raise ValueError(f"{ENV_ID} actions must be at least 2 [steer, gas, brake] rows, got {actions!r}")
    outside = ~((table >= controls.low) & (table <= controls.high)).all(axis=1)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise ValueError(
            f"{ENV_ID} action {row} {actions[row]!r} is outside CarRacing's controls "
            f"(steer -1..1, gas 0..1, brake 0..1)"
        )
    return table


def register() -> None:
    """Register ENV_ID with CarRacing-v3's episode limit (1,000 frames) and reward threshold (900)."""
    if ENV_ID not in gym.registry:
        car_racing = gym.spec("CarRacing-v3")
        gym.register(
            id=ENV_ID,
            entry_point=f"{__name__}:CarRacingThrottle",
            max_episode_steps=car_racing.max_episode_steps,
            reward_threshold=car_racing.reward_threshold,
        )


register()
