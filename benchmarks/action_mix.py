"""Analysis (not a test): which actions a trained run's policy takes, with argmax and with sampled actions.

    python benchmarks/action_mix.py RUN_DIR --episodes 2

For a discrete policy: the share of steps each action was taken, the policy's mean probability of each
action, and the mean return, playing unseen episodes (reset seeds from 2 x 10^9, apart from `splitrl eval`'s)
first with the most likely action, then sampling. A policy that drives by mixing "nothing" and "gas" shows
"gas" rarely most likely: its argmax car barely moves while the sampled one drives.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from splitrl.core.envs import action_spec_of, make_env
from splitrl.run.evaluate import Agent, run_settings

SEED_BASE = 2_000_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="A directory `splitrl up` wrote (its checkpoints are played).")
    parser.add_argument("--episodes", type=int, default=2, help="Unseen episodes per way of acting.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the sampled actions
    run = run_settings(args.run_dir)
    spec = action_spec_of(run.env, run.env_kwargs)
    if spec.kind != "discrete":
        parser.error(f"{run.env} has a {spec.kind} action space; this counts discrete actions")
    agent = Agent(args.run_dir, run, spec)
    probabilities: list[np.ndarray] = []
    forward = agent.network.forward

    def recording(inputs: torch.Tensor) -> object:
        distribution, value = forward(inputs)
        probabilities.append(distribution.probs[0].numpy().copy())
        return distribution, value

    agent.network.forward = recording  # type: ignore[method-assign]
    env = make_env(run.env, run.env_kwargs, run.frame_size, run.action_repeat)
    print(f"{args.run_dir}: policy version {agent.version}, {args.episodes} episodes each way")
    for deterministic in (True, False):
        probabilities.clear()
        taken: Counter[int] = Counter()
        total = 0.0
        for episode in range(args.episodes):
            frame, _ = env.reset(seed=SEED_BASE + episode)
            agent.start_episode()
            done = False
            while not done:
                action = agent.act(frame, deterministic)
                taken[action] += 1
                frame, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
        steps = sum(taken.values())
        shares = " ".join(f"{a}:{taken[a] / steps:.2f}" for a in range(spec.size))
        mean_probs = " ".join(f"{p:.3f}" for p in np.mean(probabilities, axis=0))
        print(
            f"{'argmax ' if deterministic else 'sampled'}: return/episode {total / args.episodes:.1f}; "
            f"share of steps per action {shares}; mean probabilities {mean_probs}"
        )
    env.close()


if __name__ == "__main__":
    main()
