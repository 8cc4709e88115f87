"""Benchmark (not a test): the split edge's encoder, acting and training, in each --encoder-precision.

    python benchmarks/encoder_step.py --width 32 --bottleneck layernorm --frame-size 96 --act-rows 4 \
        --train-rows 64 --threads 1 --repeats 20

The edge's CPU per env step is what a device running the environment pays for the split (issue 18). Both
of its encoder passes go through the edge's own `EncoderTrainer`: acting is `encode` on `--act-rows` frame
stacks (an env group's message: the CarRacing recipe's 8 envs in 2 groups send 4), training is `apply` of
one split-accumulate gradient message for `--train-rows` stored steps (the recipe's split trains on half of
128-row minibatches: 64), which runs the encoder again from the store, backpropagates, clips and steps Adam.
The precisions take turns in one process, so machine noise falls on both alike; the first `--warmup`
repeats of each are left out (oneDNN builds its kernels on first use). Also printed: how far bfloat16's
activations are from float32's on the same stacks and weights (relative L2 error), to set beside the
activation codec's own rounding (int4: ~1/16 of a row's range).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from prometheus_client import CollectorRegistry

from splitrl.core import wire
from splitrl.core.config import Precision
from splitrl.core.metrics import Metrics
from splitrl.core.models import Encoder
from splitrl.core.precision import PRECISIONS, cpu_has_native_bfloat16, precisions_of
from splitrl.core.step_ids import pack_step_ids
from splitrl.edge_encoder.observation_store import ObservationStore
from splitrl.edge_encoder.training import EncoderTrainer
from splitrl.v1 import training_pb2


def edge_trainer(precision: Precision, args: argparse.Namespace, steps: int) -> EncoderTrainer:
    """An EncoderTrainer as the edge builds it, with `steps` random stacks stored under ids 0..steps-1."""
    torch.manual_seed(0)
    encoder = Encoder(args.frame_stack, args.frame_size, args.width, args.bottleneck).eval()
    trainer = EncoderTrainer(
        encoder, ObservationStore(steps), Metrics(CollectorRegistry()), learning_rate=2.5e-4, max_grad_norm=0.5,
        precision=precision,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    shape = (args.frame_size, args.frame_size)
    rows = [
        tuple(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator) for _ in range(args.frame_stack))
        for _ in range(steps)
    ]
    trainer.store.put(list(range(steps)), rows)
    return trainer


def gradient_message(rows: int, width: int) -> training_pb2.EncoderGradients:
    """Split-accumulate's push for stored steps 0..rows-1: random gradients in the recipe's int4 codec."""
    gradients = torch.randn(rows, width, generator=torch.Generator().manual_seed(2)) * 1e-3
    return training_pb2.EncoderGradients(
        request_id=1, steps=pack_step_ids(list(range(rows))), gradients=wire.encode_float(gradients, "int4")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=32, help="encoder width (the CarRacing split's: 32)")
    parser.add_argument("--bottleneck", default="layernorm", help="relu or layernorm")
    parser.add_argument("--frame-size", type=int, default=96)
    parser.add_argument("--frame-stack", type=int, default=4)
    parser.add_argument("--act-rows", type=int, default=4, help="stacks per acting forward (an env group)")
    parser.add_argument("--train-rows", type=int, default=64, help="rows per training step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the edge runs with 1)")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per precision")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repeats per precision first")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated, of {PRECISIONS}")
    args = parser.parse_args()
    try:
        precisions = precisions_of(args.precisions)
    except ValueError as error:
        raise SystemExit(f"--precisions: {error}") from None
    if min(args.act_rows, args.train_rows, args.repeats) < 1 or args.warmup < 0:
        raise SystemExit(
            f"--act-rows, --train-rows and --repeats must be >= 1 and --warmup >= 0, got {args.act_rows}, "
            f"{args.train_rows}, {args.repeats} and {args.warmup}"
        )
    torch.set_num_threads(args.threads)
    stored = max(args.act_rows, args.train_rows)
    trainers = {precision: edge_trainer(precision, args, stored) for precision in precisions}
    acting_stacks = trainers[precisions[0]].store.get(list(range(args.act_rows)))[1]
    assert acting_stacks is not None
    message = gradient_message(args.train_rows, args.width)
    acting: dict[str, list[float]] = {precision: [] for precision in precisions}
    training: dict[str, list[float]] = {precision: [] for precision in precisions}
    for repeat in range(args.warmup + args.repeats):
        for precision, trainer in trainers.items():
            started = time.perf_counter()
            trainer.encode(acting_stacks)
            acted = time.perf_counter()
            trainer.apply(message)
            if repeat >= args.warmup:
                acting[precision].append((acted - started) * 1e3)
                training[precision].append((time.perf_counter() - acted) * 1e3)
    print(
        f"the edge's encoder: {args.frame_stack} x {args.frame_size} x {args.frame_size} stacks, width {args.width} "
        f"({args.bottleneck}); acting on {args.act_rows} rows, a training step on {args.train_rows}; "
        f"{args.threads} torch thread(s), {args.repeats} repeats each; native bfloat16 on this CPU: "
        f"{cpu_has_native_bfloat16()}"
    )
    speed_up = f"speed-up over {precisions[0]}: acting / training"
    print(f"| precision | acting median ms | training step median ms | {speed_up} |")
    print("|---|---:|---:|---:|")
    act_reference = statistics.median(acting[precisions[0]])
    train_reference = statistics.median(training[precisions[0]])
    for precision in precisions:
        act, train = statistics.median(acting[precision]), statistics.median(training[precision])
        print(f"| {precision} | {act:.2f} | {train:.2f} | {act_reference / act:.2f} / {train_reference / train:.2f} |")
    if len(precisions) > 1:
        fresh = {precision: edge_trainer(precision, args, args.act_rows) for precision in precisions}
        exact, rounded = (fresh[precision].encode(acting_stacks) for precision in precisions[:2])
        error = float((rounded - exact).norm() / exact.norm())
        print(f"activations of {precisions[1]} against {precisions[0]} (same weights): relative L2 error {error:.4f}")


if __name__ == "__main__":
    main()
