"""`splitrl bench replicas`: S simulated edge streams into 1, then N inference replicas, measured in one run.

For each replica count, replay and the inference replicas start as processes from one plan of a run (the
flags `splitrl up` gives them; split mode on the fast env, plaintext on loopback). This process then drives
`streams` lockstep Act streams, each one env of random bf16 activations (as tests/integration/test_load.py),
placed on the replicas by `core.replicas`, the edges' own placement. After `warmup_s` it counts answers and
times each step for `seconds`; then the processes stop and their final /metrics give batch sizes and CPU.

The driver shares the machine with the replicas: on a 2-core machine more inference processes compete with
it and with each other for the same cores, so what a replica buys there is not what it buys on a cluster
(read the inference CPU column for that: it is the work each step costs wherever it runs).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

import grpc
import numpy as np

from splitrl.bench.settings import ReplicasBenchSettings
from splitrl.core import scrape, wire
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import INFERENCE_BATCH_SIZE, Metrics
from splitrl.core.replicas import Replicas
from splitrl.run.launcher import Child, serving_addresses, spawn, stop_all, wait_ready
from splitrl.run.plan import instance_names, plan, service_of
from splitrl.run.settings import RunSettings
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc

FAST_ENV = "splitrl/Catch-v0"
FRAME_SIZE = 36
STEP_TIMEOUT_S = 30.0
PLAINTEXT = TransportSettings.model_validate({"tls": "plaintext"})


@dataclass
class ReplicasResult:
    """One replica count's figures: rates over the measured window, CPU from the replicas' final counters."""

    replicas: int
    streams_per_replica: list[int]
    steps_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    inference_cpu_ms_per_step: float  # all replicas' CPU seconds over the whole run, per step answered


def run_replicas_bench(settings: ReplicasBenchSettings) -> int:
    settings.out.mkdir(parents=True, exist_ok=True)
    results = [measure(settings, count) for count in settings.replica_counts]
    table = render_markdown(settings, results)
    (settings.out / "replicas.md").write_text(table)
    (settings.out / "replicas.json").write_text(json.dumps([asdict(result) for result in results], indent=2))
    print(table)
    print(f"written to {settings.out / 'replicas.md'} and replicas.json")
    return 0


def measure(settings: ReplicasBenchSettings, replicas: int) -> ReplicasResult:
    """Start replay and `replicas` inference processes, drive the streams into them, stop them."""
    run = RunSettings.model_validate(
        {
            "mode": "split",
            "env": FAST_ENV,
            "frame_size": FRAME_SIZE,
            "width": settings.width,
            "unroll_length": 8,
            "inference_replicas": replicas,
            "torch_threads": settings.torch_threads,
            "tls": "plaintext",
        }
    )
    run_dir = settings.out / f"replicas-{replicas}"
    for folder in ("logs", "metrics"):
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    children: dict[str, Child] = {}
    try:
        for name in [name for name in instance_names(run) if service_of(name) in ("replay", "inference")]:
            children[name] = spawn(name, plan(run, run_dir, serving_addresses(children))[name], run_dir)
            wait_ready(children[name], run_dir, timeout_s=120)
        inference = {name: child for name, child in children.items() if service_of(name) == "inference"}
        addresses = ",".join(serving_addresses(inference).values())
        answered, latencies, placed = asyncio.run(_drive(settings, addresses))
    finally:
        stop_all(children)
    texts = [(run_dir / "metrics" / f"{name}.prom").read_text() for name in inference]
    rows = scrape.total(texts, f"{INFERENCE_BATCH_SIZE}_sum")
    batches = scrape.total(texts, f"{INFERENCE_BATCH_SIZE}_count")
    cpu_s = scrape.total(texts, "process_cpu_seconds_total")
    return ReplicasResult(
        replicas=replicas,
        streams_per_replica=placed,
        steps_per_s=answered / settings.seconds,
        p50_ms=1000 * float(np.percentile(latencies, 50)) if latencies else float("nan"),
        p99_ms=1000 * float(np.percentile(latencies, 99)) if latencies else float("nan"),
        mean_batch=rows / batches if batches else 0.0,
        inference_cpu_ms_per_step=1000 * cpu_s / rows if rows else float("nan"),
    )


async def _drive(settings: ReplicasBenchSettings, addresses: str) -> tuple[int, list[float], list[int]]:
    """Run every stream through warm-up and the measured window; returns (answers in the window, their
    latencies in seconds, streams placed per replica)."""
    from prometheus_client import CollectorRegistry

    pool = Replicas("inference", addresses, PLAINTEXT, Metrics(CollectorRegistry()))
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + settings.warmup_s
    stop_at = measure_from + settings.seconds
    latencies: list[float] = []
    try:
        leases = [pool.acquire() for _ in range(settings.streams)]
        placed = list(pool.open_streams)
        counts = await asyncio.gather(
            *(
                simulated_edge(lease.channel, index, settings.width, (measure_from, stop_at), latencies)
                for index, lease in enumerate(leases)
            )
        )
    finally:
        await pool.close()
    return sum(counts), latencies, placed


async def simulated_edge(
    channel: grpc.aio.Channel, index: int, width: int, window: tuple[float, float], latencies: list[float]
) -> int:
    """One simulated edge: a split-mode Act stream of one env until the end of `window` (loop times); returns
    the answers inside it, whose latencies (s) it appends to `latencies` (also tests/integration/test_load.py's
    streams). RuntimeError if the stream ends, or an answer is not one action (answers come in the requests'
    order: an Act stream carries no sequence numbers)."""
    measure_from, stop_at = window
    call = rollout_pb2_grpc.InferenceStub(channel).Act(
        metadata=(("splitrl-codec", "activation"), ("splitrl-run-id", f"bench-{index}"))
    )
    rng = np.random.default_rng(index)
    observations = wire.encode(rng.standard_normal((1, width), dtype=np.float32), wire.DTYPE_BFLOAT16)
    loop = asyncio.get_running_loop()
    sequence = counted = 0
    try:
        while (now := loop.time()) < stop_at:
            request = rollout_pb2.ActRequest(
                observations=observations,
                rewards=[0.0],
                terminated=[False],
                truncated=[False],
                first_step_id=index << 32 | sequence,
            )
            await call.write(request)
            response = await asyncio.wait_for(call.read(), STEP_TIMEOUT_S)
            if response is grpc.aio.EOF or list(response.actions.shape) != [1]:
                raise RuntimeError(f"stream {index}: step {sequence} answered by {response!r}")
            if now >= measure_from:
                latencies.append(loop.time() - now)
                counted += 1
            sequence += 1
    finally:
        call.cancel()
    return counted


def render_markdown(settings: ReplicasBenchSettings, results: list[ReplicasResult]) -> str:
    base = results[0].steps_per_s or float("nan")
    lines = [
        f"{settings.streams} simulated edge streams (split mode, 1 env each, width {settings.width} bf16), "
        f"{settings.seconds:g} s measured after {settings.warmup_s:g} s warm-up per row; "
        f"`splitrl bench replicas --streams {settings.streams} --replica-counts "
        f"{','.join(str(r.replicas) for r in results)} --seconds {settings.seconds:g}`",
        "",
        "| inference replicas | streams per replica | env steps/s | vs first row | p50 ms | p99 ms | mean batch "
        "| inference CPU ms per step |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.replicas} | {' + '.join(map(str, r.streams_per_replica))} | {r.steps_per_s:,.0f} | "
            f"{r.steps_per_s / base:.2f}x | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.mean_batch:.1f} | "
            f"{r.inference_cpu_ms_per_step:.3f} |"
        )
    return "\n".join(lines) + "\n"
