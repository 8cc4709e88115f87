"""Catch: a small, fast pixel environment for tests and CI.

A ball falls from the top of a `grid` x `grid` board, one row per step; the
agent moves a paddle along the bottom row. Catching the ball is +1, missing it
is -1, and the episode ends when the ball reaches the bottom (`grid - 1`
steps). Frames are uint8 grayscale [frame_size, frame_size], drawn with numpy
in microseconds, so tests measure splitrl, not the simulator.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

BALL, PADDLE = 255, 160


class CatchEnv(gym.Env[np.ndarray, Any]):
    """Actions: discrete 0 = left, 1 = stay, 2 = right; or continuous [-1, 1] (below -1/3 left, above 1/3 right)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(
        self,
        grid: int = 12,
        frame_size: int = 96,
        paddle_width: int = 2,
        continuous: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if grid < 3 or frame_size < grid or frame_size % grid:
            raise ValueError(f"Catch needs grid >= 3 dividing frame_size, got {grid=} {frame_size=}")
        if not 1 <= paddle_width <= grid:
            raise ValueError(f"paddle_width must be in [1, {grid}], got {paddle_width}")
        self.grid, self.cell, self.paddle_width = grid, frame_size // grid, paddle_width
        self.render_mode = render_mode
        self.continuous = continuous
        self.frame_shape = (frame_size, frame_size)
        self.observation_space = gym.spaces.Box(0, 255, self.frame_shape, np.uint8)
        self.action_space: gym.Space[Any] = (
            gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(3)
        )
        self._ball_row = self._ball_col = self._paddle = 0

    def _move(self, action: Any) -> int:
        if self.continuous:
            value = float(np.asarray(action).reshape(-1)[0])
            return -1 if value < -1 / 3 else (1 if value > 1 / 3 else 0)
        return int(action) - 1

    def _frame(self) -> np.ndarray:
        frame = np.zeros(self.frame_shape, np.uint8)
        c = self.cell
        frame[self._ball_row * c : (self._ball_row + 1) * c, self._ball_col * c : (self._ball_col + 1) * c] = BALL
        bottom = (self.grid - 1) * c
        frame[bottom:, self._paddle * c : (self._paddle + self.paddle_width) * c] = PADDLE
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._ball_row = 0
        self._ball_col = int(self.np_random.integers(self.grid))
        self._paddle = int(self.np_random.integers(self.grid - self.paddle_width + 1))
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._paddle = int(np.clip(self._paddle + self._move(action), 0, self.grid - self.paddle_width))
        self._ball_row += 1
        terminated = self._ball_row == self.grid - 1
        reward = 0.0
        if terminated:
            caught = self._paddle <= self._ball_col < self._paddle + self.paddle_width
            reward = 1.0 if caught else -1.0
        return self._frame(), reward, terminated, False, {}

    def render(self) -> np.ndarray:
        return np.repeat(self._frame()[:, :, None], 3, axis=2)
