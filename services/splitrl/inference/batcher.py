"""Dynamic batching across edge streams (SEED RL's central inference).

Each stream submits its vector step and awaits the result. Batches run one at a
time; the next takes every request queued meanwhile, up to `max_batch_size`
rows. With `max_wait_s` 0 (the default) that is all: a batch runs as soon as
the policy is free. With more, a batch also waits up to `max_wait_s` after its
first request for more streams to join, unless every open stream is in (waiting
longer could not make it bigger). Waiting rarely pays: streams in env groups
(environment --env-groups) come in turn, each while the others step their envs,
so a wait mostly delays acting.

Memory is bounded: at most `max_queued` requests wait in the queue, and one more
taken from it but left for the next batch (it would have gone over
`max_batch_size`); a stream that submits beyond that waits in `submit` (and so
stops reading its gRPC stream, which HTTP/2 flow control turns into
backpressure on the edge). Each stream has at most one request in flight, so
with fewer than `max_queued` streams the bound is never reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import torch

from splitrl.core.metrics import Metrics
from splitrl.inference.policy import Decisions


@dataclass
class _Request:
    observations: torch.Tensor
    future: asyncio.Future[Decisions]
    queued_at: float = field(default_factory=time.perf_counter)


class Batcher:
    """Runs `act` on batches assembled from concurrent `submit` calls, in `executor` (off the event loop)."""

    def __init__(
        self,
        act: Callable[[torch.Tensor], Decisions],
        executor: Executor,
        metrics: Metrics,
        max_batch_size: int,
        max_wait_s: float,
        max_queued: int = 1024,
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0 or max_queued < 1:
            raise ValueError(
                f"need max_batch_size >= 1, max_wait_s >= 0 and max_queued >= 1, "
                f"got {max_batch_size}, {max_wait_s}, {max_queued}"
            )
        self._act, self._executor, self._metrics = act, executor, metrics
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_s
        self._queue: asyncio.Queue[_Request] = asyncio.Queue(maxsize=max_queued)
        self._next: _Request | None = None  # taken from the queue, but over the batch's max: it starts the next
        self.open_streams = 0

    async def submit(self, observations: torch.Tensor) -> Decisions:
        """Queue one stream's rows and wait for their decisions; waits for room while `max_queued` are queued."""
        future: asyncio.Future[Decisions] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(observations, future))
        return await future

    async def run(self) -> None:
        """The batching loop; runs until cancelled. A batch holds at most max_batch_size rows, or one request
        of more."""
        while True:
            first = self._next if self._next is not None else await self._queue.get()
            self._next = None
            batch, rows = [first], first.observations.shape[0]
            deadline = first.queued_at + self.max_wait_s
            while rows < self.max_batch_size and len(batch) < max(self.open_streams, 1):
                remaining = deadline - time.perf_counter()
                try:
                    request = (
                        self._queue.get_nowait()
                        if remaining <= 0
                        else await asyncio.wait_for(self._queue.get(), remaining)
                    )
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if rows + request.observations.shape[0] > self.max_batch_size:
                    self._next = request
                    break
                batch.append(request)
                rows += request.observations.shape[0]
            await self._run_batch(batch)

    async def _run_batch(self, batch: list[_Request]) -> None:
        started = time.perf_counter()
        for request in batch:
            self._metrics.hop_latency.labels(hop="inference-queue").observe(started - request.queued_at)
        try:  # rows of another shape than the batch's fail the batch's callers too
            observations = torch.cat([request.observations for request in batch])
            self._metrics.inference_batch_size.observe(observations.shape[0])
            decisions = await asyncio.get_running_loop().run_in_executor(self._executor, self._act, observations)
        except Exception as error:  # a failed batch fails its callers, not the loop
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        self._metrics.hop_latency.labels(hop="inference-compute").observe(time.perf_counter() - started)
        offset = 0
        for request in batch:
            n = request.observations.shape[0]
            rows = slice(offset, offset + n)
            part = Decisions(  # every row of a batch was decided by the same policy version
                decisions.actions[rows], decisions.log_probs[rows], decisions.values[rows], decisions.policy_version
            )
            offset += n
            if not request.future.done():  # the stream may have gone away meanwhile
                request.future.set_result(part)
