"""splitrl.core.envs: frames are resized by area averaging in numpy, as torch's "area" interpolation does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splitrl.core.envs import make_env, resize_frame


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


def test_an_integer_factor_averages_blocks_exactly():
    frame = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    assert resize_frame(frame, 2).tolist() == [[25, 45], [105, 125]]


def test_a_carracing_frame_is_resized_on_the_way_out_of_the_env():
    env = make_env("CarRacing-v3", {"continuous": False}, 36, 1)
    try:
        frame, _ = env.reset(seed=0)
        assert frame.shape == (36, 36) and frame.dtype == np.uint8 and frame.std() > 0
    finally:
        env.close()
