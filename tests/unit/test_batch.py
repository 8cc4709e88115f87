"""What an update trains on (learner.batch): a batch's rows leave out each chunk's bootstrap step, and a
minibatch's rows are copies in the update's memory layout."""

from __future__ import annotations

import pytest
import torch

from splitrl.learner.batch import Batch, Rows
from tests.chunks import training_batch

CHUNKS, HORIZON = 4, 8


def batch(inputs: torch.Tensor) -> Batch:
    return training_batch(inputs)


def frames() -> torch.Tensor:
    return torch.randint(0, 256, (CHUNKS, HORIZON + 1, 2, 36, 36), dtype=torch.uint8)


def test_rows_leave_out_each_chunks_bootstrap_step_and_take_every_field():
    data = batch(frames())
    rows = Rows.of(data, torch.zeros(CHUNKS, HORIZON), torch.ones(CHUNKS, HORIZON), torch.zeros(CHUNKS, HORIZON))
    assert len(rows) == CHUNKS * HORIZON
    assert rows.inputs.shape == (CHUNKS * HORIZON, 2, 36, 36)
    assert HORIZON not in rows.step_ids.tolist()  # chunk 0's step 8 is its bootstrap
    picked = rows.take(torch.tensor([0, 9]))
    assert picked.step_ids.tolist() == [0, 10] and len(picked) == 2
    assert torch.equal(picked.inputs[1], data.inputs[1, 1])


def test_rows_taken_by_position_or_mask_are_copies_in_their_own_layout():
    """The learner reorders an update's frames to channels-last once (Trainer.update); each minibatch's rows
    must come out channels-last too, or the encoder would reorder them again at every step."""
    data = batch(frames())
    rows = Rows.of(data, torch.randn(CHUNKS, HORIZON), torch.randn(CHUNKS, HORIZON), torch.zeros(CHUNKS, HORIZON))
    channels_last = Rows(**{**vars(rows), "inputs": rows.inputs.contiguous(memory_format=torch.channels_last)})
    order = torch.tensor([5, 0, 31, 5, 12])
    picked = channels_last.take(order)
    assert picked.inputs.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(picked.inputs, rows.inputs[order])
    assert all(torch.equal(getattr(picked, name), getattr(rows, name)[order]) for name in vars(rows))
    mask = torch.zeros(len(rows), dtype=torch.bool)
    mask[[3, 7]] = True
    assert torch.equal(rows.take(mask).step_ids, rows.step_ids[[3, 7]])
    with pytest.raises(ValueError, match=f"cover all {len(rows)} rows, got one of {len(rows) - 1}"):
        rows.take(mask[1:])
    picked.inputs.zero_()
    assert channels_last.inputs[order].any()  # a copy: training on it leaves the update's rows as they were
