"""The split edge's encoder trained on the edge alone, before a run: an autoencoder of frames a random policy sees.

Why: split-accumulate's head trains on the activations stored when each step was acted on. An encoder the
learner's gradients move no longer produces them (on CarRacing one Adam step moves a narrow encoder's
features by a large fraction of their norm), and such a run does not learn to drive. A frozen encoder
(`--encoder-fraction 0`) keeps every stored activation exact, but a random one carries too little. Trained to
reconstruct its own input, it keeps what the frames hold, and no byte crosses the WAN for it: the edge plays its
own env copy, then `splitrl up --encoder-init FILE` starts from it.

Invariants: the Decoder mirrors the Encoder's conv stack layer for layer, so it reconstructs stacks of exactly
the encoder's input shape for any frame size the encoder takes; the file holds the encoder's weights with the
ModelConfig they fit, and `load_pretrained` refuses any other shape by name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from splitrl.core.envs import make_env
from splitrl.core.framestack import FrameRow, FrameStacker, stack_rows
from splitrl.core.models import Encoder, conv_stack, unit_range
from splitrl.core.spec import ModelConfig
from splitrl.edge_encoder.pretrained import PretrainResult

log = logging.getLogger(__name__)


class Decoder(nn.Module):
    """Activations float32 [B, width] -> frame stacks in [0, 1], float32 [B, frame_stack, S, S]: the Encoder's
    layers mirrored (a Linear to the conv stack's output, then each convolution transposed, last first)."""

    def __init__(self, model: ModelConfig) -> None:
        super().__init__()
        convolutions = [layer for layer in conv_stack(model.frame_stack) if isinstance(layer, nn.Conv2d)]
        sizes = [model.frame_size]  # the side of each convolution's input, then of the last one's output
        for conv in convolutions:
            sizes.append((sizes[-1] - conv.kernel_size[0]) // conv.stride[0] + 1)
        channels = convolutions[-1].out_channels
        layers: list[nn.Module] = [
            nn.Linear(model.width, channels * sizes[-1] ** 2),
            nn.ReLU(),
            nn.Unflatten(1, (channels, sizes[-1], sizes[-1])),
        ]
        for index in reversed(range(len(convolutions))):
            conv, side_in = convolutions[index], sizes[index]
            kernel, stride = conv.kernel_size[0], conv.stride[0]
            # a strided convolution drops (side_in - kernel) % stride rows; output_padding puts them back
            layers.append(
                nn.ConvTranspose2d(
                    conv.out_channels, conv.in_channels, kernel, stride, output_padding=(side_in - kernel) % stride
                )
            )
            layers.append(nn.ReLU() if index else nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def forward(self, activations: torch.Tensor) -> torch.Tensor:
        return self.net(activations)


class RandomPolicy:
    """Random actions for collecting frames: each agent step keeps the previous action with probability `hold`
    (a car on a random walk of single steps goes nowhere), else draws a new one: a discrete action by `weights`
    (one per action; None: uniform), a continuous one uniformly within the action space's bounds."""

    def __init__(
        self, space: gym.Space[Any], hold: float, weights: list[float] | None, generator: np.random.Generator
    ) -> None:
        if not 0 <= hold < 1:
            raise ValueError(f"hold must be in [0, 1), got {hold}")
        self.space, self.hold, self.generator = space, hold, generator
        self.probabilities: np.ndarray | None = None
        if isinstance(space, gym.spaces.Discrete):
            given = np.ones(int(space.n)) if weights is None else np.asarray(weights, dtype=np.float64)
            if given.shape != (int(space.n),) or (given < 0).any() or given.sum() <= 0:
                raise ValueError(
                    f"random action weights must be {int(space.n)} non-negative numbers, not all 0 (one per "
                    f"action of {space}), got {weights}"
                )
            self.probabilities = given / given.sum()
        elif not isinstance(space, gym.spaces.Box):
            raise ValueError(f"random actions for {space} are not supported (Discrete or Box)")
        elif weights is not None:
            raise ValueError(f"random action weights are for discrete actions; {space} is continuous")
        self.action: Any = None

    def __call__(self) -> Any:
        if self.action is None or self.generator.random() >= self.hold:
            if self.probabilities is not None:
                self.action = int(self.generator.choice(len(self.probabilities), p=self.probabilities))
            else:
                box = self.space
                assert isinstance(box, gym.spaces.Box)
                self.action = self.generator.uniform(box.low, box.high).astype(box.dtype)
        return self.action


def collect_stacks(
    env_id: str,
    env_kwargs: dict[str, Any],
    model: ModelConfig,
    action_repeat: int,
    steps: int,
    policy_of: Callable[[gym.Space[Any]], Callable[[], Any]],
    seed: int,
) -> list[FrameRow]:
    """The frame stacks of `steps` agent steps of `policy_of(action_space)` in one env (reset with seed, seed + 1,
    ... as episodes end): steps + 1 stacks, the first of each episode included, each as the edge builds it
    (core.framestack: shared frames, an episode's first frame repeated), in the order they were seen."""
    env = make_env(env_id, env_kwargs, model.frame_size, action_repeat)
    try:
        stacker = FrameStacker(1, model.frame_stack, model.frame_size, model.frame_size)
        policy, episode, rows = policy_of(env.action_space), 0, []
        frame, _ = env.reset(seed=seed)
        starting = True
        while True:
            stacker.push(torch.from_numpy(np.asarray(frame))[None], torch.tensor([starting]))
            rows.append(stacker.rows[0])
            if len(rows) > steps:
                return rows
            frame, _, terminated, truncated, _ = env.step(policy())
            starting = terminated or truncated
            if starting:
                episode += 1
                frame, _ = env.reset(seed=seed + episode)
    finally:
        env.close()


#: Share of the collected stacks held out to measure the autoencoder: the last ones collected, so no held-out
#: stack shares a frame with a training stack (neighbouring stacks share all but one).
HELD_OUT_SHARE = 0.1
#: Stacks per pass when measuring (bounds the float copies: 256 CarRacing stacks are ~38 MB).
MEASURE_BATCH = 256


def pretrain(
    encoder: Encoder,
    model: ModelConfig,
    rows: list[FrameRow],
    steps: int,
    batch_size: int,
    learning_rate: float,
    sampler: torch.Generator,
    report_every: int = 250,
) -> PretrainResult:
    """Train `encoder` (of shapes `model`) with a mirrored Decoder to reconstruct its input stacks for `steps`
    Adam steps of `batch_size` stacks drawn by `sampler` from `rows` (in collection order) but the last
    HELD_OUT_SHARE, on which the result is measured. Hands the encoder back in eval mode."""
    if steps < 1:
        raise ValueError(f"pretraining needs at least 1 step, got {steps}")
    training, held_out = split_held_out(rows, model.frame_stack)
    decoder = Decoder(model)
    optimizer = torch.optim.Adam([*encoder.parameters(), *decoder.parameters()], lr=learning_rate)
    encoder.train()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        picks = torch.randint(len(training), (batch_size,), generator=sampler).tolist()
        batch = stack_rows([training[i] for i in picks])
        loss = nn.functional.mse_loss(decoder(encoder(batch)), unit_range(batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % report_every == 0 or step == steps:  # the last report's error is the result's
            held_out_mse = reconstruction_mse(encoder, decoder, held_out)
            log.info("pretraining step %d/%d: MSE %.5f training, %.5f held out", step, steps, loss.item(), held_out_mse)
    encoder.eval()
    seconds = time.perf_counter() - started
    return PretrainResult(
        steps=steps,
        stacks=len(rows),
        held_out=len(held_out),
        held_out_mse=held_out_mse,
        mean_predictor_mse=mean_predictor_mse(training, held_out),
        seconds=seconds,
    )


def split_held_out(rows: list[FrameRow], depth: int) -> tuple[list[FrameRow], list[FrameRow]]:
    """(training, held out): the last HELD_OUT_SHARE of `rows` (at least one) held out, and the `depth - 1`
    stacks before them dropped, so no frame is in both."""
    held_count = max(1, round(len(rows) * HELD_OUT_SHARE))
    training = rows[: max(0, len(rows) - held_count - (depth - 1))]
    if not training:
        raise ValueError(f"pretraining needs more than {held_count + depth - 1} frame stacks, got {len(rows)}")
    return training, rows[-held_count:]


def _pieces(rows: list[FrameRow]) -> Iterator[torch.Tensor]:
    """`rows` as uint8 stacks, MEASURE_BATCH at a time."""
    for start in range(0, len(rows), MEASURE_BATCH):
        yield stack_rows(rows[start : start + MEASURE_BATCH])


def _pixels(rows: list[FrameRow]) -> int:
    return len(rows) * len(rows[0]) * rows[0][0].numel()


@torch.no_grad()
def reconstruction_mse(encoder: Encoder, decoder: Decoder, rows: list[FrameRow]) -> float:
    """Mean squared error per pixel of the decoder's reconstruction of `rows`' stacks, frames scaled to [0, 1]."""
    total = 0.0
    for stacks in _pieces(rows):
        total += float(((decoder(encoder(stacks)) - unit_range(stacks)) ** 2).sum())
    return total / _pixels(rows)


def mean_predictor_mse(training: list[FrameRow], held_out: list[FrameRow]) -> float:
    """The error per pixel of predicting every held-out stack as the training stacks' per-pixel mean: what an
    encoder that carries nothing reaches."""
    mean_stack = sum(stacks.float().sum(0) for stacks in _pieces(training)) / (255.0 * len(training))
    total = sum(float(((unit_range(stacks) - mean_stack) ** 2).sum()) for stacks in _pieces(held_out))
    return total / _pixels(held_out)
