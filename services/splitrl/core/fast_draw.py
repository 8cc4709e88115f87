"""Drawing an env's observation faster, pixel for pixel the same: CarRacing's road placed by numpy, and its
score written with a font loaded once.

gymnasium's CarRacing draws every observation on a 1000 x 800 canvas and scales it
down to 96 x 96. About half of the time of a drawn frame is Python placing ~700
polygons (400 grass patches, ~300 road tiles) one vertex at a time through
pygame.math.Vector2, to find the ~60 that are on screen. `_NumpyRoad`
places them all with a few array operations per frame and hands pygame the same
coordinates (same float64 arithmetic, in the same order), in the same drawing order
and colours. So the canvas, the observation and `render()` are bit-identical to
gymnasium's (tests/unit/test_fast_draw.py compares them step by step, driving on and
off the track, with and without domain randomisation). Everything else (the car,
the indicators, the scaling) is still gymnasium's own code.

gymnasium also loads pygame's default font from its TrueType file at every draw, to
write the score, and a new font has no glyphs rendered yet: hundreds of microseconds
a frame, against a few with one font kept (`_RenderWithOneFont`, one per process;
benchmarks/action_repeat.py times it). The same font
renders the same glyphs, so the pixels stay gymnasium's (the same test).

A *fast draw* is registered per env class, like the render skippers of
splitrl.core.action_repeat, and installed by make_env (`fast_draw=False` keeps the
env's own drawing, to time or check it: benchmarks/action_repeat.py). It installs
itself only where its equivalence was checked: gymnasium's road-drawing source as
tested here (a hash of it), and an x86-64 machine, where pygame's rotation is
compiled without fused multiply-adds (other compilers may fuse `c * x - s * y`,
which rounds once instead of twice). Elsewhere the env keeps its own drawing. The
font goes with the road, where gymnasium's _render is the one tested (its own hash).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import platform
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from splitrl.core.action_repeat import env_class_key

log = logging.getLogger(__name__)

#: sha256 of the source of CarRacing._render_road and _draw_colored_polygon that _NumpyRoad reproduces
#: (gymnasium 1.4.0; tests/unit/test_fast_draw.py compares the pixels).
KNOWN_ROAD_SOURCE = "488262bbdbbe17655f6c50900df8ce544c0043584c48c4263588969ad4f9ca8b"
#: sha256 of the source of CarRacing._render, which _RenderWithOneFont follows for the observation and video modes.
KNOWN_RENDER_SOURCE = "55de32c78669c2be249b6e4edba992c0c332a0f43c4cbe2f7255fa8dd06a3924"
#: Machines whose pygame wheels compute a rotation in separately rounded operations, as numpy does.
CHECKED_MACHINES = ("x86_64", "AMD64")


def _pygame_rotation(angle: float) -> tuple[float, float]:
    """(cos, sin) exactly as pygame's Vector2.rotate_rad(angle) applies them.

    pygame reduces the angle modulo 2 pi and snaps quarter turns to exact 0 / +-1 first;
    rotating the unit vector (1, 0) returns its (cos, sin) unchanged (1 * c - 0 * s == c).
    """
    import pygame

    cos, sin = pygame.math.Vector2(1.0, 0.0).rotate_rad(angle)
    return float(cos), float(sin)


def _to_screen(points: np.ndarray, zoom: float, translation: tuple[float, float], angle: float) -> np.ndarray:
    """World points [..., 2] -> canvas points [..., 2]: CarRacing's _draw_colored_polygon, element-wise.

    Its per-vertex arithmetic is (x c - y s) * zoom + tx, (x s + y c) * zoom + ty in float64; numpy does
    the same IEEE operations in the same order, so every coordinate is the same double.
    """
    cos, sin = _pygame_rotation(angle)
    x, y = points[..., 0], points[..., 1]
    rotated_x = cos * x - sin * y
    rotated_y = sin * x + cos * y
    return np.stack([rotated_x * zoom + translation[0], rotated_y * zoom + translation[1]], axis=-1)


class _NumpyRoad:
    """CarRacing._render_road, with the polygons placed by numpy; bound to one env (instance attribute).

    Invariants it relies on (gymnasium 1.x): the grass patches are fixed; `road_poly` is a new list at each
    reset whose vertices never change, while a tile's colour array is mutated when the car first drives on
    it (so colours are read at every draw, vertices only once per track).
    """

    def __init__(self, env: Any) -> None:
        from gymnasium.envs.box2d import car_racing

        self.env = env
        self.module = car_racing
        dim = car_racing.GRASS_DIM
        self.grass = np.array(
            [
                [(dim * x + dim, dim * y), (dim * x, dim * y), (dim * x, dim * y + dim), (dim * x + dim, dim * y + dim)]
                for x in range(-20, 20, 2)
                for y in range(-20, 20, 2)
            ],
            dtype=np.float64,
        )
        self.road_of: list[Any] | None = None  # the road_poly list the vertices below were read from
        self.road_vertices = np.zeros((0, 4, 2))

    def __call__(self, zoom: float, translation: tuple[float, float], angle: float) -> None:
        env, module = self.env, self.module
        bound = module.PLAYFIELD
        field = [(bound, bound), (bound, -bound), (-bound, -bound), (-bound, bound)]
        env._draw_colored_polygon(env.surf, field, env.bg_color, zoom, translation, angle, clip=False)
        grass_color = env.grass_color
        self._draw_visible(self.grass, lambda _: grass_color, zoom, translation, angle)
        if self.road_of is not env.road_poly:
            self.road_of = env.road_poly
            self.road_vertices = np.array(
                [[(p[0], p[1]) for p in poly] for poly, _ in env.road_poly], dtype=np.float64
            ).reshape(-1, 4, 2)
        road = env.road_poly
        self._draw_visible(self.road_vertices, lambda i: [int(c) for c in road[i][1]], zoom, translation, angle)

    def _draw_visible(
        self,
        polygons: np.ndarray,
        color_of: Callable[[int], Any],
        zoom: float,
        translation: tuple[float, float],
        angle: float,
    ) -> None:
        """Draw, in order, the polygons [N, 4, 2] with a vertex inside the canvas grown by MAX_SHAPE_DIM."""
        from pygame import gfxdraw

        if len(polygons) == 0:
            return
        margin, width, height = self.module.MAX_SHAPE_DIM, self.module.WINDOW_W, self.module.WINDOW_H
        screen = _to_screen(polygons, zoom, translation, angle)
        x, y = screen[..., 0], screen[..., 1]
        near = (x >= -margin) & (x <= width + margin) & (y >= -margin) & (y <= height + margin)
        surface = self.env.surf
        for i in np.flatnonzero(near.any(axis=1)).tolist():
            points, color = screen[i].tolist(), color_of(i)
            gfxdraw.aapolygon(surface, points, color)
            gfxdraw.filled_polygon(surface, points, color)


class _ScoreFont:
    """pygame's default font at CarRacing's score size, loaded once per process: ~128 KiB each, so a process's
    envs share one. Loaded again once pygame has let its fonts go (pygame.font.quit(), then init())."""

    SIZE = 42
    loaded: Any = None  # pygame.font.Font

    @classmethod
    def render(cls, text: str) -> Any:
        """`text` as gymnasium writes the score: white on black, antialiased (a new pygame.Surface); pygame.font
        is initialised."""
        import pygame

        try:
            return cls._font().render(text, True, (255, 255, 255), (0, 0, 0))
        except pygame.error:  # "font module quit since font created"
            cls.loaded = None
            return cls._font().render(text, True, (255, 255, 255), (0, 0, 0))

    @classmethod
    def _font(cls) -> Any:
        import pygame

        if cls.loaded is None:
            cls.loaded = pygame.font.Font(pygame.font.get_default_font(), cls.SIZE)
        return cls.loaded


class _RenderWithOneFont:
    """CarRacing._render with the score written in _ScoreFont; bound to one env (instance attribute).

    The observation ("state_pixels") and video ("rgb_array") modes run gymnasium's steps in its order, but for
    the font; the window's modes ("human", "state_pixels_list") go to gymnasium's own method.
    """

    OWN_MODES = ("state_pixels", "rgb_array")

    def __init__(self, env: Any) -> None:
        from gymnasium.envs.box2d import car_racing

        self.env = env
        self.module = car_racing

    def __call__(self, mode: str) -> Any:
        import pygame

        env, module = self.env, self.module
        if mode not in self.OWN_MODES:
            return type(env)._render(env, mode)
        assert mode in env.metadata["render_modes"]
        pygame.font.init()
        if env.clock is None:
            env.clock = pygame.time.Clock()
        if "t" not in env.__dict__:
            return None  # reset() not called yet
        width, height = module.WINDOW_W, module.WINDOW_H
        env.surf = pygame.Surface((width, height))
        angle = -env.car.hull.angle
        zoom = 0.1 * module.SCALE * max(1 - env.t, 0) + module.ZOOM * module.SCALE * min(env.t, 1)
        position = env.car.hull.position
        shift = pygame.math.Vector2((-position[0] * zoom, -position[1] * zoom)).rotate_rad(angle)
        translation = (width / 2 + shift[0], height / 4 + shift[1])
        env._render_road(zoom, translation, angle)
        env.car.draw(env.surf, zoom, translation, angle, mode != "state_pixels")  # rgb_array draws the particles
        env.surf = pygame.transform.flip(env.surf, False, True)
        env._render_indicators(width, height)
        text = _ScoreFont.render(f"{env.reward:04.0f}")
        text_rect = text.get_rect()
        text_rect.center = (60, height - height * 2.5 / 40.0)
        env.surf.blit(text, text_rect)
        size = (module.STATE_W, module.STATE_H) if mode == "state_pixels" else (module.VIDEO_W, module.VIDEO_H)
        return env._create_image_array(env.surf, size)


def source_hash(env_class: Any, *methods: str) -> str | None:
    """sha256 of the source of `env_class`'s `methods`, in order, or None."""
    try:
        source = "".join(inspect.getsource(getattr(env_class, method)) for method in methods)
    except (AttributeError, OSError, TypeError):  # no such methods, or no source files shipped
        return None
    return hashlib.sha256(source.encode()).hexdigest()


def _install_car_racing_draw(env: Any) -> bool:
    """The numpy road, where it is checked, and the kept font, where gymnasium's _render is the one followed."""
    if platform.machine() not in CHECKED_MACHINES:
        log.info("CarRacing keeps gymnasium's drawing: the numpy road is checked on x86-64 only")
        return False
    if source_hash(type(env), "_render_road", "_draw_colored_polygon") != KNOWN_ROAD_SOURCE:
        log.warning("CarRacing keeps gymnasium's drawing: this gymnasium draws its road with other code")
        return False
    env._render_road = _NumpyRoad(env)  # an instance attribute shadows the method
    if source_hash(type(env), "_render") == KNOWN_RENDER_SOURCE:
        env._render = _RenderWithOneFont(env)
    else:
        log.warning("CarRacing loads its font at every draw: this gymnasium draws its observation with other code")
    return True


#: Fast draws by the env class's "module.QualifiedName": each installs itself on the unwrapped env, and says
#: whether it did.
FAST_DRAWS: dict[str, Callable[[Any], bool]] = {
    "gymnasium.envs.box2d.car_racing.CarRacing": _install_car_racing_draw,
}


def install_fast_draw(env: gym.Env[Any, Any]) -> bool:
    """Install the registered fast draw of `env`'s innermost class; False (nothing changed) if there is none, or
    if it does not hold for this env's code or machine."""
    install = FAST_DRAWS.get(env_class_key(env))
    return install is not None and install(env.unwrapped)
