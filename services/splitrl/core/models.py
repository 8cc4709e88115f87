"""The agent, split where the research split it: a CNN encoder (edge) and an actor-critic head (cloud).

The encoder is the Nature-DQN CNN. On 4 x 96 x 96 stacks its flattened output
is 64 x 8 x 8 = 4,096 numbers, exactly the research's activation width; any
other width adds a linear bottleneck after the convolutions.

Hidden layers (convolutions, bottleneck, the head's trunk) start orthogonal with
gain sqrt(2) and zero biases, the PPO initialisation of CleanRL and SB3: with
torch's defaults the biases dominate on mostly dark frames (on Catch, each
feature varied over 400 frames by ~5% of its mean magnitude; orthogonal: ~110%),
so the head had nothing to act on until the encoder had trained.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from splitrl.core.spec import ActionSpec, Bottleneck, ModelConfig

if TYPE_CHECKING:
    from splitrl.core.config import Mode


def init_relu_layers(module: nn.Module) -> None:
    """Every Conv2d and Linear inside `module`: orthogonal weights with ReLU's gain sqrt(2), zero biases."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _conv_output_size(frame_stack: int, frame_size: int) -> int:
    with torch.no_grad():
        return int(_conv_stack(frame_stack)(torch.zeros(1, frame_stack, frame_size, frame_size)).shape[1])


def _conv_stack(frame_stack: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(frame_stack, 32, kernel_size=8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, kernel_size=3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )


class Encoder(nn.Module):
    """uint8 frame stacks [B, frame_stack, S, S] -> activations float32 [B, width] (see Bottleneck)."""

    def __init__(
        self, frame_stack: int = 4, frame_size: int = 96, width: int = 4096, bottleneck: Bottleneck = "relu"
    ) -> None:
        super().__init__()
        if bottleneck not in ("relu", "layernorm"):
            raise ValueError(f"bottleneck must be 'relu' or 'layernorm', got {bottleneck!r}")
        conv_out = _conv_output_size(frame_stack, frame_size)
        layers: list[nn.Module] = [_conv_stack(frame_stack)]
        if width != conv_out:
            layers.append(nn.Linear(conv_out, width))
            if bottleneck == "relu":
                layers.append(nn.ReLU())
        if bottleneck == "layernorm":
            layers.append(nn.LayerNorm(width, elementwise_affine=False))
        self.net = nn.Sequential(*layers)
        init_relu_layers(self.net)
        self.width = width
        self.input_shape = (frame_stack, frame_size, frame_size)

    def forward(self, stacks: torch.Tensor) -> torch.Tensor:
        return self.net(stacks.float() / 255.0)


class ActorCriticHead(nn.Module):
    """Activations [B, width] -> (action distribution, value [B])."""

    def __init__(self, width: int, action_spec: ActionSpec, hidden: int = 512) -> None:
        super().__init__()
        self.action_spec = action_spec
        self.width = width
        self.trunk = nn.Sequential(nn.Linear(width, hidden), nn.ReLU())
        init_relu_layers(self.trunk)
        self.actor = nn.Linear(hidden, action_spec.size)
        self.critic = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.actor.weight, gain=0.01)
        nn.init.zeros_(self.actor.bias)
        nn.init.orthogonal_(self.critic.weight, gain=1.0)
        nn.init.zeros_(self.critic.bias)
        if action_spec.kind == "continuous":
            self.log_std = nn.Parameter(torch.full((action_spec.size,), -0.5))

    def forward(self, activations: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        hidden = self.trunk(activations.float())
        logits_or_mean = self.actor(hidden)
        value = self.critic(hidden).squeeze(-1)
        if self.action_spec.kind == "discrete":
            return Categorical(logits=logits_or_mean), value
        return Independent(Normal(logits_or_mean, self.log_std.exp()), 1), value


class ActorCritic(nn.Module):
    """Encoder + head: the whole agent, as the cloud mode runs it."""

    def __init__(self, model: ModelConfig, action_spec: ActionSpec) -> None:
        super().__init__()
        self.encoder = model.encoder()
        self.head = ActorCriticHead(model.width, action_spec)

    def forward(self, stacks: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        return self.head(self.encoder(stacks))


def cloud_network(mode: Mode, model: ModelConfig, action_spec: ActionSpec) -> nn.Module:
    """The network the cloud (inference, learner) holds in `mode`: the whole ActorCritic in cloud mode, its head
    alone in the split modes, whose encoders live on the edges. Inputs: uint8 frame stacks, or activations."""
    return ActorCritic(model, action_spec) if mode == "cloud" else ActorCriticHead(model.width, action_spec)
