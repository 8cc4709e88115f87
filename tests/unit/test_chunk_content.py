"""ChunkLimits: what a chunk of one run may hold (core.chunk_content), for continuous action spaces and the
limits replay applies when it knows nothing of the run."""

from __future__ import annotations

import pytest
import torch

from splitrl.core.chunk_content import ChunkLimits
from splitrl.core.rpc import BadRequest
from splitrl.core.spec import ActionSpec
from tests.chunks import chunk_of

CAR = ActionSpec("continuous", 3, (-1.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def chunk(actions: torch.Tensor, **fields):
    tensors = chunk_of(torch.zeros(actions.shape[0] + 1, 4, 8, 8, dtype=torch.uint8))
    tensors.actions = actions
    for name, value in fields.items():
        setattr(tensors, name, value)
    return tensors.to_proto()


def test_continuous_actions_are_raw_samples_that_may_leave_the_box_by_little_never_by_orders_of_magnitude():
    limits = ChunkLimits(CAR, (4, 8, 8))
    limits.check(chunk(torch.tensor([[-1.3, 0.5, 1.2], [0.0, -0.4, 0.0]])))  # a Gaussian's samples past the bounds
    limits.check(chunk(torch.zeros(2, 3), behaviour_log_probs=torch.tensor([4.0, -2.0])))  # densities can exceed 1
    for actions, reason in (
        (torch.tensor([[0.0, 1e6, 0.0]]), "far outside the action space"),
        (torch.tensor([[0.0, float("nan"), 0.0]]), "NaN or Inf"),
        (torch.zeros(1, 2), "3 continuous dimensions"),
        (torch.zeros(1, dtype=torch.int64), "integers"),
    ):
        with pytest.raises(BadRequest, match=reason):
            limits.check(chunk(actions))


def test_without_a_spec_replay_still_refuses_what_no_run_makes():
    limits = ChunkLimits()
    limits.check(chunk(torch.tensor([0, 17])))  # any index: the action space is not known
    limits.check(chunk(torch.zeros(2, 5)))
    with pytest.raises(BadRequest, match="indices"):
        limits.check(chunk(torch.tensor([0, -1])))
    with pytest.raises(BadRequest, match="rewards holds NaN"):
        limits.check(chunk(torch.tensor([0, 1]), rewards=torch.tensor([float("nan"), 0.0])))
    with pytest.raises(BadRequest, match="step_ids holds negative"):
        limits.check(chunk(torch.tensor([0, 1]), step_ids=torch.tensor([-3, 0, 1])))
    with pytest.raises(ValueError, match="positive"):
        ChunkLimits(max_abs_reward=0)
