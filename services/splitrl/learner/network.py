"""What a learner trains and what steps it: the network in its training layout, and the fused Adam.

Shared by the learner service and the bench's sync-ppo baseline, so that both train with the same kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from splitrl.core.envs import action_spec_of
from splitrl.core.models import cloud_network
from splitrl.learner.settings import LearnerSettings


class FusedAdam(torch.optim.Adam):
    """The learner's optimizer: torch.optim.Adam (eps 1e-5, CleanRL's) run fused, one kernel over every parameter
    per step instead of about ten passes over each tensor. Same update up to rounding, several times faster.

    Invariant: every step runs fused, also after `load_state_dict` of a state saved unfused (a checkpoint from
    before this class, or torch.optim.Adam's), whose groups would otherwise switch it back."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float) -> None:
        super().__init__(params, lr=lr, eps=1e-5, fused=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = [{**group, "fused": True, "foreach": None} for group in state_dict["param_groups"]]
        super().load_state_dict({**state_dict, "param_groups": groups})


def learner_network(settings: LearnerSettings) -> nn.Module:
    """The network a learner trains in `settings.mode` (models.cloud_network), with weights from torch's global
    seed, in the training layout (`to_training_layout`)."""
    network = cloud_network(settings.mode, settings.network_config(), action_spec_of(settings.env, settings.env_kwargs))
    return to_training_layout(network)


def to_training_layout(network: nn.Module) -> nn.Module:
    """`network`, its convolution weights moved to channels-last layout in place (a no-op for the split modes'
    head, which has none). oneDNN's kernels for it make a minibatch step of the CarRacing network faster, and
    models.Encoder then reorders its frames to match while they are uint8. Checkpoints and weights sent to
    inference are the same numbers in either layout. Acting on a few rows runs no slower in it."""
    network.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented; not in the stubs
    return network
