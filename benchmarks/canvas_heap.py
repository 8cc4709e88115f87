"""Benchmark (not a test): what CarRacing's 3.2 MB drawing canvas costs 8 envs in one process, three ways.

    python benchmarks/canvas_heap.py --envs 8 --rounds 40

- kept: the env holds its canvas between steps (make_env(release_canvas=False));
- released: ReleaseCanvas drops it after each step, glibc's heap thresholds left as they are
  (reuse_heap=False): the heap is trimmed and every draw faults the canvas pair back in;
- released, heap reused: the default, core.memory.reuse_freed_blocks() keeps the freed pair in the heap.

Each runs in a fresh process (the heap setting is process-wide and once only), stepping the envs in turn
with random actions at action repeat 4: best ms per agent step of 3 timings, minor page faults per agent
step, and resident memory at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, time
from splitrl.core.envs import make_env
envs_count, rounds, release, reuse = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
envs = [make_env("CarRacing-v3", {"continuous": False}, 96, 4, release_canvas=release, reuse_heap=reuse)
        for _ in range(envs_count)]
for seed, env in enumerate(envs):
    env.reset(seed=seed)
    env.action_space.seed(seed)
faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
best = float("inf")
for _ in range(3):
    started = time.perf_counter()
    for _ in range(rounds):
        for env in envs:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
    best = min(best, (time.perf_counter() - started) / (rounds * envs_count))
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / (3 * rounds * envs_count)
resident = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
print(json.dumps({"ms": best * 1e3, "faults": faults, "resident_mb": resident}))
"""

VARIANTS = {"kept": ("0", "0"), "released": ("1", "0"), "released, heap reused": ("1", "1")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=8, help="CarRacing envs in the process (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=40, help="steps of every env per timing (default: %(default)s)")
    args = parser.parse_args()
    print(f"CarRacing-v3, {args.envs} envs in one process, action repeat 4, {args.rounds} rounds, best of 3")
    print("| canvas | ms per agent step | page faults per agent step | resident MB at the end |")
    print("| --- | ---: | ---: | ---: |")
    for name, (release, reuse) in VARIANTS.items():
        command = [sys.executable, "-c", CHILD, str(args.envs), str(args.rounds), release, reuse]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        print(f"| {name} | {result['ms']:.2f} | {result['faults']:,.0f} | {result['resident_mb']:.0f} |")


if __name__ == "__main__":
    main()
