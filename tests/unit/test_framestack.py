"""splitrl.core.framestack.FrameStacker: order, episode restarts, and input checks."""

from __future__ import annotations

import pytest
import torch

from splitrl.core.framestack import FrameStacker, stack_rows

N, DEPTH, H, W = 3, 4, 2, 5


def frames(*values: int) -> torch.Tensor:
    """uint8 [N, H, W] frames, env i filled with values[i]."""
    return torch.tensor(values, dtype=torch.uint8)[:, None, None].expand(-1, H, W).clone()


def flags(*values: bool) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


def stack_values(stacks: torch.Tensor) -> list[list[int]]:
    """The single value each frame in each row is filled with (asserting the frames are uniform)."""
    assert bool((stacks == stacks[..., :1, :1]).all())
    return stacks[..., 0, 0].tolist()


def test_stacks_have_shape_n_depth_h_w_and_uint8():
    stacks = FrameStacker(N, DEPTH, H, W).push(frames(1, 2, 3), flags(True, True, True))
    assert stacks.shape == (N, DEPTH, H, W)
    assert stacks.dtype == torch.uint8


def test_newest_frame_is_last():
    stacker = FrameStacker(N, DEPTH, H, W)
    stacker.push(frames(1, 11, 21), flags(True, True, True))
    for step in range(2, 6):
        stacks = stacker.push(frames(step, 10 + step, 20 + step), flags(False, False, False))
    assert stack_values(stacks) == [[2, 3, 4, 5], [12, 13, 14, 15], [22, 23, 24, 25]]


def test_first_push_with_episode_start_fills_the_stack_with_the_first_frame():
    stacks = FrameStacker(N, DEPTH, H, W).push(frames(7, 8, 9), flags(True, True, True))
    assert stack_values(stacks) == [[7] * DEPTH, [8] * DEPTH, [9] * DEPTH]


def test_episode_start_refills_only_its_rows():
    stacker = FrameStacker(N, DEPTH, H, W)
    stacker.push(frames(1, 1, 1), flags(True, True, True))
    stacker.push(frames(2, 2, 2), flags(False, False, False))
    stacks = stacker.push(frames(3, 50, 4), flags(False, True, False))
    assert stack_values(stacks) == [[1, 1, 2, 3], [50, 50, 50, 50], [1, 1, 2, 4]]

    stacks = stacker.push(frames(5, 51, 6), flags(False, False, False))
    assert stack_values(stacks) == [[1, 2, 3, 5], [50, 50, 50, 51], [1, 2, 4, 6]]


def test_without_episode_start_stacks_begin_with_zeros():
    stacks = FrameStacker(N, DEPTH, H, W).push(frames(1, 2, 3), flags(False, False, False))
    assert stack_values(stacks) == [[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3]]


def test_returned_stacks_are_not_changed_by_a_later_push():
    stacker = FrameStacker(N, DEPTH, H, W)
    first = stacker.push(frames(1, 2, 3), flags(True, True, True)).clone()
    returned = stacker.push(frames(4, 5, 6), flags(False, False, False))
    snapshot = returned.clone()
    stacker.push(frames(7, 8, 9), flags(True, False, False))
    assert torch.equal(returned, snapshot)
    assert not torch.equal(first, snapshot)


def test_frames_changed_after_the_push_change_no_stack():
    stacker = FrameStacker(N, DEPTH, H, W)
    pushed = frames(1, 2, 3)
    returned = stacker.push(pushed, flags(True, True, True))
    rows = list(stacker.rows)
    pushed.fill_(99)
    assert stack_values(returned) == [[1] * DEPTH, [2] * DEPTH, [3] * DEPTH]
    assert torch.equal(stack_rows(rows), returned)


def test_every_frame_is_held_once_and_shared_by_the_stacks_it_belongs_to():
    stacker = FrameStacker(N, DEPTH, H, W)
    stacker.push(frames(1, 2, 3), flags(True, True, True))
    before = list(stacker.rows)
    stacker.push(frames(4, 5, 6), flags(False, True, False))
    assert all(new[:-1] == old[1:] for new, old in zip(stacker.rows[::2], before[::2], strict=True))  # same objects
    assert len({id(frame) for frame in stacker.rows[1]}) == 1  # a restart repeats one frame, not DEPTH copies


def test_frames_of_another_dtype_or_a_misshapen_episode_start_are_rejected():
    stacker = FrameStacker(N, DEPTH, H, W)
    with pytest.raises(ValueError, match=r"must be uint8, got torch\.float32"):
        stacker.push(frames(1, 2, 3).float(), flags(True, True, True))
    with pytest.raises(ValueError, match=r"episode_start must be bool \[3\], got shape \(3, 1\)"):
        stacker.push(frames(1, 2, 3), flags(True, True, True)[:, None])


@pytest.mark.parametrize(
    "shape",
    [(N + 1, H, W), (N, H + 1, W), (N, H, W + 1), (N, DEPTH, H, W), (H, W)],
    ids=["envs", "height", "width", "stacked", "single"],
)
def test_frames_of_the_wrong_shape_are_rejected(shape):
    stacker = FrameStacker(N, DEPTH, H, W)
    with pytest.raises(ValueError, match="do not fit stacks"):
        stacker.push(torch.zeros(shape, dtype=torch.uint8), flags(True, True, True))


@pytest.mark.parametrize("sizes", [(0, 4, 2, 2), (1, 0, 2, 2), (1, 4, 0, 2), (1, 4, 2, -1)])
def test_non_positive_sizes_are_rejected(sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        FrameStacker(*sizes)
