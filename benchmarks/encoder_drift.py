"""Benchmark (not a test): how far a few Adam steps move the edge encoder's features on CarRacing frames.

    python benchmarks/encoder_drift.py --width 32 --bottleneck layernorm --learning-rates 2.5e-4 5e-5 1e-5

Why it matters: in split-accumulate the head trains on activations the edge computed when it acted, while
the edge's encoder takes optimizer steps from the gradients sent down. If a few steps move the features by
about their own norm, the head is fitted to features the encoder no longer produces.

Frames: `--frames` agent steps of CarRacing-v3 through splitrl's make_env (discrete, action repeat 4, gray
96x96, 4 stacked), mostly gas with random actions between. Each setting starts from the same seed weights;
every step backpropagates the same random gradient direction (a consistent signal, as a PPO update's is
within one update) with the edge's own clip (0.5). Reported: the mean over frames of
|features after - features before| / |features before|.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from splitrl.core.envs import make_env
from splitrl.core.models import Encoder


def _stacks(agent_steps: int, seed: int) -> torch.Tensor:
    """uint8 [agent_steps, 4, 96, 96]: each step's newest 4 frames, as the edge stacks them."""
    env = make_env("CarRacing-v3", {"continuous": False}, frame_size=96, action_repeat=4)
    rng = np.random.default_rng(seed)
    observation, _ = env.reset(seed=seed)
    frames = [torch.as_tensor(observation)] * 4
    stacks = []
    for step in range(agent_steps):
        observation, _, terminated, truncated, _ = env.step(3 if step % 4 else int(rng.integers(5)))
        frames = [*frames[1:], torch.as_tensor(observation)]
        stacks.append(torch.stack(frames))
        if terminated or truncated:
            observation, _ = env.reset()
            frames = [torch.as_tensor(observation)] * 4
    return torch.stack(stacks)


def drift(stacks: torch.Tensor, width: int, bottleneck: str, learning_rate: float, steps: int) -> float:
    torch.manual_seed(0)
    encoder = Encoder(4, 96, width, bottleneck)  # type: ignore[arg-type]
    optimizer = torch.optim.Adam(encoder.parameters(), lr=learning_rate, eps=1e-5)
    with torch.no_grad():
        before = encoder(stacks)
    direction = torch.randn(before.shape, generator=torch.Generator().manual_seed(1)) / len(stacks)
    for _ in range(steps):
        optimizer.zero_grad()
        encoder(stacks).backward(direction)
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 0.5)
        optimizer.step()
    with torch.no_grad():
        after = encoder(stacks)
    return float(((after - before).norm(dim=1) / before.norm(dim=1).clamp_min(1e-12)).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--bottleneck", choices=["relu", "layernorm"], default="layernorm")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[2.5e-4, 5e-5, 1e-5])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 4, 16], help="Adam steps per measurement")
    parser.add_argument("--frames", type=int, default=128, help="CarRacing agent steps whose stacks are encoded")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    stacks = _stacks(args.frames, args.seed)
    print(f"width {args.width}, {args.bottleneck} bottleneck, {len(stacks)} CarRacing frame stacks")
    print("| Adam lr | " + " | ".join(f"{n} step{'s' * (n > 1)}" for n in args.steps) + " |")
    print("| ---: | " + " | ".join("---:" for _ in args.steps) + " |")
    for learning_rate in args.learning_rates:
        moved = [drift(stacks, args.width, args.bottleneck, learning_rate, n) for n in args.steps]
        print(f"| {learning_rate:g} | " + " | ".join(f"{m:.0%}" for m in moved) + " |")


if __name__ == "__main__":
    main()
