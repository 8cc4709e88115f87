"""Drawing an env's observation faster, pixel for pixel the same: CarRacing's road placed by numpy.

gymnasium's CarRacing draws every observation on a 1000 x 800 canvas and scales it
down to 96 x 96. About half of its ~7 ms per drawn frame on the 2-core dev machine
is Python placing ~700 polygons (400 grass patches, ~300 road tiles) one vertex at
a time through pygame.math.Vector2, to find the ~60 that are on screen. `_NumpyRoad`
places them all with a few array operations per frame and hands pygame the same
coordinates (same float64 arithmetic, in the same order), in the same drawing order
and colours. So the canvas, the observation and `render()` are bit-identical to
gymnasium's (tests/unit/test_fast_draw.py compares them step by step, driving on and
off the track, with and without domain randomisation). Everything else (the car,
the indicators, the reward text, the scaling) is still gymnasium's own code.

A *fast draw* is registered per env class, like the render skippers of
splitrl.core.action_repeat, and installed by make_env (`fast_draw=False` keeps the
env's own drawing, to time or check it: benchmarks/action_repeat.py). It installs
itself only where its equivalence was checked: gymnasium's road-drawing source as
tested here (a hash of it), and an x86-64 machine, where pygame's rotation is
compiled without fused multiply-adds (other compilers may fuse `c * x - s * y`,
which rounds once instead of twice). Elsewhere the env keeps its own drawing.
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


def road_source_hash(env_class: Any) -> str | None:
    """sha256 of `env_class`'s road-drawing source (the two methods _NumpyRoad stands in for), or None."""
    try:
        source = inspect.getsource(env_class._render_road) + inspect.getsource(env_class._draw_colored_polygon)
    except (AttributeError, OSError, TypeError):  # no such methods, or no source files shipped
        return None
    return hashlib.sha256(source.encode()).hexdigest()


def _install_numpy_road(env: Any) -> bool:
    if platform.machine() not in CHECKED_MACHINES:
        log.info("CarRacing keeps gymnasium's drawing: the numpy road is checked on x86-64 only")
        return False
    if road_source_hash(type(env)) != KNOWN_ROAD_SOURCE:
        log.warning("CarRacing keeps gymnasium's drawing: this gymnasium draws its road with other code")
        return False
    env._render_road = _NumpyRoad(env)  # an instance attribute shadows the method
    return True


#: Fast draws by the env class's "module.QualifiedName": each installs itself on the unwrapped env, and says
#: whether it did.
FAST_DRAWS: dict[str, Callable[[Any], bool]] = {
    "gymnasium.envs.box2d.car_racing.CarRacing": _install_numpy_road,
}


def install_fast_draw(env: gym.Env[Any, Any]) -> bool:
    """Install the registered fast draw of `env`'s innermost class; False (nothing changed) if there is none, or
    if it does not hold for this env's code or machine."""
    install = FAST_DRAWS.get(env_class_key(env))
    return install is not None and install(env.unwrapped)
