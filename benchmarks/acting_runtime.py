"""Benchmark (not a test): CPU milliseconds of one acting pass of inference's policy, torch against ONNX Runtime.

    python benchmarks/acting_runtime.py --rows 4 8 --calls 300

The network is cloud mode's CarRacing one (Nature CNN on 4 x 96 x 96 uint8 stacks, a 512-unit head; 8.7 MB of
float32 weights), with weights moved off their initial values so no bias is zero. Both runtimes act on the same
rows, one thread each, in alternating rounds in one process so machine noise hits them alike; each figure is the
median round's mean CPU time per call (time.thread_time). "Cold" touches 64 MB between calls, as the other services
do to the caches in the ~8 ms between two of inference's batches; "warm" calls back to back. Also printed: what
building a session for one new version of the weights costs (inference does that once per learner update).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from splitrl.core.models import ActorCritic
from splitrl.core.onnx_forward import ForwardGraph
from splitrl.core.spec import ActionSpec, ModelConfig

#: Bytes the cold calls touch between calls: more than this machine's 32 MiB of L3.
_EVICTION_BYTES = 64 << 20


def _cpu_ms_per_call(call: Callable[[], object], calls: int, evict: np.ndarray | None) -> float:
    spent = 0.0
    for _ in range(calls):
        if evict is not None:
            evict[::64] += 1  # one write per cache line
        started = time.thread_time()
        call()
        spent += time.thread_time() - started
    return spent / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8], help="batch sizes to time")
    parser.add_argument("--calls", type=int, default=300, help="calls per round and runtime (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median is kept")
    parser.add_argument("--threads", type=int, default=1, help="threads of each runtime (default: %(default)s)")
    args = parser.parse_args()
    if min(*args.rows, args.calls, args.rounds, args.threads) < 1:
        parser.error(
            f"--rows, --calls, --rounds and --threads must be >= 1, got {args.rows}, {args.calls}, {args.rounds} "
            f"and {args.threads}"
        )

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    network = ActorCritic(ModelConfig(), ActionSpec("discrete", 5)).eval()
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    graph = ForwardGraph(network, args.threads)
    build_ms = []
    for _ in range(args.rounds):
        started = time.thread_time()
        session = graph.session(network.state_dict())
        build_ms.append((time.thread_time() - started) * 1e3)
    evict = np.ones(_EVICTION_BYTES, np.uint8)

    print(f"session for one version of the weights: {statistics.median(build_ms):.1f} ms CPU (median of {args.rounds})")
    print("| rows | caches | torch ms | onnxruntime ms | torch / onnxruntime |")
    print("|---:|---|---:|---:|---:|")
    for rows in args.rows:
        stacks = torch.randint(0, 256, (rows, *network.encoder.input_shape), dtype=torch.uint8)
        with torch.no_grad():
            runtimes: dict[str, Callable[[], object]] = {
                "torch": functools.partial(network, stacks),
                "onnxruntime": functools.partial(session.run, stacks),
            }
            for call in runtimes.values():
                for _ in range(20):
                    call()
            for cold in (True, False):
                rounds: dict[str, list[float]] = {name: [] for name in runtimes}
                for turn in range(args.rounds):
                    order = list(runtimes) if turn % 2 == 0 else list(reversed(runtimes))
                    for name in order:
                        rounds[name].append(_cpu_ms_per_call(runtimes[name], args.calls, evict if cold else None))
                torch_ms, ort_ms = (statistics.median(rounds[name]) for name in runtimes)
                caches = "cold" if cold else "warm"
                print(f"| {rows} | {caches} | {torch_ms:.3f} | {ort_ms:.3f} | {torch_ms / ort_ms:.2f} |")


if __name__ == "__main__":
    main()
