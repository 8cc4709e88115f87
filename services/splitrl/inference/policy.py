"""The policy inference runs: the head alone (split modes) or encoder + head (cloud)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splitrl.core.config import Mode
from splitrl.core.models import cloud_network
from splitrl.core.rpc import BadRequest
from splitrl.core.spec import ActionSpec, ModelConfig


@dataclass
class Decisions:
    """What the policy decided for a batch of B rows."""

    actions: torch.Tensor  # int64 [B] or float32 [B, A]
    log_probs: torch.Tensor  # float32 [B]
    values: torch.Tensor  # float32 [B]
    policy_version: int  # the version whose weights produced these decisions


class Policy:
    """Samples actions. `version` counts the weight updates applied (0 = initial weights)."""

    def __init__(self, mode: Mode, model: ModelConfig, action_spec: ActionSpec, seed: int) -> None:
        """`mode` decides what it acts on (core.models.cloud_network): frame stacks in cloud mode, activations
        in the split modes. `seed` sets the initial weights (the learner's, same seed, match) and sampling."""
        torch.manual_seed(seed)
        self.network = cloud_network(mode, model, action_spec)
        self.network.eval()
        self.action_spec = action_spec
        self.version = 0
        self._generator = torch.Generator().manual_seed(seed)

    def load(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Swap in new weights (validated by the caller); later batches act with them as `version`. A version older
        than the current one is refused (BadRequest), so versions never go back, whichever stream brought them;
        the same version again is taken: a learner resumed from its checkpoint re-publishes it."""
        if version < self.version:
            raise BadRequest(f"Weights.version {version} is older than {self.version}")
        self.network.load_state_dict(state_dict)
        self.version = version

    @torch.no_grad()
    def act(self, observations: torch.Tensor) -> Decisions:
        """observations: uint8 stacks [B, stack, S, S] (cloud) or activations [B, width] (split)."""
        distribution, values = self.network(observations)
        if self.action_spec.kind == "discrete":
            probs = distribution.probs  # type: ignore[attr-defined]
            actions = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        else:
            base = distribution.base_dist  # type: ignore[attr-defined]
            noise = torch.randn(base.loc.shape, generator=self._generator)
            actions = base.loc + base.scale * noise
        return Decisions(actions, distribution.log_prob(actions).float(), values.float(), self.version)
