"""CarRacing drawn with the numpy road and one font gives gymnasium's pixels exactly, step by step."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pygame
import pytest

from splitrl.core import fast_draw
from splitrl.core.envs import CATCH_ID, make_env
from splitrl.core.fast_draw import install_fast_draw

GAS, RIGHT = 3, 2  # CarRacing's discrete actions: 0 nothing, 1 left, 2 right, 3 gas, 4 brake


def _drive(seed: int) -> list[int]:
    """Frames of actions that cover the opening zoom (first 50 frames), tiles being visited (their colour
    changes), a spin off the track onto the grass, then random driving."""
    rng = np.random.default_rng(seed)
    return [GAS] * 60 + [RIGHT] * 40 + [GAS] * 60 + rng.integers(0, 5, 80).tolist()


def _pair(**kwargs: Any) -> tuple[gym.Env[Any, Any], gym.Env[Any, Any]]:
    fast = gym.make("CarRacing-v3", continuous=False, render_mode="rgb_array", **kwargs)
    plain = gym.make("CarRacing-v3", continuous=False, render_mode="rgb_array", **kwargs)
    assert install_fast_draw(fast)
    return fast, plain


@pytest.mark.parametrize("domain_randomize", [False, True])
def test_the_numpy_road_draws_gymnasiums_pixels(domain_randomize: bool) -> None:
    fast, plain = _pair(domain_randomize=domain_randomize)
    assert {"_render_road", "_render"} <= set(vars(fast.unwrapped))  # both stand-ins, checked together
    try:
        for episode, seed in enumerate((3, 4)):  # a reset builds a new track: its vertices are read again
            fast_obs, _ = fast.reset(seed=seed)
            np.testing.assert_array_equal(fast_obs, plain.reset(seed=seed)[0])
            for frame, action in enumerate(_drive(seed)):
                ours, theirs = fast.step(action), plain.step(action)
                np.testing.assert_array_equal(ours[0], theirs[0], err_msg=f"episode {episode}, frame {frame}")
                assert ours[1:4] == theirs[1:4]
                # The whole 1000 x 800 canvas, not only its 96 x 96 scaled copy.
                np.testing.assert_array_equal(
                    pygame.surfarray.pixels3d(fast.unwrapped.surf), pygame.surfarray.pixels3d(plain.unwrapped.surf)
                )
                if frame % 40 == 0:  # the video render (--record) goes through the same road drawing
                    np.testing.assert_array_equal(fast.render(), plain.render())
        assert fast.unwrapped.tile_visited_count > 0  # the drive did change tile colours
    finally:
        fast.close()
        plain.close()


def test_make_env_installs_it_and_can_leave_it_out() -> None:
    drawn_fast = make_env("CarRacing-v3", {"continuous": False}, 96, 4)
    drawn_plain = make_env("CarRacing-v3", {"continuous": False}, 96, 4, fast_draw=False)
    try:
        assert "_render_road" not in vars(drawn_plain.unwrapped)
        np.testing.assert_array_equal(drawn_fast.reset(seed=0)[0], drawn_plain.reset(seed=0)[0])
        for action in [GAS] * 20:
            np.testing.assert_array_equal(drawn_fast.step(action)[0], drawn_plain.step(action)[0])
        # still there after steps whose repeated frames went undrawn (the repeat shadows _render meanwhile)
        assert {"_render_road", "_render"} <= set(vars(drawn_fast.unwrapped))
    finally:
        drawn_fast.close()
        drawn_plain.close()


def test_the_score_font_is_loaded_once_per_process_and_again_after_pygame_lets_its_fonts_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[Any] = []
    font_class = pygame.font.Font
    monkeypatch.setattr(pygame.font, "Font", lambda *args: loaded.append(args) or font_class(*args))
    monkeypatch.setattr(fast_draw._ScoreFont, "loaded", None)  # as in a new process
    fast = [make_env("CarRacing-v3", {"continuous": False}, 96, 4) for _ in range(2)]
    plain = make_env("CarRacing-v3", {"continuous": False}, 96, 4, fast_draw=False)
    try:
        for env in fast:
            env.reset(seed=0)
            for action in [GAS] * 5:
                env.step(action)
        assert loaded == [(pygame.font.get_default_font(), 42)]  # two envs, 12 draws
        plain.reset(seed=0)
        for action in [GAS] * 5:
            plain.step(action)
        first = fast_draw._ScoreFont.loaded
        pygame.font.quit()
        for action in [GAS] * 5:  # pygame.font.init() at each draw brings pygame's fonts back, and a new font ours
            np.testing.assert_array_equal(fast[0].step(action)[0], plain.step(action)[0])
        assert fast_draw._ScoreFont.loaded is not first
    finally:
        for env in [*fast, plain]:
            env.close()


def test_a_render_from_another_gymnasium_keeps_loading_its_font(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_draw, "KNOWN_RENDER_SOURCE", "another gymnasium")
    env = gym.make("CarRacing-v3", continuous=False)
    assert install_fast_draw(env)  # the road, checked on its own
    assert "_render_road" in vars(env.unwrapped) and "_render" not in vars(env.unwrapped)
    env.close()


def test_envs_without_a_fast_draw_are_left_alone() -> None:
    env = gym.make(CATCH_ID)
    assert not install_fast_draw(env)
    env.close()


@pytest.mark.parametrize(
    "angle", [0.0, -0.0, np.pi / 2, -np.pi / 2, np.pi, 3 * np.pi / 2, 2 * np.pi, 7 * np.pi, 1e-7, -1e-7, 1e6, 2.345]
)
def test_numpy_places_every_vertex_on_the_double_pygame_does(angle: float) -> None:
    """Quarter turns (which pygame snaps to exact values), tiny and huge angles: the same coordinates exactly."""
    points = np.random.default_rng(0).uniform(-400, 400, (50, 4, 2))
    zoom, translation = 2.7, (500.25, 200.5)
    ours = fast_draw._to_screen(points, zoom, translation, angle)
    for polygon, placed in zip(points, ours, strict=True):
        for (x, y), (px, py) in zip(polygon, placed, strict=True):
            rotated = pygame.math.Vector2(float(x), float(y)).rotate_rad(angle)
            assert (rotated[0] * zoom + translation[0], rotated[1] * zoom + translation[1]) == (px, py)


def test_the_numpy_road_is_left_out_for_other_road_code_or_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    env = gym.make("CarRacing-v3", continuous=False)
    monkeypatch.setattr(fast_draw, "KNOWN_ROAD_SOURCE", "another gymnasium")
    assert not install_fast_draw(env)
    monkeypatch.undo()
    monkeypatch.setattr(fast_draw.platform, "machine", lambda: "aarch64")
    assert not install_fast_draw(env)
    assert "_render_road" not in vars(env.unwrapped)
    env.close()
