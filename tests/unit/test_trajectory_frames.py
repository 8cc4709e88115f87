"""Frame stacks on the wire as the frames they are made of (`unique_frames`, Trajectory.observation_index):
what is sent, that it rebuilds exactly, and that both readers (the learner's from_proto, replay's check)
refuse an index that does not fit its frames."""

from __future__ import annotations

import pytest
import torch

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.core.trajectory import check, from_proto, unique_frames
from tests.chunks import chunk_of

T, D, SIDE = 5, 4, 6


def frame(n: int, side: int = SIDE) -> torch.Tensor:
    """Frame number n: every pixel n, so a misplaced frame shows up as a wrong number."""
    return torch.full((side, side), n, dtype=torch.uint8)


def stacks_of(episodes: list[list[int]], side: int = SIDE) -> torch.Tensor:
    """[rows, D, SIDE, SIDE] stacks as a frame stacker makes them: an episode's first stack repeats its first
    frame, each later one drops the oldest frame and adds the next; `episodes` lists each one's frame numbers."""
    rows = []
    for numbers in episodes:
        window = [numbers[0]] * D
        for i, n in enumerate(numbers):
            if i:
                window = [*window[1:], n]
            rows.append(torch.stack([frame(k, side) for k in window]))
    return torch.stack(rows)


def test_an_episodes_steps_send_each_frame_once():
    stacks = stacks_of([list(range(10, 10 + T + 1))])
    frames, index = unique_frames(stacks)
    # The first stack's D frames (its first frame repeated), then one new frame per row.
    assert frames.shape == (T + D, SIDE, SIDE)
    assert torch.equal(frames[index], stacks)
    message = chunk_of(stacks).to_proto()
    assert list(message.observations.shape) == [T + D, SIDE, SIDE]
    assert list(message.observation_index.shape) == [T + 1, D]
    assert len(message.observations.data) == (T + D) * SIDE * SIDE  # against (T + 1) * D frames' bytes


def test_an_episode_that_starts_inside_the_chunk_sends_its_first_stack_whole():
    stacks = stacks_of([[1, 2, 3], [50, 51, 52]])  # rows 0-2 one episode, rows 3-5 the next
    frames, index = unique_frames(stacks)
    assert frames.shape[0] == (D + 2) + (D + 2)
    assert index[3].tolist() == list(range(D + 2, 2 * D + 2))
    assert torch.equal(frames[index], stacks)


@pytest.mark.parametrize("side", [SIDE, 8], ids=["36-byte-frames", "64-byte-frames"])  # compared by byte, by word
@pytest.mark.parametrize("episodes", [[list(range(T + 1))], [[1, 2], [3], [4, 5, 6]], [[7] * (T + 1)]])
def test_from_proto_rebuilds_the_stacks_exactly(episodes, side):
    original = chunk_of(stacks_of(episodes, side))
    message = original.to_proto()
    check(message)
    decoded = from_proto(message)
    assert decoded.observations.dtype == torch.uint8
    assert torch.equal(decoded.observations, original.observations)


def test_activations_and_single_frames_travel_as_they_are():
    for observations in (torch.zeros(T + 1, 8, dtype=torch.bfloat16), stacks_of([list(range(T + 1))])[:, :1]):
        message = chunk_of(observations).to_proto()
        assert not message.HasField("observation_index")
        assert torch.equal(from_proto(message).observations, observations)


def test_stacks_that_are_a_view_of_a_wider_buffer_travel_too():
    """Rows 8 bytes longer than their stacks: not contiguous, so not comparable as 8-byte words in place."""
    stacks = stacks_of([list(range(T + 1))], side=8)
    buffer = torch.zeros(T + 1, D * 64 + 8, dtype=torch.uint8)
    buffer[:, : D * 64] = stacks.reshape(T + 1, -1)
    view = buffer[:, : D * 64].unflatten(1, (D, 8, 8))
    assert not view.is_contiguous()
    message = chunk_of(view).to_proto()
    assert message.observations.shape[0] == T + D
    assert torch.equal(from_proto(message).observations, stacks)


def test_a_chunk_of_whole_stacks_without_an_index_still_reads():
    """What splitrl wrote before the index (a replay snapshot, an older inference)."""
    original = chunk_of(stacks_of([list(range(T + 1))]))
    message = original.to_proto()
    message.observations.CopyFrom(wire.encode(original.observations))
    message.ClearField("observation_index")
    check(message)
    assert torch.equal(from_proto(message).observations, original.observations)


@pytest.fixture(params=[from_proto, check], ids=["from_proto", "check"])
def read(request):
    return request.param


def sent() -> object:
    return chunk_of(stacks_of([list(range(T + 1))])).to_proto()


@pytest.mark.parametrize("bad", [-1, T + D])
def test_an_index_outside_the_frames_is_refused(bad, read):
    message = sent()
    index = wire.decode(message.observation_index)
    index[2, 1] = bad
    message.observation_index.CopyFrom(wire.encode(index))
    with pytest.raises(BadRequest, match=rf"observation_index holds .*; frames are 0\.\.{T + D - 1}"):
        read(message)


def test_an_index_of_the_wrong_shape_or_dtype_is_refused(read):
    message = sent()
    message.observation_index.CopyFrom(wire.encode(torch.zeros(T + 1, dtype=torch.int64)))
    with pytest.raises(BadRequest, match=r"observation_index has shape \[6\]; expected \[T\+1, D\]"):
        read(message)
    message.observation_index.CopyFrom(wire.encode(torch.zeros(T + 1, D, dtype=torch.uint8)))
    with pytest.raises(wire.WireError, match=r"observation_index: .*DTYPE_UINT8, expected DTYPE_INT64"):
        read(message)


def test_an_index_with_a_row_too_many_is_refused(read):
    message = sent()
    message.observation_index.CopyFrom(wire.encode(torch.zeros(T + 2, D, dtype=torch.int64)))
    with pytest.raises(BadRequest, match=rf"Trajectory\.observations has shape \[{T + 2}, {D}, {SIDE}, {SIDE}\]"):
        read(message)


def test_frames_that_are_not_uint8_images_are_refused(read):
    message = sent()
    message.observations.CopyFrom(wire.encode(torch.zeros(T + D, SIDE * SIDE, dtype=torch.uint8)))
    with pytest.raises(BadRequest, match=r"must be uint8 frames \[K, H, W\], K >= 1; got DTYPE_UINT8 \[9, 36\]"):
        read(message)


def test_a_small_index_cannot_ask_for_a_huge_rebuild(read):
    """An index is 8 bytes per stacked frame; rebuilt, each is a whole frame (here 512 x 512 bytes)."""
    message = sent()
    message.observations.CopyFrom(wire.encode(torch.zeros(1, 512, 512, dtype=torch.uint8)))
    message.observation_index.CopyFrom(wire.encode(torch.zeros(T + 1, 32, dtype=torch.int64)))
    read(message)  # 6 x 32 frames of 256 KiB: 48 MiB, under the 64 MiB one tensor may carry
    message.observation_index.CopyFrom(wire.encode(torch.zeros(T + 1, 64, dtype=torch.int64)))
    with pytest.raises(BadRequest, match=r"rebuilds 100663296 bytes; at most 67108864"):
        read(message)
