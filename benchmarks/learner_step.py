"""Benchmark (not a test): one learner minibatch step of cloud mode's network in each --train-precision.

    python benchmarks/learner_step.py --width 4096 --frame-size 96 --rows 128 --threads 1 --repeats 12

Cloud mode's learner trains the whole CarRacing network (Nature CNN, width 4,096) on one core, and in the
throughput bench it is what bounds cloud. One step here is `Trainer.update` on one minibatch of `--rows`
frame stacks (advantages, forward, backward, gradient clip, Adam), the learner's own code path. The
precisions take turns in one process, so machine noise falls on both alike; the first `--warmup` steps of
each are left out (oneDNN builds its kernels on first use). Advantages are GAE's: with V-trace each update
also runs one forward pass over all its rows, in the same precision.

`--profile-steps N` then runs N more steps of each precision under torch's profiler and prints the ops with
the most CPU time of their own, per step, by input shape: where a step's time goes (docs/throughput,
session 48). A step here is a whole update of one minibatch, so the update's own copies (its rows put in
layout, the bootstrap rows dropped) count once per step, where the learner's 16 minibatches share them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from splitrl.core.config import Precision
from splitrl.core.envs import action_spec_of
from splitrl.core.precision import PRECISIONS, cpu_has_native_bfloat16, precisions_of
from splitrl.learner.batch import Batch
from splitrl.learner.network import learner_network
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import Trainer

HORIZON = 32  # steps per chunk, as the CarRacing recipe's unroll_length


def minibatch(rows: int, frame_stack: int, frame_size: int, actions: int) -> Batch:
    """`rows` steps of random frame stacks in chunks of HORIZON, uniform behaviour policy, no episode end."""
    if rows % HORIZON:
        raise SystemExit(f"--rows must be a multiple of {HORIZON}, got {rows}")
    chunks = rows // HORIZON
    generator = torch.Generator().manual_seed(0)
    shape = (chunks, HORIZON)
    return Batch(
        inputs=torch.randint(
            0, 256, (chunks, HORIZON + 1, frame_stack, frame_size, frame_size), dtype=torch.uint8, generator=generator
        ),
        actions=torch.randint(0, actions, shape, generator=generator),
        behaviour_log_probs=torch.full(shape, -math.log(actions)),
        values=torch.zeros(chunks, HORIZON + 1),
        rewards=torch.randn(shape, generator=generator),
        dones=torch.zeros(shape, dtype=torch.bool),
        policy_versions=torch.zeros(shape, dtype=torch.long),
        step_ids=torch.arange(chunks * (HORIZON + 1)).reshape(chunks, HORIZON + 1),
        encoder_versions=torch.zeros(chunks, HORIZON + 1, dtype=torch.long),
        weights=torch.ones(chunks),
    )


def trainer(precision: Precision, args: argparse.Namespace) -> Trainer:
    """The learner's cloud network and trainer as `splitrl serve learner` builds them (channels-last)."""
    settings = LearnerSettings(
        mode="cloud", tls="plaintext", epochs=1, minibatches=1, train_precision=precision, env=args.env,
        env_kwargs={"continuous": False}, frame_stack=args.frame_stack, frame_size=args.frame_size, width=args.width,
    )  # fmt: skip
    torch.manual_seed(0)
    return Trainer(learner_network(settings), settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CarRacing-v3", help="env whose action space the head has (discrete)")
    parser.add_argument("--width", type=int, default=4096, help="encoder width")
    parser.add_argument("--frame-size", type=int, default=96)
    parser.add_argument("--frame-stack", type=int, default=4)
    parser.add_argument("--rows", type=int, default=128, help="rows per minibatch (a multiple of 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the learner runs with 1)")
    parser.add_argument("--repeats", type=int, default=12, help="timed steps per precision")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per precision first")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated, of {PRECISIONS}")
    parser.add_argument("--profile-steps", type=int, default=0, help="steps per precision to profile after timing")
    parser.add_argument("--profile-top", type=int, default=15, help="ops listed per precision when profiling")
    args = parser.parse_args()
    try:
        precisions = precisions_of(args.precisions)
    except ValueError as error:
        raise SystemExit(f"--precisions: {error}") from None
    if args.profile_steps < 0 or args.profile_top < 1:
        got = f"{args.profile_steps}, {args.profile_top}"
        raise SystemExit(f"--profile-steps must be >= 0 and --profile-top >= 1, got {got}")
    torch.set_num_threads(args.threads)
    actions = action_spec_of(args.env, {"continuous": False}).size
    batch = minibatch(args.rows, args.frame_stack, args.frame_size, actions)
    trainers = {precision: trainer(precision, args) for precision in precisions}
    timings = time_steps(trainers, batch, args.warmup, args.repeats)
    print(
        f"one minibatch step: {args.rows} rows of {args.frame_stack} x {args.frame_size} x {args.frame_size}, "
        f"width {args.width}, {args.threads} torch thread(s), {args.repeats} steps each; "
        f"native bfloat16 on this CPU: {cpu_has_native_bfloat16()}"
    )
    print(f"| precision | median ms | min ms | speed-up over {precisions[0]} |")
    print("|---|---:|---:|---:|")
    reference = statistics.median(timings[precisions[0]])
    for precision, times in timings.items():
        median = statistics.median(times)
        print(f"| {precision} | {median:.1f} | {min(times):.1f} | {reference / median:.2f} |")
    if args.profile_steps:
        print_profile(trainers, batch, args.profile_steps, args.profile_top)


def time_steps(
    trainers: dict[Precision, Trainer], batch: Batch, warmup: int, repeats: int
) -> dict[Precision, list[float]]:
    """ms of each of `repeats` steps per precision, after `warmup` untimed ones; the precisions take turns."""
    timings: dict[Precision, list[float]] = {precision: [] for precision in trainers}
    for repeat in range(warmup + repeats):
        for precision, learner in trainers.items():
            started = time.perf_counter()
            learner.update(batch, version=0)
            if repeat >= warmup:
                timings[precision].append((time.perf_counter() - started) * 1e3)
    return timings


def print_profile(trainers: dict[Precision, Trainer], batch: Batch, steps: int, top: int) -> None:
    """Profile `steps` steps of each trainer; print its `top` ops by CPU time of their own (ms a step)."""
    print(
        f"\nwhere a step goes: torch's profiler over {steps} steps each, the {top} ops with most CPU time of their own"
    )
    print("| precision | op | input shapes | ms a step | calls a step |")
    print("|---|---|---|---:|---:|")
    for precision, learner in trainers.items():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
            for _ in range(steps):
                learner.update(batch, version=0)
        ops = sorted(profiled.key_averages(group_by_input_shape=True), key=lambda op: -op.self_cpu_time_total)
        for op in ops[:top]:
            shapes = ", ".join(str(shape) for shape in op.input_shapes if shape) or "-"
            print(
                f"| {precision} | {op.key} | {shapes} | {op.self_cpu_time_total / 1e3 / steps:.2f} | "
                f"{op.count / steps:g} |"
            )


if __name__ == "__main__":
    main()
