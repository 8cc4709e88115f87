"""Benchmark (not a test): replay insert throughput in memory vs with --data-dir, and restore time. It backs
the "Replay persistence" figures of docs/results/throughput.md.

    python benchmarks/replay_persistence.py --chunks 4096 --width 256 --unroll 32

One real replay server on a loopback port per configuration; one writer streams
`--chunks` acknowledged inserts (pipelined, up to `--window` in flight, as
inference's ReplayWriter does). Then replay is restored from the same data_dir
twice: from the write-ahead log alone (as after SIGKILL) and from the snapshot
a graceful stop writes. Chunks are split-mode chunks: bf16 activations
[unroll + 1, width] plus the per-step tensors.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import torch
from prometheus_client import CollectorRegistry

from splitrl.core import wire
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.core.trajectory import TrajectoryTensors
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc

TLS: dict[str, Any] = {"tls": "plaintext"} if "tls" in ReplaySettings.model_fields else {}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=4096, help="inserts per configuration (default: %(default)s)")
    parser.add_argument("--width", type=int, default=256, help="activation width (default: %(default)s)")
    parser.add_argument("--unroll", type=int, default=32, help="steps per chunk (default: %(default)s)")
    parser.add_argument("--window", type=int, default=64, help="inserts in flight (default: %(default)s)")
    parser.add_argument("--dir", type=Path, default=None, help="where data dirs go (default: a temp dir)")
    return parser.parse_args()


def chunk(unroll: int, width: int) -> replay_pb2.Trajectory:
    tensors = TrajectoryTensors(
        observations=torch.randn(unroll + 1, width).to(torch.bfloat16),
        actions=torch.zeros(unroll, dtype=torch.int64),
        behaviour_log_probs=torch.zeros(unroll),
        values=torch.zeros(unroll + 1),
        rewards=torch.zeros(unroll),
        terminated=torch.zeros(unroll, dtype=torch.bool),
        truncated=torch.zeros(unroll, dtype=torch.bool),
        policy_versions=torch.zeros(unroll, dtype=torch.int64),
        step_ids=torch.arange(unroll + 1),
        encoder_versions=torch.zeros(unroll + 1, dtype=torch.int64),
    )
    message = tensors.to_proto()
    message.observations.CopyFrom(wire.encode(tensors.observations, wire.DTYPE_BFLOAT16))
    return message


async def insert_rate(settings: ReplaySettings, trajectory: replay_pb2.Trajectory, n: int, window: int) -> float:
    """Acknowledged inserts per second of one pipelined writer; leaves the server stopped (a graceful stop)."""
    metrics = Metrics(CollectorRegistry())
    host = await ServiceHost.start(ReplayService(settings, metrics), settings, metrics)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
            call = replay_pb2_grpc.ReplayStub(channel).Insert()
            started = time.perf_counter()
            for sequence in range(n + window):
                if sequence >= window:
                    await call.read()
                if sequence < n:
                    request = replay_pb2.InsertRequest(
                        table="rollouts", sequence=sequence, writer_id="bench", trajectory=trajectory
                    )
                    await call.write(request)
            elapsed = time.perf_counter() - started
            await call.done_writing()
            if settings.data_dir is not None:  # the log as SIGKILL would leave it, before stop() snapshots it
                shutil.copytree(settings.data_dir, settings.data_dir.with_name(settings.data_dir.name + "-log"))
    finally:
        await host.stop()
    return n / elapsed


def restore_seconds(data_dir: Path, max_size: int) -> tuple[float, int]:
    service = ReplayService(ReplaySettings(**TLS, data_dir=data_dir, max_size=max_size), Metrics(CollectorRegistry()))
    assert service.store is not None
    seconds = service.metrics.replay_restore_seconds._value.get()
    items = service.tables["rollouts"].size
    assert service.store.log is not None
    service.store.log.close()  # release the directory without writing a snapshot
    service.store._lock_file.close()
    return seconds, items


async def main() -> None:
    args = parse_args()
    trajectory = chunk(args.unroll, args.width)
    root = args.dir or Path(tempfile.mkdtemp(prefix="replay-bench-"))
    size_kb = trajectory.ByteSize() / 1024
    base = {**TLS, "max_size": args.chunks, "checkpoint_every_s": 3600.0}
    rows = []
    for label, extra in (
        ("in memory", {}),
        ("data_dir, fsync=never", {"data_dir": root / "never", "fsync": "never"}),
        ("data_dir, fsync=always", {"data_dir": root / "always", "fsync": "always"}),
    ):
        rate = await insert_rate(ReplaySettings(**base, **extra), trajectory, args.chunks, args.window)
        rows.append((label, rate))
    print(
        f"\n{args.chunks} inserts of {size_kb:.1f} KiB chunks (width {args.width}, unroll {args.unroll}), "
        f"{args.window} in flight, one writer, loopback:\n"
    )
    print("| replay | inserts/s | MiB/s | vs in memory |\n| --- | ---: | ---: | ---: |")
    for label, rate in rows:
        print(f"| {label} | {rate:,.0f} | {rate * size_kb / 1024:,.1f} | {rate / rows[0][1]:.2f}x |")
    print(f"\n| restore {args.chunks} chunks from | seconds | items |\n| --- | ---: | ---: |")
    for label, directory in (("write-ahead log (after SIGKILL)", root / "never-log"), ("snapshot", root / "never")):
        seconds, items = await asyncio.to_thread(restore_seconds, directory, args.chunks)
        print(f"| {label} | {seconds:.2f} | {items} |")
    if args.dir is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    asyncio.run(main())
