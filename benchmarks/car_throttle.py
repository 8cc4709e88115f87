"""Benchmark (not a test): how fast CarRacing's car gets going on each throttle an action can press.

    python benchmarks/car_throttle.py --tracks 5 --frames 100

From a standstill at the start of each track (the first stretch of a CarRacing track is close to straight), the
car holds one action for `--frames` frames; the table gives its mean speed (Box2D units; the dashboard's bar) at
a few frame counts. gymnasium's discrete "gas" presses the throttle to 0.2, splitrl/CarRacingThrottle-v0's full
throttle to 1.0 (splitrl.core.car_actions): a car that covers fewer tiles per frame runs out of CarRacing's
1,000 frames before it runs out of track.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

from splitrl.core.car_actions import DEFAULT_ACTIONS, ENV_ID

#: (label, env id, action held) for each throttle compared.
THROTTLES = [
    ("discrete gas (0.2)", "CarRacing-v3", 3),
    ("full throttle (1.0)", ENV_ID, DEFAULT_ACTIONS.index((0.0, 1.0, 0.0))),
]


def speeds(env_id: str, action: int, seed: int, frames: int) -> np.ndarray:
    """The car's speed after each of `frames` frames holding `action` (no action repeat)."""
    kwargs = {"continuous": False} if env_id == "CarRacing-v3" else {}
    env = gym.make(env_id, **kwargs)
    env.reset(seed=seed)
    measured = []
    for _ in range(frames):
        env.step(action)
        measured.append(float(np.linalg.norm(env.unwrapped.car.hull.linearVelocity)))  # type: ignore[attr-defined]
    env.close()
    return np.array(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracks", type=int, default=5, help="tracks (reset seeds 0..N-1) to average over")
    parser.add_argument("--frames", type=int, default=100, help="frames each action is held from a standstill")
    args = parser.parse_args()
    marks = [m for m in (10, 25, 50, 75, 100, 150, 200) if m <= args.frames]
    print("| throttle | " + " | ".join(f"speed at frame {m}" for m in marks) + " |")
    print("| --- | " + " | ".join("---:" for _ in marks) + " |")
    for label, env_id, action in THROTTLES:
        mean = np.mean([speeds(env_id, action, seed, args.frames) for seed in range(args.tracks)], axis=0)
        print(f"| {label} | " + " | ".join(f"{mean[m - 1]:.1f}" for m in marks) + " |")


if __name__ == "__main__":
    main()
