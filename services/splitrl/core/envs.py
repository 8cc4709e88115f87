"""Building the environments a service steps: any gymnasium env with image observations.

Observations become uint8 grayscale [frame_size, frame_size]; an action
repeat (splitrl.core.action_repeat) sums rewards over repeated actions; envs with a fast draw
(splitrl.core.fast_draw) draw the same pixels faster; envs known to keep their last
drawing canvas alive between steps let it go (ReleaseCanvas). Importing this module registers
the fast pixel env as `splitrl/Catch-v0` and CarRacing with a throttle as `splitrl/CarRacingThrottle-v0`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Sequence
from functools import lru_cache, partial
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from splitrl.core import car_actions  # registers splitrl/CarRacingThrottle-v0 on import
from splitrl.core.action_repeat import ActionRepeat, env_class_key, registered_class_key
from splitrl.core.fast_draw import install_fast_draw
from splitrl.core.memory import reuse_freed_blocks
from splitrl.core.spec import ActionSpec

log = logging.getLogger(__name__)

CATCH_ID = "splitrl/Catch-v0"
if CATCH_ID not in gym.registry:
    gym.register(id=CATCH_ID, entry_point="splitrl.core.pixel_env:CatchEnv")

#: Env id namespaces whose envs register only when a package is imported (gymnasium >= 1.0 does not import
#: them itself): namespace -> (module to import, what to pip install).
REGISTERING_PACKAGES: dict[str, tuple[str, str]] = {
    "ALE": ("ale_py", "ale-py"),
    "MiniGrid": ("minigrid", "minigrid"),
    "BabyAI": ("minigrid", "minigrid"),
    "MetaWorld": ("metaworld", "metaworld"),
    "craftax": ("craftax", "craftax"),
}


def ensure_registered(env_id: str) -> None:
    """Import the package that registers `env_id`'s namespace, so ids work as users type them (ALE/Pong-v5).

    ValueError names the package to install when it is missing. "module:Id" ids are left to gymnasium.
    """
    if ":" in env_id or env_id in gym.registry or "/" not in env_id:
        return
    namespace = env_id.split("/", 1)[0]
    if namespace not in REGISTERING_PACKAGES:
        return
    module, requirement = REGISTERING_PACKAGES[namespace]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"env {env_id!r} is registered by the {requirement!r} package, which is not installed: "
            f"pip install {requirement}"
        ) from None


#: Envs that keep the canvas their last observation was drawn on, though every draw makes a new one and
#: nothing reads the old one: env class "module.QualifiedName" -> the attribute holding it. CarRacing draws
#: on a 1000 x 800 RGBA pygame surface (3.2 MB per env, 26 MB of an 8-env edge) to scale it to 96 x 96.
RELEASABLE_CANVASES: dict[str, str] = {"gymnasium.envs.box2d.car_racing.CarRacing": "surf"}


class ReleaseCanvas(gym.Wrapper[Any, Any, Any, Any]):
    """Drops the env's drawing canvas after each reset and step, so it is not resident between steps.

    Observations, rewards and ends are the env's own (the canvas is made anew by each draw before it is
    read; tests/unit/test_envs.py compares them step by step). Only for classes in RELEASABLE_CANVASES.
    The process's heap is set to keep a freed canvas for the next draw (core.memory.reuse_freed_blocks):
    otherwise glibc trims it at once and every draw faults its pages back in, which doubled a CarRacing
    agent step's time.
    """

    def __init__(self, env: gym.Env[Any, Any], attribute: str, reuse_heap: bool = True) -> None:
        super().__init__(env)
        self.attribute = attribute
        if reuse_heap:
            reuse_freed_blocks()

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        result = self.env.reset(**kwargs)
        setattr(self.env.unwrapped, self.attribute, None)
        return result

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        setattr(self.env.unwrapped, self.attribute, None)
        return result


#: pygame modules that the envs in PYGAME_EXTRAS_UNUSED_BY never use: sound (the mixer links SDL_mixer with
#: FluidSynth, FLAC, Vorbis, Opus and mpg123) and image files other than BMP (SDL_image with libtiff, libpng,
#: libjpeg and libwebp). pygame is built to run without them: its __init__ catches the ImportError, puts a
#: MissingModule in the mixer's place (it raises NotImplementedError naming the module when used; sndarray goes
#: with it) and leaves pygame.image to BMP files. Not loading them keeps a few MiB of resident memory out of an
#: environment process, on an edge where every MiB counts.
UNUSED_PYGAME_MODULES: tuple[str, ...] = ("pygame.mixer", "pygame.mixer_music", "pygame.imageext")
#: Env classes ("module.QualifiedName", env_class_key) checked to draw without UNUSED_PYGAME_MODULES: CarRacing
#: uses surfaces, gfxdraw, transform, surfarray and a font (its score), no sound and no image files. Other envs
#: keep all of pygame.
PYGAME_EXTRAS_UNUSED_BY: frozenset[str] = frozenset(
    {
        "gymnasium.envs.box2d.car_racing.CarRacing",
        f"{car_actions.CarRacingThrottle.__module__}.{car_actions.CarRacingThrottle.__qualname__}",
    }
)


class _RefuseModules(importlib.abc.MetaPathFinder):
    """An import hook that refuses the named modules as not found, with a message that says why."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """Refuse a named module; None (ask the next finder) for any other."""
        if fullname in self.names:
            message = f"{fullname} is not loaded in splitrl's env-stepping processes (envs.UNUSED_PYGAME_MODULES)"
            raise ModuleNotFoundError(message, name=fullname)
        return None


def skip_unused_pygame_modules(env_id: str) -> bool:
    """Refuse UNUSED_PYGAME_MODULES in this whole process from now on if `env_id`'s env class is in
    PYGAME_EXTRAS_UNUSED_BY. For processes that only step `env_id` envs (the environment service and its env
    workers), called before the first one is made.

    True when the modules are refused (now or by an earlier call). False, and nothing done, for any other env,
    or where pygame was already imported (its modules are loaded: refusing them now would change nothing; a
    warning says so).
    """
    if any(isinstance(finder, _RefuseModules) for finder in sys.meta_path):
        return True
    ensure_registered(env_id)
    if registered_class_key(env_id) not in PYGAME_EXTRAS_UNUSED_BY:
        return False
    if "pygame" in sys.modules:
        log.warning("pygame was imported before the envs were made: its sound and image modules stay loaded")
        return False
    sys.meta_path.insert(0, _RefuseModules(UNUSED_PYGAME_MODULES))
    return True


def releasable_canvas_of(env: gym.Env[Any, Any]) -> str | None:
    """The attribute holding `env`'s innermost class's discardable canvas, or None."""
    return RELEASABLE_CANVASES.get(env_class_key(env))


@lru_cache(maxsize=16)
def _area_weights(length: int, size: int) -> np.ndarray:
    """[size, length] averaging matrix: output i is the mean of inputs floor(i L / S) .. ceil((i + 1) L / S) - 1,
    the bins of torch's adaptive average pooling (interpolate mode="area")."""
    weights = np.zeros((size, length))
    for i in range(size):
        start, end = (i * length) // size, -(-(i + 1) * length // size)
        weights[i, start:end] = 1.0 / (end - start)
    return weights


#: The luma weights of red, green and blue: gymnasium's GrayscaleObservation's (scikit-image's rounding of BT.709's).
LUMA_WEIGHTS = (0.2125, 0.7154, 0.0721)


def gray_frame(frame: np.ndarray) -> np.ndarray:
    """uint8 RGB [H, W, 3] -> uint8 [H, W]: gymnasium's GrayscaleObservation, pixel for pixel; a new array.

    gymnasium multiplies the frame by LUMA_WEIGHTS in float64, sums the channel axis and truncates. Summing an
    axis of 3 adds red, green and blue in that order, as here, where the planes are added instead (several
    times faster). Every one of
    the 2**24 colours comes out the same (tests/unit/test_envs.py)."""
    planes = frame.astype(np.float64)
    red, green, blue = (planes[..., channel] * weight for channel, weight in enumerate(LUMA_WEIGHTS))
    return (red + green + blue).astype(np.uint8)


def resize_frame(frame: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W] -> uint8 [size, size] by area averaging (numpy: no OpenCV, and no torch on the edge); always
    a new array."""
    height, width = frame.shape
    if height == width == size:  # the averaging would be the identity: two float64 matmuls for nothing
        return frame.astype(np.uint8, copy=True)
    resized = _area_weights(height, size) @ frame.astype(np.float64) @ _area_weights(width, size).T
    return np.clip(np.round(resized), 0, 255).astype(np.uint8)


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    frame_size: int,
    action_repeat: int,
    skip_render: bool = True,
    release_canvas: bool = True,
    fast_draw: bool = True,
    reuse_heap: bool = True,
) -> gym.Env[Any, Any]:
    """One env whose observations are uint8 grayscale [frame_size, frame_size]; ValueError if it has no images.

    `skip_render=False` draws every repeated frame, `release_canvas=False` keeps the env's drawing canvas,
    `fast_draw=False` keeps the env's own drawing code and `reuse_heap=False` leaves glibc's heap thresholds
    as they are (only to time or check the fast repeat, the release, the fast draw or the heap setting against
    the plain env: benchmarks/action_repeat.py).
    """
    ensure_registered(env_id)
    env = gym.make(env_id, **env_kwargs)
    if fast_draw:
        install_fast_draw(env)
    if action_repeat > 1:  # innermost: frames the repeat discards are neither drawn (if it can) nor transformed
        env = ActionRepeat(env, action_repeat, skip_render)
    canvas = releasable_canvas_of(env) if release_canvas else None
    if canvas is not None:  # above the repeat, whose last frame may be drawn after its inner steps
        env = ReleaseCanvas(env, canvas, reuse_heap)
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)):
        env.close()
        raise ValueError(f"env {env_id!r} has observation space {space}; splitrl needs uint8 images (H, W[, C])")
    if len(space.shape) == 3:
        if space.shape[2] == 3:
            gray_space = gym.spaces.Box(0, 255, space.shape[:2], np.uint8)
            env = gym.wrappers.TransformObservation(env, gray_frame, gray_space)
        elif space.shape[2] == 1:
            env = gym.wrappers.ReshapeObservation(env, space.shape[:2])
        else:
            env.close()
            raise ValueError(f"env {env_id!r} has {space.shape[2]} channels; expected 1 (gray) or 3 (RGB)")
    if env.observation_space.shape != (frame_size, frame_size):
        env = gym.wrappers.TransformObservation(
            env, partial(resize_frame, size=frame_size), gym.spaces.Box(0, 255, (frame_size, frame_size), np.uint8)
        )
    return env


def make_vector_env(
    env_id: str, env_kwargs: dict[str, Any], num_envs: int, frame_size: int, action_repeat: int
) -> gym.vector.VectorEnv:
    """`num_envs` envs stepped together; an ended episode resets in the same step (its first frame comes back)."""
    vector = SyncVectorEnv(
        [lambda: make_env(env_id, env_kwargs, frame_size, action_repeat) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(vector)


def action_spec_of(env_id: str, env_kwargs: dict[str, Any]) -> ActionSpec:
    """The ActionSpec of an env id, read from a throwaway instance."""
    ensure_registered(env_id)
    env = gym.make(env_id, **env_kwargs)
    try:
        return action_spec_from_space(env.action_space)
    finally:
        env.close()


def check_env(env_id: str, env_kwargs: dict[str, Any]) -> ActionSpec:
    """The env's ActionSpec, from one instance made here: what a run's services would fail on at start, found
    before any starts. ValueError with gymnasium's own message for an id it does not know (with the closest
    registered id, if one is close), a package the env needs, kwargs the env refuses or an action space splitrl
    does not support."""
    try:
        return action_spec_of(env_id, env_kwargs)
    except ValueError:  # ours, already naming the env and the fix
        raise
    except gym.error.UnregisteredEnv as error:
        close = difflib.get_close_matches(env_id, gym.registry.keys(), n=1, cutoff=0.6)
        hint = f" The closest registered id is {close[0]!r}." if close else ""
        raise ValueError(f"env {env_id!r} is not registered with gymnasium: {error}{hint}") from None
    except Exception as error:  # e.g. gymnasium's DependencyNotInstalled, the env's TypeError for a bad kwarg
        raise ValueError(f"env {env_id!r} cannot be made: {error}") from None


def action_spec_from_space(space: gym.Space[Any]) -> ActionSpec:
    if isinstance(space, gym.spaces.Discrete):
        return ActionSpec("discrete", int(space.n))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return ActionSpec(
            "continuous", int(space.shape[0]), tuple(map(float, space.low)), tuple(map(float, space.high))
        )
    raise ValueError(f"unsupported action space {space}; splitrl supports Discrete and 1-D Box")
