"""Benchmark (not a test): agent steps per second of CarRacing-v3 with the plain and the fast action repeat,
and with the fast draw on top. It backs the "Stepping CarRacing" table of docs/results/throughput.md.

    python benchmarks/action_repeat.py --repeats 1 4 8 --steps 300

All three run through splitrl's make_env (gray, resized) on one core, side by side in one
process, alternating so machine noise hits them alike. The plain repeat draws every frame
with gymnasium's own code; the fast repeat draws only the frame it keeps
(splitrl.core.action_repeat); the fast draw places the road with numpy and writes
the score with one font (splitrl.core.fast_draw). All three give the same frames (tests/unit).
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
    print(
        "| repeat | plain ms/step | fast repeat ms/step | + fast draw ms/step | plain frames/s | fast repeat "
        "frames/s | + fast draw frames/s | speedup: repeat | speedup: both |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    variants = {"plain": (False, False), "repeat": (True, False), "both": (True, True)}  # (skip_render, fast_draw)
    for repeat in args.repeats:
        timings: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name, (skip_render, fast_draw) in variants.items():
                env = make_env(
                    args.env,
                    {"continuous": False},
                    args.frame_size,
                    repeat,
                    skip_render=skip_render,
                    fast_draw=fast_draw,
                )
                timings[name].append(_seconds_per_step(env, args.steps, seed=round_))
                env.close()
        plain, fast_repeat, both = (min(timings[name]) for name in variants)
        print(
            f"| {repeat} | {plain * 1e3:.2f} | {fast_repeat * 1e3:.2f} | {both * 1e3:.2f} | {repeat / plain:,.0f} "
            f"| {repeat / fast_repeat:,.0f} | {repeat / both:,.0f} | {plain / fast_repeat:.2f}x | {plain / both:.2f}x |"
        )


if __name__ == "__main__":
    main()
