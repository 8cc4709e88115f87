"""Benchmark (not a test): agent steps per second of CarRacing-v3 with the plain and the fast action repeat.

    python benchmarks/action_repeat.py --repeats 1 4 8 --steps 300

Both run through splitrl's make_env (gray, resized) on one core, side by side in one
process, alternating so machine noise hits both alike. The fast repeat draws only the
frame it keeps (splitrl.core.action_repeat); the plain one draws every frame.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

from splitrl.core.envs import make_env


def _seconds_per_step(env: gym.Env, steps: int, seed: int) -> float:  # type: ignore[type-arg]
    env.reset(seed=seed)
    env.action_space.seed(seed)
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CarRacing-v3", help="env id (default: %(default)s)")
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 4, 8], help="action repeats to time")
    parser.add_argument("--steps", type=int, default=300, help="agent steps per timing (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is kept")
    parser.add_argument("--frame-size", type=int, default=96, help="frame size (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = f"{args.frame_size}x{args.frame_size}"
    print(f"{args.env}, frames {size} gray, {args.steps} agent steps, best of {args.rounds}")
    print("| repeat | plain ms/step | fast ms/step | plain frames/s | fast frames/s | speedup |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for repeat in args.repeats:
        timings: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(args.rounds):
            for fast in (False, True):
                env = make_env(args.env, {"continuous": False}, args.frame_size, repeat, skip_render=fast)
                timings[fast].append(_seconds_per_step(env, args.steps, seed=round_))
                env.close()
        plain, fast_s = min(timings[False]), min(timings[True])
        print(
            f"| {repeat} | {plain * 1e3:.2f} | {fast_s * 1e3:.2f} | {repeat / plain:,.0f} | {repeat / fast_s:,.0f} "
            f"| {plain / fast_s:.2f}x |"
        )


if __name__ == "__main__":
    main()
