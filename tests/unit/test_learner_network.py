"""The learner's network and optimizer (learner.network): the fused Adam steps as torch.optim.Adam does and
stays fused across checkpoints saved unfused; frames in the training layout."""

from __future__ import annotations

import io

import torch

from splitrl.core.models import cloud_network
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.learner.network import FusedAdam, to_training_layout

SPEC = ActionSpec("discrete", 3)
MODEL = ModelConfig(2, 36, 16, "relu")


def adam_steps(network: torch.nn.Module, optimizer: torch.optim.Adam, steps: int) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for parameter in network.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()


def saved(state: dict) -> dict:
    """As a checkpoint carries it: serialized, so writer and reader share no tensor."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def test_the_learners_adam_runs_fused_and_steps_as_torch_adam_does():
    torch.manual_seed(0)
    fused, plain = cloud_network("cloud", MODEL, SPEC), cloud_network("cloud", MODEL, SPEC)
    plain.load_state_dict(fused.state_dict())
    fused_adam = FusedAdam(fused.parameters(), lr=1e-3)
    assert fused_adam.param_groups[0]["fused"] is True and fused_adam.param_groups[0]["eps"] == 1e-5
    adam_steps(fused, fused_adam, 5)
    adam_steps(plain, torch.optim.Adam(plain.parameters(), lr=1e-3, eps=1e-5), 5)
    moved = [(a - b).abs().max() for a, b in zip(fused.parameters(), plain.parameters(), strict=True)]
    assert max(moved) < 1e-6, moved  # rounding only: 5 steps move each weight by up to 5e-3


def test_the_learners_adam_stays_fused_after_loading_a_checkpoint_saved_unfused():
    """Checkpoints from before FusedAdam hold torch.optim.Adam's groups (fused None): they resume, fused, from
    the same moments and step count; a FusedAdam's state still loads into torch.optim.Adam."""
    torch.manual_seed(0)
    old, new = cloud_network("cloud", MODEL, SPEC), cloud_network("cloud", MODEL, SPEC)
    new.load_state_dict(old.state_dict())
    old_adam = torch.optim.Adam(old.parameters(), lr=1e-3, eps=1e-5)
    adam_steps(old, old_adam, 3)
    new.load_state_dict(old.state_dict())
    new_adam = FusedAdam(new.parameters(), lr=1e-3)
    new_adam.load_state_dict(saved(old_adam.state_dict()))
    assert all(group["fused"] is True for group in new_adam.param_groups)
    adam_steps(old, old_adam, 2)
    adam_steps(new, new_adam, 2)
    assert [state["step"].item() for state in new_adam.state.values()] == [5.0] * len(new_adam.state)
    moved = [(a - b).abs().max() for a, b in zip(old.parameters(), new.parameters(), strict=True)]
    assert max(moved) < 1e-6, moved
    torch.optim.Adam(old.parameters(), lr=1e-3).load_state_dict(saved(new_adam.state_dict()))


def test_frames_are_put_in_the_convolutions_layout_once_and_rows_taken_from_them_stay_in_it():
    """The training layout's encoder reorders uint8 frames to channels-last (acting's leaves them as they are);
    frames already in it are the same tensor, not a copy, and the activations match the acting layout's. That a
    minibatch's rows keep the layout (so Trainer.update reorders an update's frames once, not at every minibatch)
    is Rows.take's test, in test_batch."""
    torch.manual_seed(0)
    acting = cloud_network("cloud", MODEL, SPEC)
    training = to_training_layout(cloud_network("cloud", MODEL, SPEC))
    training.load_state_dict(acting.state_dict())
    frames = torch.randint(0, 256, (6, 2, 36, 36), dtype=torch.uint8)
    assert acting.encoder.in_layout(frames) is frames
    ordered = training.encoder.in_layout(frames)
    assert ordered.is_contiguous(memory_format=torch.channels_last) and not frames.is_contiguous(
        memory_format=torch.channels_last
    )
    assert training.encoder.in_layout(ordered) is ordered
    minibatch = ordered[torch.tensor([4, 0, 2])]
    assert minibatch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(minibatch, frames[torch.tensor([4, 0, 2])])
    # Either layout, the same activations (up to the kernels' summation order).
    assert torch.allclose(training.encoder(minibatch), acting.encoder(frames[torch.tensor([4, 0, 2])]), atol=1e-5)
