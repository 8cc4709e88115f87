"""The edge's observation store: bounded by step id, frames compressed once each, given back exactly."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from splitrl.core.framestack import FrameRow, FrameStacker
from splitrl.edge_encoder.observation_store import ObservationStore


def stacks(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 4, 36, 36), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def as_rows(stacked: torch.Tensor) -> list[FrameRow]:
    """Stacks [n, depth, H, W] as the store takes them: rows of frames (here none shared)."""
    return [tuple(stack.unbind()) for stack in stacked]


def road_frames(envs: int, step: int) -> torch.Tensor:
    """uint8 [envs, 96, 96] frames with CarRacing's structure: flat grass, a road band that moves per step and
    env, a little texture (what the store compresses in a real run)."""
    frames = torch.full((envs, 96, 96), 102, dtype=torch.uint8)
    for env in range(envs):
        left = (7 * step + 13 * env) % 60
        frames[env, :, left : left + 30] = 107 + env
        frames[env, ::16, :] += 3
    return frames


def test_store_keeps_the_newest_ids_and_reports_the_rest_missing():
    store = ObservationStore(capacity=3)
    data = stacks(5)
    store.put([10, 11, 12, 13, 14], as_rows(data))
    assert len(store) == 3
    found, held = store.get([10, 12, 14, 99])
    assert found == [1, 2]
    assert held is not None and torch.equal(held, data[[2, 4]])
    assert store.get([10, 11]) == ([], None)


def test_store_gives_back_the_stackers_stacks_and_holds_each_frame_once():
    """Across episode restarts and eviction, every held step comes back as the stack the stacker returned for
    it; consecutive steps share frames, so the store holds one frame per step, not `depth`."""
    envs, steps, capacity = 3, 40, 60
    stacker, store = FrameStacker(envs, 4, 36, 36), ObservationStore(capacity)
    generator = torch.Generator().manual_seed(0)
    returned = {}
    for step in range(steps):
        frames = torch.randint(0, 256, (envs, 36, 36), dtype=torch.uint8, generator=generator)
        starts = torch.rand(envs, generator=generator) < 0.1 if step else torch.ones(envs, dtype=torch.bool)
        stacked = stacker.push(frames, starts)
        ids = [envs * step + env for env in range(envs)]
        store.put(ids, stacker.rows)
        returned.update(zip(ids, stacked, strict=True))
    asked = list(returned)
    found, held = store.get(asked)
    assert found == list(range(envs * steps - capacity, envs * steps)) and held is not None
    assert all(torch.equal(stack, returned[asked[i]]) for i, stack in zip(found, held, strict=True))
    # Noise does not compress: each frame costs its 1,296 B and zstd's few bytes of framing, once per step
    # held and for the up to 3 steps before them that the oldest held stacks share (not 4 per step held).
    assert store.frame_bytes() <= (capacity + 3 * envs) * (36 * 36 + 16)
    # What the store remembers of frames a later row may share is what the stacker still holds (and its blank).
    assert len(store._packed) <= envs * 4 + 1


def test_driving_frames_are_held_compressed_and_come_back_exactly():
    envs, steps = 4, 50
    stacker, store = FrameStacker(envs, 4, 96, 96), ObservationStore(envs * steps)
    returned = {}
    for step in range(steps):
        stacked = stacker.push(road_frames(envs, step), torch.tensor([step == 0] * envs))
        ids = [envs * step + env for env in range(envs)]
        store.put(ids, stacker.rows)
        returned.update(zip(ids, stacked, strict=True))
    found, held = store.get(list(returned))
    assert found == list(range(envs * steps)) and held is not None
    assert torch.equal(held, torch.stack(list(returned.values())))
    assert store.frame_bytes() < envs * steps * 96 * 96 / 8  # one frame per step, at over 8x


def test_the_store_keeps_no_frame_alive_and_packs_a_new_frame_at_a_reused_address():
    """Frames leave memory once the stacker drops them (the store holds their bytes only); a new frame that
    CPython places where a dead one was is packed anew, not mistaken for it."""
    stacker, store = FrameStacker(1, 2, 8, 8), ObservationStore(100)
    first = torch.full((1, 8, 8), 7, dtype=torch.uint8)
    stacker.push(first, torch.tensor([True]))
    store.put([0], stacker.rows)
    kept = weakref.ref(stacker.rows[0][-1])
    for step in range(1, 40):
        stacker.push(torch.full((1, 8, 8), step + 7, dtype=torch.uint8), torch.tensor([False]))
        store.put([step], stacker.rows)
    gc.collect()
    assert kept() is None
    found, held = store.get(list(range(40)))
    assert found == list(range(40)) and held is not None
    assert held[:, -1].flatten(1).tolist() == [[step + 7] * 64 for step in range(40)]
    assert held[1:, 0].flatten(1).tolist() == [[step + 7] * 64 for step in range(39)]


def test_a_new_frame_at_a_dead_frames_address_is_packed_anew():
    """CPython hands a freed tensor's address to the next tensor made; the store must not take the new frame
    for the dead one whose bytes it still holds."""
    store = ObservationStore(10)
    dead = torch.full((8, 8), 1, dtype=torch.uint8)
    dead_id = id(dead)
    store.put([0], [(dead,)])
    del dead
    candidates = []
    for value in range(2, 200):
        candidates.append(torch.full((8, 8), value, dtype=torch.uint8))
        if id(candidates[-1]) == dead_id:
            break
    else:
        pytest.skip("no new tensor took the dead frame's address")
    store.put([1], [(candidates[-1],)])
    found, held = store.get([0, 1])
    assert found == [0, 1] and held is not None
    assert held[:, 0, 0, 0].tolist() == [1, len(candidates) + 1]


def test_a_bad_put_stores_none_of_its_rows():
    store = ObservationStore(1)
    good = torch.zeros((8, 8), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"rows of 1 frames, got \[1, 2\]"):
        store.put([0, 1], [(good,), (good, good)])
    with pytest.raises(ValueError, match="float32"):
        store.put([0, 1, 2], [(good,), (good,), (good.float(),)])
    with pytest.raises(ValueError, match="2 step ids for 1 rows"):
        store.put([0, 1], [(good,)])
    assert len(store) == 0 and store.get([0, 1, 2]) == ([], None)
    store.put([5], [(good,)])
    assert len(store) == 1


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (torch.zeros((8, 9), dtype=torch.uint8), r"uint8 \[8, 8\] frames, got torch.uint8 \[8, 9\]"),
        (torch.zeros((8, 8), dtype=torch.float32), r"uint8 \[8, 8\] frames, got torch.float32 \[8, 8\]"),
    ],
)
def test_a_frame_of_another_shape_or_dtype_is_refused_with_both(frame: torch.Tensor, message: str):
    store = ObservationStore(10)
    store.put([0], [(torch.zeros((8, 8), dtype=torch.uint8),)])
    with pytest.raises(ValueError, match=message):
        store.put([1], [(frame,)])
    found, held = store.get([0, 1])
    assert found == [0] and held is not None and held.shape == (1, 1, 8, 8)


def test_store_rejects_a_bad_capacity_with_the_value():
    with pytest.raises(ValueError, match="-1"):
        ObservationStore(-1)
