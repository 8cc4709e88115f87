"""Benchmark (not a test): memory of the edge's observation store (split modes) when full.

    python benchmarks/observation_store.py --envs 8 --capacity 3584 --frame-size 96

The edge-encoder keeps the frame stack of every step it encoded (`--observation-store-size` steps; 3,584 at
the CarRacing recipe's sizes) so the learner can ask for fresh activations or send gradients by step id. Two
layouts, each filled in a fresh process (so RSS growth is its own) with frames pushed through the real
FrameStacker, 0.1% of rows starting an episode per step:

  stacks  every step's stack put as `depth` separate frames (how the store worked until 2026-11-25)
  shared  rows of frames shared with the stacker, as the edge puts them (one frame per step)

Frames are CarRacing-v3's (`--frames carracing`, 96 x 96 gray frames of random driving, recorded first and
replayed per env at different offsets) or noise (`--frames noise`, which does not compress). The store keeps
each frame zstd-compressed. Reported: bytes of compressed frames the store holds (each counted once), and the
process's RSS growth before and after glibc's malloc_trim (freed per-step buffers that glibc keeps count in
RSS until trimmed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import torch

from splitrl.core.envs import make_env
from splitrl.core.framestack import FrameRow, FrameStacker
from splitrl.core.memory import release_free_memory
from splitrl.edge_encoder.observation_store import ObservationStore

LAYOUTS = ("stacks", "shared")


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def driving_frames(count: int, frame_size: int) -> torch.Tensor:
    """uint8 [count, frame_size, frame_size]: CarRacing-v3 frames of a policy that mostly accelerates."""
    env = make_env("CarRacing-v3", {"continuous": False}, frame_size, action_repeat=4)
    generator = torch.Generator().manual_seed(0)
    frames = [env.reset(seed=0)[0]]
    while len(frames) < count:
        action = 3 if torch.rand(1, generator=generator) < 0.6 else int(torch.randint(0, 5, (1,), generator=generator))
        frame, _, terminated, truncated, _ = env.step(action)
        frames.append(env.reset()[0] if terminated or truncated else frame)
    env.close()
    return torch.from_numpy(np.stack(frames))


def fill(layout: str, envs: int, capacity: int, frame_size: int, source: str) -> str:
    """Fill a store of `capacity` steps in `layout` with frames from `source`; one line of figures."""
    torch.set_num_threads(1)
    recorded = driving_frames(1000, frame_size) if source == "carracing" else None
    stacker, store = FrameStacker(envs, 4, frame_size, frame_size), ObservationStore(capacity)
    generator = torch.Generator().manual_seed(0)
    before = rss_mib()
    for step in range(capacity // envs + 4):
        if recorded is None:
            frames = torch.randint(0, 256, (envs, frame_size, frame_size), dtype=torch.uint8, generator=generator)
        else:
            frames = recorded[[(step + 97 * env) % len(recorded) for env in range(envs)]]
        starts = torch.rand(envs, generator=generator) < 0.001 if step else torch.ones(envs, dtype=torch.bool)
        stacked = stacker.push(frames, starts)
        rows: list[FrameRow] = list(stacker.rows) if layout == "shared" else [tuple(s.unbind()) for s in stacked]
        store.put(range(step * envs, (step + 1) * envs), rows)
    grown = rss_mib() - before
    held = store.frame_bytes()
    release_free_memory()
    trimmed = rss_mib() - before
    figures = [
        f"{len(store):,}",
        f"{held / 2**20:,.0f}",
        f"{held / len(store):,.0f}",
        f"{grown:,.0f}",
        f"{trimmed:,.0f}",
    ]
    return f"| {layout} | {' | '.join(figures)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=8, help="envs per stream (rows per step)")
    parser.add_argument("--capacity", type=int, default=3584, help="store size in steps (CarRacing recipe: 3,584)")
    parser.add_argument("--frame-size", type=int, default=96, help="frame side in pixels (CarRacing: 96)")
    parser.add_argument("--frames", choices=("carracing", "noise"), default="carracing", help="what the frames are")
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # one layout, in a child process
    args = parser.parse_args()
    if args.layout:
        print(fill(args.layout, args.envs, args.capacity, args.frame_size, args.frames))
        return
    print("| layout | steps held | compressed frames MiB | bytes per step | RSS growth MiB | after malloc_trim MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for layout in LAYOUTS:
        flags = ["--envs", str(args.envs), "--capacity", str(args.capacity), "--frame-size", str(args.frame_size)]
        flags += ["--frames", args.frames]
        child = [sys.executable, __file__, "--layout", layout, *flags]
        print(subprocess.run(child, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
