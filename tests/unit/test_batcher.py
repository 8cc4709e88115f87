"""Inference's batching rule: a batch at once when the policy is free, or after a wait for more streams."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics
from splitrl.inference.batcher import Batcher
from splitrl.inference.policy import Decisions


class Policy:
    """Acts on whole batches (action = the row's value), records their sizes, and can be held mid-batch."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.running = threading.Event()  # set while a batch is inside act
        self.release = threading.Event()
        self.release.set()

    def act(self, observations: torch.Tensor) -> Decisions:
        self.batches.append(observations.shape[0])
        self.running.set()
        self.release.wait(10)
        self.running.clear()
        if (observations < 0).any():
            raise ValueError("a negative row")
        rows = observations.shape[0]
        return Decisions(observations.long(), torch.zeros(rows), torch.zeros(rows), policy_version=3)


@contextlib.asynccontextmanager
async def batching(
    policy: Policy, max_wait_s: float, open_streams: int, max_batch_size: int = 256
) -> AsyncIterator[Batcher]:
    """A Batcher of `open_streams` streams, its loop running for the block."""
    with ThreadPoolExecutor(1) as executor:
        batcher = Batcher(policy.act, executor, Metrics(CollectorRegistry()), max_batch_size, max_wait_s)
        batcher.open_streams = open_streams
        loop = asyncio.create_task(batcher.run())
        try:
            yield batcher
        finally:
            policy.release.set()
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


def rows(*values: float) -> torch.Tensor:
    return torch.tensor(values)


async def test_without_a_wait_a_lone_request_runs_at_once_and_those_queued_meanwhile_run_together():
    policy = Policy()
    async with batching(policy, max_wait_s=0.0, open_streams=4) as batcher:
        policy.release.clear()
        first = asyncio.create_task(batcher.submit(rows(1, 2)))
        assert await asyncio.to_thread(policy.running.wait, 5)  # it did not wait for the 3 other streams
        queued = [asyncio.create_task(batcher.submit(rows(10 + i))) for i in range(3)]
        await asyncio.sleep(0.05)  # queued while the first batch runs
        policy.release.set()
        decided = await asyncio.wait_for(asyncio.gather(first, *queued), 5)
        assert policy.batches == [2, 3]
        # each caller gets its own rows' decisions, from the batch's policy version
        assert [d.actions.tolist() for d in decided] == [[1, 2], [10], [11], [12]]
        assert {d.policy_version for d in decided} == {3}


async def test_with_a_wait_a_batch_waits_for_other_streams_then_runs_without_them():
    policy = Policy()
    async with batching(policy, max_wait_s=1.0, open_streams=2) as batcher:
        first = asyncio.create_task(batcher.submit(rows(1)))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(first, batcher.submit(rows(2))), 5)
        assert policy.batches == [2]  # the second stream joined within the wait
        started = time.perf_counter()
        await asyncio.wait_for(batcher.submit(rows(3)), 5)
        assert time.perf_counter() - started >= 1.0  # alone, it waited out max_wait_s first
        assert policy.batches == [2, 1]


async def test_with_a_wait_a_batch_every_open_stream_is_in_runs_at_once():
    policy = Policy()
    async with batching(policy, max_wait_s=30.0, open_streams=2) as batcher:
        await asyncio.wait_for(asyncio.gather(batcher.submit(rows(1)), batcher.submit(rows(2))), 5)
        assert policy.batches == [2]


async def test_a_batch_takes_no_more_than_max_batch_size_rows_unless_one_request_has_more():
    policy = Policy()
    async with batching(policy, max_wait_s=0.0, open_streams=4, max_batch_size=3) as batcher:
        policy.release.clear()
        first = asyncio.create_task(batcher.submit(rows(0)))
        assert await asyncio.to_thread(policy.running.wait, 5)
        queued = [asyncio.create_task(batcher.submit(rows(*range(n, 2 * n)))) for n in (2, 2, 4)]
        await asyncio.sleep(0.05)
        policy.release.set()
        decided = await asyncio.wait_for(asyncio.gather(first, *queued), 5)
        assert policy.batches == [1, 2, 2, 4]  # 2 + 2 would be over 3; a request is never split
        assert [d.actions.tolist() for d in decided] == [[0], [2, 3], [2, 3], [4, 5, 6, 7]]


async def test_a_failed_batch_fails_its_callers_and_the_next_batch_runs():
    policy = Policy()
    async with batching(policy, max_wait_s=0.0, open_streams=1) as batcher:
        with pytest.raises(ValueError, match="a negative row"):
            await asyncio.wait_for(batcher.submit(rows(-1)), 5)
        assert (await asyncio.wait_for(batcher.submit(rows(5)), 5)).actions.tolist() == [5]


async def test_rows_of_another_shape_fail_their_batch_not_the_loop():
    policy = Policy()
    async with batching(policy, max_wait_s=30.0, open_streams=2) as batcher:
        with pytest.raises(RuntimeError, match="same number of dimensions"):
            await asyncio.wait_for(asyncio.gather(batcher.submit(rows(1)), batcher.submit(torch.ones(1, 2))), 5)
        batcher.open_streams = 1
        assert (await asyncio.wait_for(batcher.submit(rows(5)), 5)).actions.tolist() == [5]


@pytest.mark.parametrize(("size", "wait", "queued"), [(0, 0.0, 1), (1, -0.5, 1), (1, 0.0, 0)])
def test_a_batcher_with_a_bad_limit_is_refused_with_the_values(size, wait, queued):
    with pytest.raises(ValueError, match=f"got {size}, {wait}, {queued}"):
        Batcher(Policy().act, ThreadPoolExecutor(1), Metrics(CollectorRegistry()), size, wait, max_queued=queued)
