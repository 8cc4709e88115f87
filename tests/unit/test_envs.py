"""splitrl.core.envs: frames are resized by area averaging in numpy, as torch's "area" interpolation does."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from splitrl.core.envs import check_env, gray_frame, make_env, resize_frame


def torch_area(frame: np.ndarray, size: int) -> np.ndarray:
    tensor = torch.from_numpy(frame).float()[None, None]
    resized = torch.nn.functional.interpolate(tensor, size=(size, size), mode="area")
    return resized[0, 0].round().clamp(0, 255).to(torch.uint8).numpy()


@pytest.mark.parametrize(("height", "width", "size"), [(96, 96, 36), (96, 96, 84), (96, 96, 48), (210, 160, 84)])
def test_resize_is_torchs_area_interpolation_up_to_rounding(height, width, size):
    """Same bins as adaptive average pooling; float64 sums may round a .5 tie the other way (off by 1)."""
    frames = np.random.default_rng(0).integers(0, 256, (20, height, width), dtype=np.uint8)
    ours = np.stack([resize_frame(frame, size) for frame in frames]).astype(int)
    theirs = np.stack([torch_area(frame, size) for frame in frames]).astype(int)
    assert ours.shape == (20, size, size)
    assert np.abs(ours - theirs).max() <= 1
    assert (ours != theirs).mean() < 0.01


def test_a_frame_of_the_size_already_comes_back_as_it_is_in_a_new_array():
    frame = np.random.default_rng(0).integers(0, 256, (36, 36), dtype=np.uint8)
    resized = resize_frame(frame, 36)
    assert np.array_equal(resized, frame) and not np.shares_memory(resized, frame)
    assert np.array_equal(resized, torch_area(frame, 36))


def test_an_integer_factor_averages_blocks_exactly():
    frame = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    assert resize_frame(frame, 2).tolist() == [[25, 45], [105, 125]]


class _RGBFrames(gym.Env[np.ndarray, int]):
    """Only an observation space: what gymnasium's GrayscaleObservation wraps."""

    observation_space = gym.spaces.Box(0, 255, (256, 256, 3), np.uint8)
    action_space = gym.spaces.Discrete(1)


def test_gray_frames_are_gymnasiums_for_every_colour():
    gymnasiums = gym.wrappers.GrayscaleObservation(_RGBFrames(), keep_dim=False)
    frame = np.empty((256, 256, 3), np.uint8)
    frame[..., 1], frame[..., 2] = np.mgrid[0:256, 0:256]
    for red in range(256):
        frame[..., 0] = red
        gray = gray_frame(frame)
        assert gray.dtype == np.uint8
        np.testing.assert_array_equal(gray, gymnasiums.observation(frame), err_msg=f"red {red}")


def test_a_carracing_frame_is_resized_on_the_way_out_of_the_env():
    env = make_env("CarRacing-v3", {"continuous": False}, 36, 1)
    try:
        frame, _ = env.reset(seed=0)
        assert frame.shape == (36, 36) and frame.dtype == np.uint8 and frame.std() > 0
    finally:
        env.close()


@pytest.mark.parametrize("action_repeat", [1, 4])
def test_releasing_carracings_canvas_changes_no_step(action_repeat):
    """ReleaseCanvas drops the 1000 x 800 surface CarRacing keeps after drawing; frames, rewards and ends
    stay those of the env that keeps it, over an episode's first steps and a reset."""
    released = make_env("CarRacing-v3", {"continuous": False}, 96, action_repeat)
    kept = make_env("CarRacing-v3", {"continuous": False}, 96, action_repeat, release_canvas=False)
    actions = np.random.default_rng(action_repeat).integers(0, 5, 60)
    try:
        for seed in (0, 1):
            assert np.array_equal(released.reset(seed=seed)[0], kept.reset(seed=seed)[0])
            for action in actions:
                ours, theirs = released.step(action), kept.step(action)
                assert np.array_equal(ours[0], theirs[0]) and ours[1:4] == theirs[1:4]
                assert released.unwrapped.surf is None and kept.unwrapped.surf is not None
    finally:
        released.close()
        kept.close()


def test_envs_without_a_known_canvas_are_not_wrapped():
    env = make_env("splitrl/Catch-v0", {}, 36, 1)
    try:
        assert "ReleaseCanvas" not in str(env)
    finally:
        env.close()


#: Run in a fresh interpreter (pygame's modules load once per process): CarRacing's frames, rewards and ends
#: over two seeds' first steps, hashed, and what became of pygame's optional modules.
_PYGAME_PROBE = """
import hashlib, json, sys
import numpy as np
from splitrl.core.envs import make_env, skip_unused_pygame_modules
other = skip_unused_pygame_modules("splitrl/Catch-v0")  # not a listed env: nothing refused
skipped = skip_unused_pygame_modules("CarRacing-v3") if sys.argv[1] == "skip" else None
env = make_env("CarRacing-v3", {"continuous": False}, 96, 4)
digest = hashlib.sha256()
for seed in (0, 1):
    digest.update(env.reset(seed=seed)[0].tobytes())
    for action in np.random.default_rng(seed).integers(0, 5, 40):
        frame, reward, terminated, truncated, _ = env.step(action)
        digest.update(frame.tobytes() + repr((float(reward), terminated, truncated)).encode())
env.close()
import pygame
try:
    import pygame.mixer
    refused = None
except ImportError as error:
    refused = str(error)
print(json.dumps({
    "other": other, "skipped": skipped, "again": skip_unused_pygame_modules("CarRacing-v3"),
    "frames": digest.hexdigest(), "refused": refused,
    "mixer": type(pygame.mixer).__name__, "imageext": "pygame.imageext" in sys.modules,
    "font": type(pygame.font).__name__,
}))
"""


def _probe_pygame(argument: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", _PYGAME_PROBE, argument], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_skipping_pygames_sound_and_image_modules_changes_no_carracing_step():
    """An env-stepping process without pygame's mixer and image-file modules draws the same frames and gets
    the same rewards and ends; the modules are pygame's MissingModule stand-ins, and importing one says why."""
    skipped, plain = _probe_pygame("skip"), _probe_pygame("plain")
    assert skipped["frames"] == plain["frames"]
    assert skipped["other"] is False and skipped["skipped"] is True and skipped["again"] is True
    assert skipped["mixer"] == "MissingModule" and skipped["imageext"] is False and skipped["font"] == "module"
    assert "UNUSED_PYGAME_MODULES" in str(skipped["refused"])
    assert plain["other"] is False and plain["mixer"] == "module" and plain["refused"] is None
    assert plain["again"] is False  # pygame was already loaded, with its modules: nothing to skip


@pytest.mark.parametrize(
    ("env_id", "env_kwargs", "fragments"),
    [
        ("Catch-v0", {}, ["Environment `Catch` doesn't exist.", "closest registered id is 'splitrl/Catch-v0'"]),
        ("CarRacing-v9", {}, ["version `v9`", "closest registered id is 'CarRacing-v3'"]),
        ("splitrl/Catch-v0", {"gird": 3}, ["cannot be made", "unexpected keyword argument 'gird'"]),
        ("Xyzzy-v0", {}, ["Environment `Xyzzy` doesn't exist."]),
    ],
)
def test_check_env_refuses_what_no_service_could_start_with_gymnasiums_message(env_id, env_kwargs, fragments):
    with pytest.raises(ValueError) as raised:
        check_env(env_id, env_kwargs)
    message = str(raised.value)
    assert message.startswith(f"env {env_id!r} ")
    assert all(fragment in message for fragment in fragments), message
    assert env_id != "Xyzzy-v0" or "closest" not in message  # no close match invented


def test_check_env_gives_the_action_space_of_a_good_env():
    assert check_env("splitrl/Catch-v0", {"continuous": True}).kind == "continuous"
