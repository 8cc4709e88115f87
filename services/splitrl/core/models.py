"""The agent, split where the research split it: a CNN encoder (edge) and an actor-critic head (cloud).

The encoder is the Nature-DQN CNN. On 4 x 96 x 96 stacks its flattened output
is 64 x 8 x 8 = 4,096 numbers, exactly the research's activation width; any
other width adds a linear bottleneck after the convolutions.

Every layer starts orthogonal with zero biases, the PPO initialisation of
CleanRL and SB3: gain sqrt(2) for the hidden layers (convolutions, bottleneck,
the head's trunk), 0.01 for the actor (near-uniform first actions), 1 for the
critic. With torch's defaults the biases dominated on mostly dark frames (on
Catch, each feature varied over 200 frames by ~5% of its mean magnitude;
orthogonal: ~110%), so the head had nothing to act on until the encoder had
trained. Weights depend only on torch's seed: every process that seeds alike
(edge, inference, learner ranks) builds the same ones.
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


#: The gain of layers followed by a ReLU (and of the layernorm bottleneck's linear layer, whose scale LayerNorm
#: removes anyway).
HIDDEN_GAIN = math.sqrt(2)


def init_layers(module: nn.Module, gain: float) -> None:
    """Every Conv2d and Linear inside `module` (itself included): orthogonal weights times `gain`, zero biases."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


#: 1 / 255, which torch applies as a float32 scalar: x * this differs from x / 255 by at most one ulp (in 126 of
#: the 256 byte values).
UNIT_SCALE = 1.0 / 255.0


def unit_range(frames: torch.Tensor) -> torch.Tensor:
    """uint8 frames (any shape) as a new float32 tensor in [0, 1], in their layout (contiguous or channels-last):
    `frames / 255` within an ulp. `frames` itself is left as it is, whatever its dtype.

    Times the reciprocal rather than divides: a multiplication is several times cheaper than a division over
    a minibatch's millions of numbers. In place on the float copy, which is this call's own: a second
    4-byte-per-number buffer would cost as much again."""
    return frames.to(torch.float32, copy=True).mul_(UNIT_SCALE)


def _conv_output_size(frame_stack: int, frame_size: int) -> int:
    with torch.no_grad():
        return int(conv_stack(frame_stack)(torch.zeros(1, frame_stack, frame_size, frame_size)).shape[1])


def conv_stack(frame_stack: int) -> nn.Sequential:
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
    """uint8 frame stacks [B, frame_stack, S, S] -> activations float32 [B, width] (see Bottleneck). Starts with
    every layer orthogonal (gain sqrt(2)) and zero biases."""

    def __init__(
        self, frame_stack: int = 4, frame_size: int = 96, width: int = 4096, bottleneck: Bottleneck = "relu"
    ) -> None:
        super().__init__()
        if bottleneck not in ("relu", "layernorm"):
            raise ValueError(f"bottleneck must be 'relu' or 'layernorm', got {bottleneck!r}")
        conv_out = _conv_output_size(frame_stack, frame_size)
        layers: list[nn.Module] = [conv_stack(frame_stack)]
        if width != conv_out:
            layers.append(nn.Linear(conv_out, width))
            if bottleneck == "relu":
                layers.append(nn.ReLU())
        if bottleneck == "layernorm":
            layers.append(nn.LayerNorm(width, elementwise_affine=False))
        self.net = nn.Sequential(*layers)
        init_layers(self.net, HIDDEN_GAIN)
        self.width = width
        self.input_shape = (frame_stack, frame_size, frame_size)

    def forward(self, stacks: torch.Tensor) -> torch.Tensor:
        return self.net(unit_range(self.in_layout(stacks)))

    def in_layout(self, stacks: torch.Tensor) -> torch.Tensor:
        """uint8 frame stacks [B, frame_stack, S, S] in the memory layout of this encoder's convolutions: reordered
        to channels-last when its weights are (the learner's training layout, learner.network), else as given;
        the same tensor when already in it.

        Reordering while the frames are 1 byte per number makes the float copy born in the convolutions'
        layout, so neither the forward pass nor the first convolution's backward reorders 4 bytes per number. A
        learner reorders an update's rows once (Trainer.update), not each minibatch: row indexing keeps it."""
        first_conv_weight = next(self.parameters())
        if first_conv_weight.is_contiguous(memory_format=torch.channels_last):
            return stacks.contiguous(memory_format=torch.channels_last)
        return stacks


class ActorCriticHead(nn.Module):
    """Activations [B, width] -> (action distribution, value [B]). Starts orthogonal with zero biases: trunk gain
    sqrt(2), actor 0.01, critic 1."""

    def __init__(self, width: int, action_spec: ActionSpec, hidden: int = 512) -> None:
        super().__init__()
        self.action_spec = action_spec
        self.width = width
        self.trunk = nn.Sequential(nn.Linear(width, hidden), nn.ReLU())
        init_layers(self.trunk, HIDDEN_GAIN)
        self.actor = nn.Linear(hidden, action_spec.size)
        self.critic = nn.Linear(hidden, 1)
        init_layers(self.actor, 0.01)
        init_layers(self.critic, 1.0)
        if action_spec.kind == "continuous":
            self.log_std = nn.Parameter(torch.full((action_spec.size,), -0.5))

    def forward(self, activations: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        hidden = self.trunk(activations.float())
        # The output layers run in float32 even under the learner's bfloat16 autocast (--train-precision): PPO's
        # ratio divides these probabilities by those inference acted with in float32 (GAE), and bfloat16's 8-bit
        # mantissa would add ~0.5% noise to every logit before a single weight had moved. So does the distribution:
        # Categorical normalises its logits (a logsumexp) as it is made, which autocast would run in bfloat16.
        with torch.autocast(hidden.device.type, enabled=False):
            hidden = hidden.float()
            logits_or_mean = self.actor(hidden)
            value = self.critic(hidden).squeeze(-1)
            return self.distribution(logits_or_mean), value

    def distribution(self, logits_or_mean: torch.Tensor) -> Distribution:
        """The action distribution the actor's outputs [B, A] parametrise: categorical over logits, or a diagonal
        Gaussian around the mean with this head's learned log_std."""
        if self.action_spec.kind == "discrete":
            return Categorical(logits=logits_or_mean)
        return Independent(Normal(logits_or_mean, self.log_std.exp()), 1)


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
