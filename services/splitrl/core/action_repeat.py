"""Action repeat that leaves the frames it throws away undrawn, where the env allows it.

An action repeat keeps only the last frame of each repeat. Envs that draw their
observation inside `step()` waste most of a repeat drawing frames nobody sees:
most of a CarRacing-v3 step is drawing its state picture, and about 1% of it
physics (docs/design.md §5).

A *render skipper*, registered per env class, tells such an env not to draw:
inside its `skipping()` context `step()` returns the previous observation
instead of a new one, and `draw()` draws the current one on demand. A skipper
may change nothing but the pixels of observations the repeat discards, so the
kept frames, rewards, terminations and truncations are bit-identical to a plain
repeat (tests/unit/test_action_repeat.py compares them step by step). Envs with
no skipper get the plain repeat.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, SupportsFloat

import gymnasium as gym


class RenderSkipper(Protocol):
    """How to step one env class without drawing its observation."""

    def skipping(self, env: Any) -> Any:
        """A context manager: steps taken inside it return a stale observation (the repeat discards it)."""

    def draw(self, env: Any) -> Any:
        """Draw and return the observation of the env's current state (as its step() would have)."""


class _CarRacingSkipper:
    """gymnasium's CarRacing: step() sets `self.state = self._render("state_pixels")`.

    Drawing reads the car and the track and writes only pygame surfaces, so not
    drawing changes nothing the physics, rewards or termination depend on.
    """

    @contextmanager
    def skipping(self, env: Any) -> Iterator[None]:
        # An instance attribute shadows the method (or the fast draw's, core.fast_draw, itself one, kept aside);
        # a copy, as step() returns fresh arrays.
        drawing = vars(env).get("_render")
        env._render = lambda mode: env.state.copy()
        try:
            yield
        finally:
            if drawing is None:
                del env._render
            else:
                env._render = drawing

    def draw(self, env: Any) -> Any:
        env.state = env._render("state_pixels")
        return env.state


#: Skippers by the env class's "module.QualifiedName" (no import of Box2D until a CarRacing is made).
RENDER_SKIPPERS: dict[str, RenderSkipper] = {
    "gymnasium.envs.box2d.car_racing.CarRacing": _CarRacingSkipper(),
}


def env_class_key(env: gym.Env[Any, Any]) -> str:
    """`env`'s innermost class as "module.QualifiedName": the key of per-class registries such as
    RENDER_SKIPPERS (no import of the class's module needed to list it)."""
    cls = type(env.unwrapped)
    return f"{cls.__module__}.{cls.__qualname__}"


def registered_class_key(env_id: str) -> str | None:
    """The env_class_key that `env_id`'s envs will have, read from gymnasium's registry without making one (so
    without importing its module); None for an unregistered id or an entry point that is not a "module:Class"
    string."""
    entry_point = gym.spec(env_id).entry_point if env_id in gym.registry else None
    return entry_point.replace(":", ".") if isinstance(entry_point, str) else None


def render_skipper_for(env: gym.Env[Any, Any]) -> RenderSkipper | None:
    """The registered skipper of `env`'s innermost class, or None (plain repeat)."""
    return RENDER_SKIPPERS.get(env_class_key(env))


class ActionRepeat(gym.Wrapper[Any, Any, Any, Any]):
    """Repeat each action `repeat` times, summing rewards; stops early when the episode ends.

    The observation returned is the last step's. With `skip_render` (the default)
    and a registered skipper, only that one is drawn. Wrap the env as made by
    gym.make, below any observation transform, so transforms also run once per repeat.
    """

    def __init__(self, env: gym.Env[Any, Any], repeat: int, skip_render: bool = True) -> None:
        if repeat < 1:
            raise ValueError(f"action repeat must be >= 1, got {repeat}")
        super().__init__(env)
        self.repeat = repeat
        self.skipper = render_skipper_for(env) if skip_render else None

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.skipper is None or self.repeat == 1:
            return self._plain_step(action)
        total = 0.0
        for _ in range(self.repeat - 1):
            with self.skipper.skipping(self.env.unwrapped):
                _, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:  # ended on a frame that was not drawn: draw it now
                return self.skipper.draw(self.env.unwrapped), total, terminated, truncated, info
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, total + float(reward), terminated, truncated, info

    def _plain_step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info
