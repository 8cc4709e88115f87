"""Benchmark (not a test): what glibc's heap costs a CarRacing learner that trains in a thread of its own.

    python benchmarks/learner_heap.py --updates 6

`splitrl serve learner` trains in a thread beside its event loop. Each variant runs PPO updates with V-trace
(CarRacing's recipe: 16 chunks of 32 steps of 4 x 96 x 96 frames, 4 epochs of 4 minibatches, width 4,096,
one torch thread) in such a thread, in a fresh process (the heap settings are process-wide and once only):

- thread heap, whole pass: glibc's default, a heap of the thread's own, and V-trace's pass before each update
  over all 528 rows at once (the code before session 46);
- thread heap: the same, V-trace's pass a minibatch's rows at a time (Trainer._evaluate);
- one heap: as `splitrl serve` runs, core.memory.one_heap() first, every thread on the main heap.

Prints the median ms per update after the first, and minor page faults and kernel CPU ms per update. Alone in
its process the training thread's heap keeps its mappings (2-708 faults per update here): the mapping and unmapping
of whole 64 MiB mappings that one_heap() stopped showed in `splitrl serve learner`, beside its event loop's and
gRPC's allocations, and is measured there (/proc, docs/throughput "Session 46").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, statistics, sys, threading, time
from splitrl.core.memory import one_heap
if sys.argv[2] == "one heap":
    one_heap()  # first, as `splitrl serve` does: before torch's import starts threads
import torch
sys.path.insert(0, sys.argv[3])
from learner_step import minibatch
from splitrl.learner.network import learner_network
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import Trainer

class WholePass(Trainer):
    @torch.no_grad()
    def _evaluate(self, inputs, actions, rows_at_once):
        with self._autocast():
            distribution, values = self.network(inputs)
        return distribution.log_prob(actions), values

torch.set_num_threads(1)
settings = LearnerSettings(mode="cloud", tls="plaintext", correction="vtrace", epochs=4, minibatches=4,
                           env="CarRacing-v3", env_kwargs={"continuous": False}, frame_stack=4, frame_size=96,
                           width=4096)
torch.manual_seed(0)
trainer = (WholePass if sys.argv[2] == "thread heap, whole pass" else Trainer)(learner_network(settings), settings)
batch = minibatch(512, 4, 96, 5)
result = {}

def train():
    times = []
    for update in range(int(sys.argv[1])):
        if update == 1:  # the first update allocates what the others reuse
            before = resource.getrusage(resource.RUSAGE_THREAD)
        started = time.perf_counter()
        trainer.update(batch, version=0)
        times.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    counted = len(times) - 1
    result.update(ms=statistics.median(times[1:]) * 1e3, faults=(after.ru_minflt - before.ru_minflt) / counted,
                  kernel_ms=(after.ru_stime - before.ru_stime) / counted * 1e3)

thread = threading.Thread(target=train, name="train")
thread.start()
thread.join()
print(json.dumps(result))
"""

VARIANTS = ("thread heap, whole pass", "thread heap", "one heap")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=6, help="updates per variant; the first is not counted")
    parser.add_argument("--rounds", type=int, default=1, help="the variants in turn, this many times")
    args = parser.parse_args()
    if args.updates < 2 or args.rounds < 1:
        parser.error(f"need --updates >= 2 and --rounds >= 1, got {args.updates} and {args.rounds}")
    here = str(Path(__file__).resolve().parent)
    print("| round | variant | ms per update | minor faults per update | kernel CPU ms per update |")
    print("|---:|---|---:|---:|---:|")
    for round_index in range(1, args.rounds + 1):
        for variant in VARIANTS:
            child = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.updates), variant, here],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(child.stdout)
            print(
                f"| {round_index} | {variant} | {result['ms']:,.0f} | {result['faults']:,.0f} "
                f"| {result['kernel_ms']:,.1f} |"
            )


if __name__ == "__main__":
    main()
