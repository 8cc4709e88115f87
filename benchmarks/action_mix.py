"""Analysis (not a test): which actions a trained run's policy takes, with argmax and with sampled actions.

    python benchmarks/action_mix.py RUN_DIR --episodes 2
    python benchmarks/action_mix.py RUN_DIR --episodes 10 --reassign 4:3   # and sampled with brake -> gas

RUN_DIR is a directory `splitrl up` wrote, or a `splitrl bench learning --sb3-reference` row's run directory
(its checkpoints/sb3_ppo.zip; needs the sb3 extra). For a discrete policy, playing unseen episodes (reset seeds
from 2 x 10^9, apart from `splitrl eval`'s; episode k gets the same track in every pass and every run) first
with the most likely action, then sampling: the return per episode, the share of steps each action was taken,
the policy's mean probability of each action, and how sure it was (entropy in nats, mean and median over
steps; the share of steps whose most likely action had under half the probability).

A policy that drives by mixing "nothing" and "gas" shows "gas" rarely most likely: its argmax car barely moves
while the sampled one drives. `--reassign FROM:TO` adds a third pass that samples with action FROM's
probability moved to TO, to see what a small share of one action costs a sampled policy (CarRacing's actions:
0 nothing, 1 left, 2 right, 3 gas, 4 brake). That pass's probabilities and entropy are the policy's own, on the
states it visited; its shares of steps are of the actions taken after the move.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from splitrl.bench.sb3_reference import SB3Actor, model_path
from splitrl.core.envs import action_spec_of, make_env
from splitrl.run.evaluate import Agent, run_settings

SEED_BASE = 2_000_000_000


def reassignment(text: str) -> tuple[int, int]:
    """FROM:TO action indices, from --reassign."""
    try:
        source, target = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--reassign takes FROM:TO action indices, e.g. 4:3; got {text!r}") from None
    if source == target:
        raise argparse.ArgumentTypeError(f"--reassign moves one action's probability to another; got {text!r}")
    return source, target


def play(policy: Any, env: Any, episodes: int, how: str, reassign: tuple[int, int] | None, rng: Any) -> str:
    """One pass of `episodes` episodes acting `how` ("argmax", "sampled" or "reassigned"); its summary line."""
    taken: Counter[int] = Counter()
    seen: list[np.ndarray] = []
    total = 0.0
    for episode in range(episodes):
        frame, _ = env.reset(seed=SEED_BASE + episode)
        policy.start_episode()
        done = False
        while not done:
            probabilities = policy.probabilities(frame)
            seen.append(probabilities)
            if how == "argmax":
                action = int(probabilities.argmax())
            else:
                acting = probabilities.astype(np.float64)
                if reassign is not None and how == "reassigned":
                    acting[reassign[1]] += acting[reassign[0]]
                    acting[reassign[0]] = 0.0
                action = int(rng.choice(len(acting), p=acting / acting.sum()))
            taken[action] += 1
            frame, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    steps, probs = sum(taken.values()), np.asarray(seen)
    entropy = -(probs * np.log(np.clip(probs, 1e-12, 1.0))).sum(axis=1)
    shares = " ".join(f"{a}:{taken[a] / steps:.2f}" for a in range(probs.shape[1]))
    mean_probs = " ".join(f"{p:.3f}" for p in probs.mean(axis=0))
    label = f"sampled, {reassign[0]}->{reassign[1]}" if how == "reassigned" and reassign else how
    return (
        f"{label}: return/episode {total / episodes:.1f}; share of steps per action {shares}; mean probabilities "
        f"{mean_probs}; entropy {entropy.mean():.3f} nats (median {np.median(entropy):.3f}); most likely action "
        f"under 0.5 on {np.mean(probs.max(axis=1) < 0.5):.1%} of steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="A run directory (splitrl's, or an SB3 reference row's).")
    parser.add_argument("--episodes", type=int, default=2, help="Unseen episodes per way of acting.")
    parser.add_argument("--reassign", type=reassignment, help="FROM:TO: also sample with FROM's probability on TO.")
    args = parser.parse_args()
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1; got {args.episodes}")
    torch.set_num_threads(1)
    run = run_settings(args.run_dir)
    spec = action_spec_of(run.env, run.env_kwargs)
    if spec.kind != "discrete":
        parser.error(f"{run.env} has a {spec.kind} action space; this counts discrete actions")
    if args.reassign and not all(0 <= a < spec.size for a in args.reassign):
        parser.error(f"--reassign {args.reassign[0]}:{args.reassign[1]}: {run.env} has actions 0..{spec.size - 1}")
    sb3 = model_path(args.run_dir).exists()
    policy = SB3Actor.load(args.run_dir, run) if sb3 else Agent(args.run_dir, run, spec)
    env = make_env(run.env, run.env_kwargs, run.frame_size, run.action_repeat)
    print(f"{args.run_dir}: {'SB3 ' if sb3 else ''}policy version {policy.version}, {args.episodes} episodes each way")
    rng = np.random.default_rng(0)  # the sampled actions
    for how in ("argmax", "sampled", "reassigned") if args.reassign else ("argmax", "sampled"):
        print(play(policy, env, args.episodes, how, args.reassign, rng), flush=True)
    env.close()


if __name__ == "__main__":
    main()
