"""Load: 64 concurrent edge streams into one inference (and its replay) for a fixed time, on 2 cores.

Every stream must be served throughout, batches must grow with the number of
streams (read from inference's real /metrics histogram), and memory must stay
bounded (the process's VmRSS, sampled after warm-up and at the end). Run with
`-s` to see the figures.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from splitrl.bench.replicas import simulated_edge
from splitrl.core import rpc, scrape
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from tests.integration.stack import FAST_ENV, address, start

STREAMS = 64
WIDTH = 256
RUN_S = 10.0
WARM_UP_S = 2.0
#: RSS growth allowed between the end of warm-up and the end of the run. Replay's table holds at most 4,096
#: chunks of 9 x 256 bf16 activations (~5 KB each, ~20 MB), and everything else is bounded per stream.
MAX_RSS_GROWTH_MB = 120


def rss_mb() -> float:
    """This process's resident set size (MB), from /proc (the servers run in this process)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def test_64_streams_into_one_inference_are_all_served_with_growing_batches_and_bounded_memory():
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(
        InferenceService,
        InferenceSettings(
            tls="plaintext",
            env=FAST_ENV,
            mode="split",
            width=WIDTH,
            frame_size=36,
            unroll_length=8,
            replay_address=address(replay),
        ),
    )
    channel = rpc.insecure_channel(address(inference))
    try:
        latencies: list[float] = []
        started = time.perf_counter()
        window = (asyncio.get_running_loop().time(), asyncio.get_running_loop().time() + RUN_S)
        streams = [asyncio.create_task(simulated_edge(channel, i, WIDTH, window, latencies)) for i in range(STREAMS)]
        await asyncio.sleep(WARM_UP_S)
        rss_warm = rss_mb()
        answers = await asyncio.wait_for(asyncio.gather(*streams), RUN_S + 30)
        elapsed = time.perf_counter() - started
        rss_end = rss_mb()
        text = scrape.fetch(inference.metrics_port)
        batches = scrape.total([text], "splitrl_inference_batch_size_count")
        rows = scrape.total([text], "splitrl_inference_batch_size_sum")
        mean_batch = rows / batches
        p99_ms = 1000 * sorted(latencies)[int(0.99 * (len(latencies) - 1))]
        steps_per_s = sum(answers) / elapsed
        print(
            f"\nload: {STREAMS} streams for {elapsed:.1f}s: {steps_per_s:.0f} steps/s, mean batch {mean_batch:.1f} "
            f"({int(batches)} batches), p99 latency {p99_ms:.1f} ms, fewest answers per stream {min(answers)}, "
            f"RSS {rss_warm:.0f} -> {rss_end:.0f} MB"
        )
        assert min(answers) >= 10, f"a stream was starved: answers per stream {sorted(answers)[:5]}..."
        assert rows == sum(answers)  # every row acted on was answered, and every answer came from a batch
        assert mean_batch >= 8, f"batches did not grow with {STREAMS} streams: mean {mean_batch:.1f}"
        assert rss_end - rss_warm < MAX_RSS_GROWTH_MB, f"RSS grew {rss_warm:.0f} -> {rss_end:.0f} MB"
        assert scrape.total([text], "splitrl_trajectories_total") >= STREAMS  # chunks were cut and written
    finally:
        await channel.close()
        await inference.stop()
        await replay.stop()
